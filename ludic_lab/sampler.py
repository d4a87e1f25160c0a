"""The one place a sampler is started: in-process, the bundled vLLM server, or one already
running — and the publisher that pushes the trainer's weights into it. ``ludic-lab demo``,
the examples, the pipeline actor and :func:`~ludic_lab.env_training.train_env` all start
theirs here.

    client = open_client("local", "default", max_batch_size=16)      # or a running vLLM server
    publisher = publisher_for(client, policy)

    async with Sampler("vllm", "default", log_dir="runs/x") as s:     # starts the server
        trainer = Trainer(policy, algo, source, publisher=s.publisher(policy), ...)

``backend="local"``: :class:`~ludic_lab.inference.LocalChatClient` over the model (weights
pushed in-process). ``backend="vllm"``: the bundled vLLM server (``--enforce-eager`` on CPU),
started on a free loopback port and stopped on exit (also on error and Ctrl-C), or the server
at ``vllm_url`` when given (left running); the publisher is a
:class:`~ludic_lab.distributed.broadcast.BroadcastPolicyPublisher`, whose ``POST
/update_param_batch`` bumps the server's ``/runtime_version``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

Backend = Literal["local", "vllm"]
"""Where a sampler samples: ``"local"`` an in-process ``LocalChatClient``, ``"vllm"`` a vLLM server."""


def api_base(url: str) -> str:
    """``http://host:port`` (or ``.../v1``) as the OpenAI-compatible ``.../v1`` base."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


class Sampler:
    """Opens (``async with``) the sampler of ``backend`` for ``model``; see the module docstring.

    After entering: ``client`` (a ``ChatClient``), ``model_path`` (the local folder the trainer
    loads too), ``server`` (the started vLLM process, or ``None``). ``num_threads``: the
    in-process sampler's generation threads (with ``TrainerConfig(async_level=1,
    num_threads=n)`` on a CPU, the cores the step leaves; see
    :func:`~ludic_lab.recipes.training.sampler_threads`); a vLLM server ignores it.
    ``weight_update``: how a weight push meets the running completions: ``"drain"`` (it waits
    for them) or ``"in_flight"`` (loaded between two decode steps, each token's version
    recorded; what ``TrainerConfig(async_mode="fully_async")`` wants): the in-process sampler's
    ``weight_update``, or ``--ludic-weight-update`` of a vLLM server this sampler starts (a
    server at ``vllm_url`` keeps the mode it was started with).
    """

    def __init__(
        self,
        backend: Backend,
        model: str,
        *,
        max_batch_size: int = 64,
        vllm_url: str | None = None,
        log_dir: str | None = None,
        dtype: str = "bfloat16",
        max_model_len: int = 1024,
        start_timeout_s: float = 900.0,
        num_threads: int | None = None,
        weight_update: str = "drain",
    ) -> None:
        if backend not in ("local", "vllm"):
            raise ValueError(f"backend must be 'local' or 'vllm', got {backend!r}")
        if vllm_url and backend != "vllm":
            raise ValueError("vllm_url is for backend='vllm' (the local backend samples in-process)")
        if weight_update not in ("drain", "in_flight"):
            raise ValueError(f"weight_update must be 'drain' or 'in_flight', got {weight_update!r}")
        self.backend, self.model = backend, model
        self.max_batch_size = max_batch_size
        self.vllm_url, self.log_dir = vllm_url, log_dir
        self.dtype, self.max_model_len, self.start_timeout_s = dtype, max_model_len, start_timeout_s
        self.num_threads = num_threads
        self.weight_update = weight_update
        self.client: Any = None
        self.model_path: str = ""
        self.server: Any = None
        self._cleanups: list[Callable[[], Any]] = []

    async def __aenter__(self) -> Sampler:
        try:
            await self._open()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def _open(self) -> None:
        from ludic_lab.inference.models import resolve_model

        if self.backend == "local" or self.vllm_url:
            self.client = open_client(self.backend, self.model, max_batch_size=self.max_batch_size,
                                      vllm_url=self.vllm_url, num_threads=self.num_threads)  # fmt: skip
            self.model_path = str(self.client.model_path) if self.backend == "local" else resolve_model(self.model)
            if self.backend == "local" and self.weight_update != "drain":
                from ludic_lab.inference.local.in_flight import check_weight_update

                check_weight_update(self.weight_update, self.client.in_flight_kv, self.client.scheduling)
                self.client.weight_update = self.weight_update
            if self.backend == "vllm":
                self._cleanups.append(self.client.aclose)
            return
        from ludic_lab.inference import VLLMChatClient, start_vllm_server, wait_for_vllm_health

        self.model_path = resolve_model(self.model)
        log = None
        if self.log_dir:
            Path(self.log_dir).mkdir(parents=True, exist_ok=True)
            log = str(Path(self.log_dir) / "vllm_server.log")
        self.server = start_vllm_server(
            self.model_path,
            port=0,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            log_file=log,
            extra_args=("--ludic-weight-update", self.weight_update),
        )
        self._cleanups.append(self.server.stop)
        await wait_for_vllm_health(self.server.api_base, timeout=self.start_timeout_s, process=self.server)
        # the served model name is the folder the server was started with; its tokenizer is read from it
        self.client = VLLMChatClient(self.model_path, api_base=self.server.api_base, enable_weight_updates=True,
                                     max_model_len=self.max_model_len)  # fmt: skip
        self._cleanups.append(self.client.aclose)

    def publisher(self, policy: Any = None) -> Any:
        """Where the trainer pushes weights after each step (``policy``: the trained model,
        which completes vLLM's fused layers that LoRA leaves partly untouched)."""
        if self.client is None:
            raise RuntimeError("open the Sampler first (async with Sampler(...) as s)")
        return publisher_for(self.client, policy)

    async def policy_version(self) -> int:
        """The sampler's policy version (how many weight pushes it has taken)."""
        return int(await self.client.get_policy_version())

    async def aclose(self) -> None:
        """Close the client and stop a server this sampler started (idempotent)."""
        import asyncio

        while self._cleanups:
            fn = self._cleanups.pop()
            try:
                res = fn()
                if asyncio.iscoroutine(res):
                    await res
            except Exception:  # noqa: BLE001 - keep stopping the rest
                pass


def open_client(backend: Backend, model: str, *, max_batch_size: int = 64, vllm_url: str | None = None,
                enable_weight_updates: bool = True, num_threads: int | None = None) -> Any:  # fmt: skip
    """A ``ChatClient`` without starting a server: ``backend="local"`` an in-process
    :class:`~ludic_lab.inference.LocalChatClient` over ``model`` (batches of up to
    ``max_batch_size``; ``num_threads``: its generation thread's intra-op threads),
    ``backend="vllm"`` a :class:`~ludic_lab.inference.VLLMChatClient` of the server already
    running at ``vllm_url`` and serving ``model``'s folder."""
    from ludic_lab.inference.models import resolve_model

    if backend == "local":
        if vllm_url:
            raise ValueError("vllm_url is for backend='vllm' (the local backend samples in-process)")
        from ludic_lab.inference import LocalChatClient

        return LocalChatClient(model, max_batch_size=max_batch_size, num_threads=num_threads)
    if backend != "vllm":
        raise ValueError(f"backend must be 'local' or 'vllm', got {backend!r}")
    if not vllm_url:
        raise ValueError("open_client('vllm', ...) needs vllm_url= (or start one with Sampler('vllm', model))")
    from ludic_lab.inference import VLLMChatClient

    # the served model name is the folder the server was started with; its tokenizer is read from it
    return VLLMChatClient(resolve_model(model), api_base=api_base(vllm_url),
                          enable_weight_updates=enable_weight_updates)  # fmt: skip


def publisher_for(client: Any, policy: Any = None) -> Any:
    """The publisher that pushes a trainer's weights into ``client``: a
    :class:`~ludic_lab.distributed.broadcast.BroadcastPolicyPublisher` for a vLLM client
    (``policy``, the trained model, completes vLLM's fused layers that LoRA leaves partly
    untouched), else a :class:`~ludic_lab.distributed.ClientPublisher` (``sync_weights``)."""
    if type(client).__name__ == "VLLMChatClient":  # by name: no vLLM client import for a local one
        from ludic_lab.distributed.broadcast import BroadcastPolicyPublisher

        return BroadcastPolicyPublisher(client, model=policy)
    from ludic_lab.distributed import ClientPublisher

    return ClientPublisher(client)


def direct_sampler(model: str, *, vllm_url: str | None = None, max_batch_size: int = 64) -> tuple[Any, Any]:
    """``(client, publisher)`` without a context manager (e.g. rank 0 of a ``torchrun`` script):
    the vLLM server already running at ``vllm_url`` (serving ``model``), or an in-process
    :class:`~ludic_lab.inference.LocalChatClient`; the publisher pushes the trainer's weights into it."""
    client = open_client("vllm" if vllm_url else "local", model, vllm_url=vllm_url, max_batch_size=max_batch_size)
    return client, publisher_for(client)
