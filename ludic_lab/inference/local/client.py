"""``LocalChatClient``: an in-process transformers model behind the async ``ChatClient`` API.

This is the embedded default backend. Requests from many concurrent episodes are gathered
(:mod:`ludic_lab.inference.local.batcher`) and decoded together with a KV cache (that is what
makes CPU rollouts usable): by default continuously (:mod:`ludic_lab.inference.local.continuous`:
requests join the running batch at a token boundary and leave when done, prompts reuse the
KV of prefixes already run, :mod:`ludic_lab.inference.local.prefix_cache`), or as static batches.
Each response carries the prompt ids, the sampled ids and the behaviour logprob of every
sampled token (see :mod:`ludic_lab.inference.sampling`). ``sync_weights`` copies new weights
in place (never mid-forward), bumps the policy version and clears the prefix cache: by default
between completions (it waits for the running ones to finish, each is sampled by one version);
with ``weight_update="in_flight"`` between two decode steps, the running completions going on
under the new weights with each token's version recorded (:mod:`.in_flight`).
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ludic_lab.inference.chat_template import (
    ChatTemplate,
    ContextLengthError,
    check_prompt_ids,
    context_length,
    generation_eos_ids,
)
from ludic_lab.inference.local.batcher import LoopBatcher
from ludic_lab.inference.local.continuous import STEP_TIMES_KEPT, ContinuousBatcher
from ludic_lab.inference.local.decode_threads import DecodeThreads
from ludic_lab.inference.local.grouped_attention import cascade_supported, use_grouped_attention
from ludic_lab.inference.local.in_flight import check_weight_update
from ludic_lab.inference.local.packed_linear import drop_packed_weights, pack_linear_weights
from ludic_lab.inference.local.prefix_cache import PrefixCache
from ludic_lab.inference.local.shared_prefix import shared_prompt_rows as shared_prompt_rows  # re-exported
from ludic_lab.inference.local.static import generate_static
from ludic_lab.inference.request import ChatCompletionRequest, SamplingConfig
from ludic_lab.inference.tied_weights import check_tied_values, tied_groups
from ludic_lab.rendering.reply import tool_schemas
from ludic_lab.types import ChatResponse


class LocalChatClient:
    """In-process ``ChatClient`` over a Hugging Face causal LM.

    ``model`` is a local model directory (e.g. :func:`~ludic_lab.inference.models.default_model_path`)
    or an already-built ``PreTrainedModel`` (then pass ``tokenizer`` too — the trainer can
    share its model object with the sampler this way). ``max_batch_size`` caps one batch;
    ``batch_wait_s`` is how long the first request of a batch waits for company.
    ``share_prompt_prefill``: requests of one batch with the same prompt ids (a GRPO group)
    prefill it once and share its KV rows (:func:`.shared_prefix.shared_prompt_rows`). ``attn_implementation``
    (a model loaded from a path): ``None`` picks ``"eager"`` for bf16/fp16 on CPU (SmolLM2, a
    GRPO batch of 32 x 48 tokens: the CPU sdpa kernel's bf16 path spent 0.85 of 4.0 s on
    one-query attention, eager 0.3 s; 3.3 s in all) and transformers' default otherwise.
    ``num_threads``: intra-op threads of generation (set on its one thread; None: torch's
    default); with ``TrainerConfig(async_level=1)`` on a CPU, the cores the trainer leaves.
    ``adaptive_threads``: the continuous batch's decode steps choose between that count and one
    thread from their own times (:mod:`.thread_governor`: beside another busy process a step at
    one thread per core collapses, SmolLM2 47 -> 420-1,330 ms, while one thread stays ~73 ms);
    ``thread_choices()`` says what it chose. ``False``: always that count.
    ``scheduling``: ``"continuous"`` (requests join and leave the running decode) or
    ``"static"`` (a gathered batch runs to its longest member; the next batch waits).
    ``prefix_cache_mb``: memory for the KV of finished sequences that later prompts extend
    (continuous scheduling; 0 turns it off); see ``prefix_cache.stats()``.
    ``kv_cache``: ``"slab"`` (decode in place into per-layer buffers, :mod:`.kv_slab`) or
    ``"dynamic"`` (transformers' ``DynamicCache``). ``grouped_attention``: a model loaded from
    a path with fewer KV heads than query heads attends without copying its KV heads per query
    head when no gradient is taken (:mod:`.grouped_attention`); a model object passed in is left as it is.
    ``shared_prefix_prefill``: prompts admitted together that share a prefix the prefix cache
    lacks (a system prompt and few-shot examples) run it once (:mod:`.shared_prefix`);
    ``cascade_attention``: the running rows keep such a prefix's KV once (:mod:`.cascade`).
    ``packed_weights``: a model loaded from a path onto a CPU multiplies by its linear weights
    packed for oneDNN (:mod:`.packed_linear`: decode steps' products ~2x faster), repacked
    after every weight update; a model object passed in is left as it is.
    ``weight_update``: ``"drain"`` (``sync_weights`` waits for the running completions) or
    ``"in_flight"`` (it loads between two decode steps; completions that span it record each
    token's version); ``in_flight_kv``: ``"keep"`` the running rows' KV computed under the old
    weights (cheap; the next tokens' logprobs are of a mixed policy) or ``"recompute"`` it under
    the new ones (exact new-policy logprobs), see :mod:`.in_flight`.
    """

    def __init__(
        self,
        model: Any = None,
        *,
        tokenizer: Any = None,
        device: str = "cpu",
        dtype: torch.dtype | str = torch.float32,
        model_name: str = "local",
        max_batch_size: int = 64,
        batch_wait_s: float = 0.0,
        gather_ticks: int = 4,
        policy_version: int = 0,
        share_prompt_prefill: bool = True,
        attn_implementation: str | None = None,
        num_threads: int | None = None,
        adaptive_threads: bool = True,
        scheduling: str = "continuous",
        prefix_cache_mb: float = 1024.0,
        kv_cache: str = "slab",
        grouped_attention: bool = True,
        shared_prefix_prefill: bool = True,
        packed_weights: bool = True,
        cascade_attention: bool = True,
        weight_update: str = "drain",
        in_flight_kv: str = "keep",
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if scheduling not in ("continuous", "static"):
            raise ValueError(f"LocalChatClient scheduling must be 'continuous' or 'static', got {scheduling!r}")
        if isinstance(prefix_cache_mb, bool) or not isinstance(prefix_cache_mb, (int, float)) or prefix_cache_mb < 0:
            raise ValueError(f"LocalChatClient prefix_cache_mb must be a number >= 0, got {prefix_cache_mb!r}")
        if kv_cache not in ("slab", "dynamic"):
            raise ValueError(f"LocalChatClient kv_cache must be 'slab' or 'dynamic', got {kv_cache!r}")
        check_weight_update(weight_update, in_flight_kv, scheduling)
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        # Every batch runs on this one long-lived thread (whichever loop submits it): torch's
        # OpenMP team belongs to the calling thread, and a thread per loop would add teams.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ludic-generate")
        weakref.finalize(self, self._executor.shutdown, wait=False)
        if model is None or isinstance(model, str) or hasattr(model, "__fspath__"):
            from ludic_lab.inference.models import resolve_model

            path = resolve_model(None if model is None else str(model))
            self.model_path: str | None = path
            eager = attn_implementation is None and dtype in (torch.bfloat16, torch.float16) and device == "cpu"
            attn = "eager" if eager else attn_implementation

            def load() -> Any:
                m: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn)
                if grouped_attention:
                    use_grouped_attention(m)
                if packed_weights and torch.device(device).type == "cpu":
                    pack_linear_weights(m)
                return m.to(device)

            # loaded on that thread: a second OpenMP team (the caller's) puts more threads than
            # cores and libgomp sleeps between ops (a one-row SmolLM2 decode step 44 -> 55 ms)
            model = self._executor.submit(load).result()
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(path)
        else:
            self.model_path = getattr(getattr(model, "config", None), "_name_or_path", None)
            if tokenizer is None:
                raise ValueError("LocalChatClient(model=<nn.Module>) needs tokenizer= as well")
        self.model = model.to(device)
        self.model.eval()
        self.tokenizer = tokenizer
        # the generation config's EOS ids end a completion too (vLLM stops on them as well)
        self.chat_template = ChatTemplate(tokenizer, generation_eos_ids(self.model))
        self.chat_template.context = context_length(self.model)  # a longer prompt fails its request alone
        self.device = torch.device(device)
        self.model_name = model_name
        self.max_batch_size = int(max_batch_size)
        self.batch_wait_s = float(batch_wait_s)
        self.gather_ticks = int(gather_ticks)
        self.policy_version = int(policy_version)
        self.share_prompt_prefill = bool(share_prompt_prefill)
        self.scheduling = scheduling
        self.weight_update = weight_update
        self.in_flight_kv = in_flight_kv
        self.kv_cache = kv_cache
        self.shared_prefix_prefill = bool(shared_prefix_prefill)
        self.cascade_attention = bool(cascade_attention) and cascade_supported(self.model)
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20))
        upper = self._executor.submit(torch.get_num_threads).result()  # the generation thread's count
        self.threads = DecodeThreads(upper, bool(adaptive_threads), STEP_TIMES_KEPT)
        self._continuous = ContinuousBatcher(self)
        self._updates_waiting = 0  # weight updates waiting for the generation thread to let go
        self._updates_lock = threading.Lock()
        self._lock = threading.RLock()  # held while generating and while loading weights
        # one batcher per event loop, dropped with its loop (ids of dead loops get reused)
        self._batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopBatcher] = weakref.WeakKeyDictionary()
        self.vocab_size: int = int(self.model.get_input_embeddings().weight.shape[0])
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = int(pad if pad is not None else tokenizer.eos_token_id)
        self._global_rng = torch.Generator().manual_seed(int(time.time_ns()) % (2**63))
        if num_threads is not None:
            self.set_num_threads(num_threads)

    # -- ChatClient API ------------------------------------------------------------------
    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        """Generate one completion; concurrent calls on the same loop share a batch."""
        loop = asyncio.get_running_loop()
        batcher = self._batchers.get(loop)
        if batcher is None:
            batcher = self._batchers[loop] = LoopBatcher(self)
        return await batcher.submit(request)

    def set_num_threads(self, n: int) -> None:
        """Generation's intra-op threads from the next batch on (set on its own thread); with
        ``adaptive_threads`` the upper of the two counts its decode steps choose from."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"LocalChatClient num_threads must be an int >= 1, got {n!r}")
        self._executor.submit(self.threads.set_upper, n)

    def thread_choices(self) -> dict[str, Any]:
        """What the continuous batch's thread count did (:class:`.decode_threads.DecodeThreads`):
        ``adaptive``, ``upper`` (the configured count), ``current``, ``steps_at`` (decode steps at
        each count), ``probes``, ``switches``, and ``recent``: the count of each decode step in
        ``step_times()["decode"]``, in the same order."""
        return {**self.threads.summary(), "recent": list(self.threads.chosen)}

    def step_times(self) -> dict[str, list[tuple[Any, ...]]]:
        """The continuous batch's recent work (the last 4,096 of each): ``"decode"`` steps as
        ``(rows, seconds)``, ``"prefill"`` calls (arrivals admitted) as ``(rows, new tokens, seconds)``."""
        return {"decode": list(self._continuous.step_times), "prefill": list(self._continuous.prefill_times)}

    def complete_sync(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        """Blocking single request (no batching across callers)."""
        return self.generate_batch([request])[0]

    async def get_policy_version(self) -> int:
        """The version of the weights the next batch will be sampled with."""
        return self.policy_version

    def sync_weights(
        self,
        params: Mapping[str, Any],
        *,
        timeout_s: float = 600.0,
        version: str | int | None = None,
    ) -> str:
        """Copy ``params`` (a full or partial state dict) into the model in place.

        Every name must exist in the model with the same shape (a mismatch is an error that
        names it, and nothing is loaded); dtypes are cast. Waits (at most ``timeout_s``) for
        the running batch to finish, or with ``weight_update="in_flight"`` for its current
        decode step only, then loads, bumps the policy version (to ``version`` if given) and
        clears the prefix cache. Returns the new version as a string.
        """
        new_version: int | None = None
        if version is not None:
            try:
                new_version = int(version)
            except (TypeError, ValueError):
                raise ValueError(f"sync_weights: version must be an integer (or its string), got {version!r}") from None
        own = self.model.state_dict()
        if unknown := [k for k in params if k not in own]:
            raise KeyError(
                f"sync_weights: {len(unknown)} unknown parameter names, e.g. {unknown[:3]}; "
                f"names must match model.state_dict() (e.g. {next(iter(own))!r}); nothing was loaded"
            )
        tensors = {k: v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for k, v in params.items()}
        if bad := [(k, tuple(v.shape), tuple(own[k].shape)) for k, v in tensors.items() if v.shape != own[k].shape]:
            raise ValueError(f"sync_weights: shape mismatch for {bad[:3]} (got, expected); nothing was loaded")
        check_tied_values(tensors, tied_groups(own), who="sync_weights")  # the rule vLLM's client applies too
        with self._updates_lock:
            self._updates_waiting += 1  # the continuous batch admits nothing new until this has loaded
        try:
            if not self._lock.acquire(timeout=timeout_s):
                raise TimeoutError(f"sync_weights: generation did not yield within {timeout_s}s; nothing was loaded")
            try:
                with torch.no_grad():
                    for k, v in tensors.items():
                        own[k].copy_(v.detach().to(device=own[k].device, dtype=own[k].dtype))
                self.policy_version = new_version if new_version is not None else self.policy_version + 1
                self.prefix_cache.clear()  # every stored KV was computed with the old weights
            finally:
                self._lock.release()
        finally:
            with self._updates_lock:
                self._updates_waiting -= 1
        return str(self.policy_version)

    def release_memory(self) -> int:
        """Drop what the next weight update makes stale anyway: the prefix cache's entries and the
        packed copies of the weights (:mod:`.packed_linear`). Between a batch's rollouts and a
        training step they would stay resident under the step's activations. Returns the bytes
        they held; later prompts prefill in full, the next decode packs the weights again."""
        held = self.prefix_cache.nbytes
        self.prefix_cache.clear()
        return held + drop_packed_weights(self.model)

    def kv_version(self) -> tuple[int, int]:
        """What a stored KV must have been computed under to be reused: the policy version and
        the parameters' in-place-update counters (a model shared with a trainer that steps it
        without ``sync_weights`` changes the second)."""
        return self.policy_version, sum(p._version for p in self.model.parameters())

    # -- generation ------------------------------------------------------------------------
    def prompt_ids(self, request: ChatCompletionRequest) -> list[int]:
        """The exact prompt ids for ``request`` (its own ids, or the chat template's render)."""
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        return self.chat_template.render_ids(request.messages, add_generation_prompt=True, tools=tool_schemas(request))

    def _checked_prompt(self, request: ChatCompletionRequest) -> list[int]:
        ids = self.prompt_ids(request)
        return check_prompt_ids(ids, self.vocab_size, self.chat_template.context)

    def _generator(self, cfg: SamplingConfig) -> torch.Generator:
        g = torch.Generator()
        if cfg.seed is not None:
            g.manual_seed(int(cfg.seed) & 0x7FFF_FFFF_FFFF_FFFF)
        else:
            g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=self._global_rng)))
        return g

    def generate_batch(self, requests: Sequence[ChatCompletionRequest]) -> list[tuple[ChatResponse, dict[str, Any]]]:
        """Generate all ``requests`` as one batch (blocking); the core of :meth:`complete`.

        A bad request (empty or out-of-vocabulary prompt ids, a template error) raises
        ``ValueError`` naming its index before anything is generated.
        """
        if not requests:
            return []
        prompts = []
        for i, r in enumerate(requests):
            try:
                prompts.append(self._checked_prompt(r))
            except Exception as e:
                kind = ContextLengthError if isinstance(e, ContextLengthError) else ValueError  # keeps its cause
                raise kind(f"request {i}: {e}") from e
        return generate_static(self, requests, prompts)

    def _generate_isolated(
        self, requests: Sequence[ChatCompletionRequest]
    ) -> list[tuple[ChatResponse, dict[str, Any]] | Exception]:
        """Like :meth:`generate_batch`, but a bad request gets its exception in its slot."""
        out: list[Any] = [None] * len(requests)
        good: list[int] = []
        prompts: list[list[int]] = []
        for i, r in enumerate(requests):
            try:
                prompts.append(self._checked_prompt(r))
                good.append(i)
            except Exception as e:  # noqa: BLE001 - delivered to that request's caller
                out[i] = e
        if good:
            for i, res in zip(good, generate_static(self, [requests[i] for i in good], prompts), strict=True):
                out[i] = res
        return out
