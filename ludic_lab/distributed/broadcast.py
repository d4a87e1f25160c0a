"""``BroadcastPolicyPublisher``: push policy weights to one or more vLLM servers.

Each push is one HTTP control call per server (``POST /update_param_batch``) with the bytes
on the client's data-plane transport (a shared-memory safetensors file on the same host, or
NCCL on GPUs); see :meth:`~ludic_lab.inference.vllm_client.VLLMChatClient.sync_weights`.
Names are the served model's Hugging Face state-dict names. The server checks every name,
shape and dtype before it applies anything, so a wrong name is an error, never a silent
no-op; servers are updated one after the other, so a refusal by the first leaves every
server on the old weights.

vLLM loads fused layers (``q/k/v_proj`` -> ``qkv_proj``, ``gate/up_proj`` ->
``gate_up_proj``, weights and biases) as one piece, so an update touching part of one must
carry all of it. A LoRA update (only the adapted weights) usually does not: given the trained
``model``, the publisher completes those layers with the model's current values of the
other members (for LoRA, the frozen base weights — what the server already serves).

A LoRA policy (a peft model) is published as dense weights: :meth:`publish_model` merges
the adapters into the base weights, collects the adapted modules' weights under the base
model's names, pushes them and unmerges — restoring the base weights bit for bit. The
Trainer's own path (``publish(policy_state_dict(model), version)``, merged out of place)
sends the same tensors.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.aio import run_sync
from ludic_lab.inference.vllm.client.client import VLLMChatClient

Target = VLLMChatClient | str

_ADAPTER_MARKERS = (".lora_A.", ".lora_B.", "lora_embedding_", ".lora_magnitude_vector")
_PEFT_MARKERS = ("base_model.model.", ".base_layer.", *_ADAPTER_MARKERS)


class PartialPublishError(RuntimeError):
    """An update reached some servers but not all; ``updated`` / ``not_updated`` list them."""

    def __init__(self, message: str, updated: list[str], not_updated: list[str]) -> None:
        super().__init__(message)
        self.updated, self.not_updated = updated, not_updated


class BroadcastPolicyPublisher:
    """A ``PolicyPublisher`` over vLLM servers (HTTP control plane + a weight transport).

    ``targets`` is a :class:`VLLMChatClient` (created with ``enable_weight_updates=True``),
    an ``api_base`` URL, or a sequence of them (several servers). URLs get their own client
    with ``api_key`` and ``device``. ``timeout_s`` bounds each server's update. ``model``
    is the trained model (plain or LoRA-wrapped), used to complete partly covered fused
    layers (see the module docstring); without it such an update is refused before sending.
    """

    def __init__(
        self,
        targets: Target | Sequence[Target],
        *,
        model: Any = None,
        timeout_s: float = 600.0,
        api_key: str | None = None,
        device: str = "cpu",
    ) -> None:
        items = [targets] if isinstance(targets, (str, VLLMChatClient)) else list(targets)
        if not items:
            raise ValueError("BroadcastPolicyPublisher needs at least one server (a VLLMChatClient or an api_base URL)")
        self.clients: list[VLLMChatClient] = []
        for t in items:
            if isinstance(t, str):
                t = VLLMChatClient(
                    t, api_base=t, api_key=api_key, enable_weight_updates=True, device=device, tokenizer=False
                )
            elif not isinstance(t, VLLMChatClient):
                raise TypeError(
                    f"publisher targets must be VLLMChatClient objects or api_base URLs, got {type(t).__name__}"
                )
            if not t.enable_weight_updates:
                raise ValueError(f"{t!r} was created with enable_weight_updates=False; it cannot receive weights")
            self.clients.append(t)
        self.model = model
        self.timeout_s = float(timeout_s)
        self.last_version: int | None = None
        self.last_seconds: float | None = None
        self.last_num_params: int = 0

    # -- state dicts ----------------------------------------------------------------------
    async def publish_async(self, state_dict: Mapping[str, Any], version: int | None = None) -> int:
        """Push ``state_dict`` to every server in turn; returns the version they now serve.

        Raises ``ValueError`` for an empty state dict, adapter (peft) names, or a partly
        covered fused layer that cannot be completed; the client's
        :class:`~ludic_lab.inference.vllm_client.WeightUpdateRejected` when the first server
        refuses (no server changed); :class:`PartialPublishError` when a later one fails.
        """
        _check_names(state_dict)
        return await self._push(await self._complete_fused(state_dict, self.model), version)

    async def _push(self, state_dict: Mapping[str, Any], version: int | None) -> int:
        t0 = time.perf_counter()
        done: list[str] = []
        versions: list[int] = []
        for c in self.clients:
            try:
                v = await c.sync_weights_async(state_dict, timeout_s=self.timeout_s, version=version)
            except Exception as e:
                if not done:
                    raise
                rest = [x.server_url for x in self.clients[len(done) :]]
                raise PartialPublishError(
                    f"{e} [servers already updated: {done}; not updated: {rest}]", done, rest
                ) from e
            done.append(c.server_url)
            versions.append(int(v))
        if len(set(versions)) != 1:
            raise RuntimeError(
                f"servers report different versions after the update: {dict(zip(done, versions, strict=True))}"
            )
        self.last_version = versions[0]
        self.last_num_params = int((self.clients[0].last_sync or {}).get("num_params", len(state_dict)))
        self.last_seconds = time.perf_counter() - t0
        return versions[0]

    def publish(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        """``PolicyPublisher.publish``: :meth:`publish_async` from sync code (any thread,
        also inside a running event loop)."""
        run_sync(self.publish_async(state_dict, version))

    async def _complete_fused(self, sd: Mapping[str, Any], model: Any) -> Mapping[str, Any]:
        """``sd`` plus the missing members of every fused vLLM layer it touches, from ``model``."""
        spec = await self.clients[0].param_spec()
        touched = {spec.group_of(n) for n in sd}
        have = {spec.aliases.get(n, n) for n in sd}
        missing = [n for n in spec.shapes if n not in have and spec.group_of(n) in touched]
        if not missing:
            return sd
        if model is None:
            raise ValueError(
                "the update covers part of fused vLLM layers but lacks "
                f"{missing[:4]}{' ...' if len(missing) > 4 else ''}: "
                "vLLM loads them as one piece. Pass model=<the trained model> to BroadcastPolicyPublisher "
                "(the missing members are taken from it), or send them too."
            )
        base = base_state_dict(model)
        absent = [n for n in missing if n not in base]
        if absent:
            raise KeyError(f"the served model has {absent[:3]}, which the trained model lacks: is it the same model?")
        return {**sd, **{n: base[n] for n in missing}}

    # -- models (LoRA merge -> push -> unmerge) -------------------------------------------
    async def publish_model_async(self, model: Any, version: int | None = None) -> int:
        """Publish ``model``'s policy: a peft model's merged LoRA weights (the adapted
        modules, completed to whole fused layers, under the base model's names; the model is
        unmerged afterwards with its base weights restored exactly), or a plain model's full
        state dict. Returns the new version."""
        if is_peft_model(model):
            with merged_lora(model) as sd:
                _check_names(sd)
                return await self._push(await self._complete_fused(sd, model), version)
        return await self.publish_async({k: v.detach() for k, v in model.state_dict().items()}, version)

    def publish_model(self, model: Any, version: int | None = None) -> int:
        """:meth:`publish_model_async` from sync code."""
        return run_sync(self.publish_model_async(model, version))

    async def aclose(self) -> None:
        """Close the clients' communicators and connections on this event loop."""
        for c in self.clients:
            await c.aclose()


def is_peft_model(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def base_state_dict(model: Any) -> dict[str, Any]:
    """``model``'s tensors under the base model's names: a peft model (or a model peft
    injected adapters into) without its adapter tensors, ``.base_layer`` names folded."""
    root = model.get_base_model() if is_peft_model(model) else model
    out = {}
    for k, v in root.state_dict().items():
        if any(m in k for m in _ADAPTER_MARKERS):
            continue
        out[k.replace(".base_layer.", ".")] = v.detach()
    return out


class merged_lora:
    """Context manager: merge ``peft_model``'s active adapters into its base weights and
    yield the adapted modules' dense weights under the base model's names; on exit unmerge
    and copy the saved base weights back (a float merge/unmerge round trip is not exact)."""

    def __init__(self, peft_model: Any) -> None:
        self.model = peft_model
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> dict[str, Any]:
        import torch
        from peft.tuners.lora import LoraLayer

        base = self.model.get_base_model()
        layers = {name: mod for name, mod in base.named_modules() if isinstance(mod, LoraLayer)}
        if not layers:
            raise ValueError("the peft model has no LoRA layers to merge")
        _refuse_tied(base, layers)
        with torch.no_grad():
            for name, mod in layers.items():
                for pname, p in mod.get_base_layer().named_parameters(recurse=False):
                    self._saved[f"{name}.{pname}"] = (p, p.detach().clone())
            try:
                self.model.merge_adapter()
            except BaseException:
                self._restore()
                raise
        return {k: p.detach() for k, (p, _) in self._saved.items()}

    def __exit__(self, *exc: Any) -> None:
        try:
            self.model.unmerge_adapter()
        finally:
            self._restore()

    def _restore(self) -> None:
        import torch

        with torch.no_grad():
            for p, saved in self._saved.values():
                p.copy_(saved)
        self._saved.clear()


def _refuse_tied(base: Any, layers: Mapping[str, Any]) -> None:
    """A LoRA-adapted weight shared with another parameter (tied embeddings) cannot be
    published under one name without changing the other on the server."""
    adapted = {
        id(mod.get_base_layer().weight): name for name, mod in layers.items() if hasattr(mod.get_base_layer(), "weight")
    }
    for pname, p in base.named_parameters(remove_duplicate=False):
        owner = adapted.get(id(p))
        if owner is not None and not pname.startswith(owner + "."):
            raise ValueError(
                f"LoRA-adapted module {owner!r} shares its weight with {pname!r} (tied embeddings): merged "
                "weights cannot be published. Leave it out of the LoRA target modules, or untie the embeddings."
            )


def _check_names(state_dict: Mapping[str, Any]) -> None:
    if not state_dict:
        raise ValueError("nothing to publish: the state dict is empty")
    peft_like = [k for k in state_dict if any(m in k for m in _PEFT_MARKERS)]
    if peft_like:
        raise ValueError(
            f"state dict holds adapter (peft) names such as {peft_like[:3]}; vLLM serves the base model's "
            "names. Publish merged dense weights: publisher.publish_model(peft_model), or "
            "ludic_lab.training.lora.policy_state_dict(peft_model)"
        )
