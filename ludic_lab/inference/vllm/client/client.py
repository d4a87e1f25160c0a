"""``VLLMChatClient``: token-in / token-out sampling from a vLLM server, and live weight sync.

Prompts are rendered here with the model's :class:`ChatTemplate` (or taken verbatim from
``request.prompt_token_ids``) and sent as token ids to ``/v1/completions``; the server returns
the sampled token ids and the logprob of each under the distribution it was drawn from (the
bundled server runs vLLM's ``processed_logprobs`` mode). Nothing is re-tokenized, so the ids
the trainer scores are the sampler's own. Text is decoded here with the same template as
:class:`~ludic_lab.inference.local.client.LocalChatClient`, and reasoning and tool calls are
parsed by the same rendering layer (the model family's renderer, from the ids), so both
backends answer a request the same way.

Transient failures (connection refused or reset, 5xx, 429) are retried with exponential
backoff a bounded number of times; a 4xx is the caller's error and raised at once; every
HTTP call has a timeout. ``sync_weights`` writes the tensors to a shared-memory safetensors
file and asks the server (``POST /update_param_batch``) to load them between engine steps.

The client composes three parts, one module each: HTTP with retries
(:mod:`~ludic_lab.inference.vllm.client.http`, policy :class:`~ludic_lab.inference.retry.RetryPolicy`),
the completion exchange (:mod:`~ludic_lab.inference.vllm.client.sampling`) and weight sync
(:mod:`~ludic_lab.inference.vllm.client.weight_sync`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ludic_lab.aio import run_sync
from ludic_lab.inference.chat_template import ChatTemplate, check_prompt_ids, context_length, generation_eos_ids
from ludic_lab.inference.request import ChatCompletionRequest
from ludic_lab.inference.retry import RetryPolicy
from ludic_lab.inference.vllm.client.http import (  # noqa: F401 - re-exported: the client's errors
    RequestTimeout,
    VLLMError,
    VLLMHttp,
    VLLMServerUnavailable,
    WeightUpdateRejected,
)
from ludic_lab.inference.vllm.client.sampling import completion_body, int_or_none, is_aborted, parse_choice
from ludic_lab.inference.vllm.client.weight_sync import WeightSync
from ludic_lab.rendering.reply import tool_schemas
from ludic_lab.types import ChatResponse

POLICY_VERSION_HEADER = "X-Ludic-Policy-Version"
"""Response header carrying the policy version a completion was sampled under."""


class VLLMChatClient:
    """``ChatClient`` over a vLLM server (the bundled ``ludic_lab.inference.vllm_server``
    for weight updates; any vLLM OpenAI server for sampling only).

    ``model_name`` is the served model name; unless ``tokenizer`` is given it must be a local
    model folder (the tokenizer is loaded from it on first use; ``tokenizer=False`` makes a
    client that only pushes weights). ``api_base`` ends in ``/v1``. ``api_key`` is sent as
    ``Authorization: Bearer`` (default ``$VLLM_API_KEY``); the weight-update routes get
    ``control_token`` instead when set (default ``$LUDIC_CONTROL_TOKEN``, the server's token).
    ``enable_weight_updates`` allows :meth:`sync_weights`: ``device="cpu"`` uses the
    shared-memory transport (server on the same host); a CUDA device the NCCL transport, the
    trainer joining as rank 0 of ``nccl_world_size`` on ``group_host:group_port`` (this path
    needs GPUs and is not exercised on CPU machines). With ``reuse_staging_buffer`` (default)
    the shared-memory transport keeps one staging file of the model's size in ``/dev/shm``
    for the client's life and overwrites it per update (one memcpy; :meth:`close` deletes
    it); ``False`` writes a fresh file per update, which the server deletes (no RAM held
    between updates, but every update pays for fresh pages). ``request_timeout_s`` bounds one HTTP
    attempt; ``max_retries`` and ``backoff_s`` bound the retries of transient errors (waits
    about ``backoff_s * 2**i``, at most ``max_backoff_s``).
    """

    def __init__(
        self,
        model_name: str,
        api_base: str = "http://127.0.0.1:8000/v1",
        api_key: str | None = None,
        group_port: int = 51216,
        enable_weight_updates: bool = False,
        device: str = "cpu",
        *,
        tokenizer: Any = None,
        control_token: str | None = None,
        request_timeout_s: float = 300.0,
        connect_timeout_s: float = 5.0,
        max_retries: int = 3,
        backoff_s: float = 0.25,
        max_backoff_s: float = 4.0,
        max_connections: int = 256,
        group_host: str = "127.0.0.1",
        nccl_world_size: int = 2,
        reuse_staging_buffer: bool = True,
        max_model_len: int | None = None,
    ) -> None:
        if not api_base.startswith(("http://", "https://")):
            raise ValueError(f"api_base must be an http(s) URL ending in /v1, got {api_base!r}")
        self.model_name = str(model_name)
        self.api_base = api_base.rstrip("/")
        self.server_url = self.api_base[: -len("/v1")] if self.api_base.endswith("/v1") else self.api_base
        self.enable_weight_updates = bool(enable_weight_updates)
        if tokenizer is None and not os.path.isdir(self.model_name):
            raise ValueError(
                f"VLLMChatClient: model_name {self.model_name!r} is not a local folder, so its tokenizer cannot be "
                "loaded; pass tokenizer=AutoTokenizer.from_pretrained(<the served model folder>) "
                "(or tokenizer=False for a client that only pushes weights)"
            )
        self.retry = RetryPolicy(max_retries=int(max_retries), base_s=float(backoff_s), cap_s=float(max_backoff_s))
        self.http = VLLMHttp(
            self.server_url,
            api_key=api_key if api_key is not None else os.environ.get("VLLM_API_KEY"),
            request_timeout_s=request_timeout_s,
            connect_timeout_s=connect_timeout_s,
            retry=self.retry,
            max_connections=max_connections,
        )
        self.weights = WeightSync(
            self.http,
            device=device,
            control_token=control_token if control_token is not None else os.environ.get("LUDIC_CONTROL_TOKEN"),
            group_host=group_host,
            group_port=group_port,
            nccl_world_size=nccl_world_size,
            reuse_staging_buffer=reuse_staging_buffer,
        )
        self._tokenizer: Any = tokenizer  # None: loaded from model_name on first use; False: none
        if max_model_len is not None and (isinstance(max_model_len, bool) or not isinstance(max_model_len, int)
                                          or max_model_len < 1):  # fmt: skip
            raise ValueError(f"max_model_len must be an int >= 1 (the server's --max-model-len), got {max_model_len!r}")
        self.max_model_len: int | None = max_model_len if max_model_len is not None else _folder_context(model_name)
        """The server's context in tokens (its ``--max-model-len``; default: the served folder's
        ``max_position_embeddings``): a longer prompt fails its request here, never sent."""
        self._chat_template: ChatTemplate | None = None
        self.policy_version: int | None = None  # last version seen (header or update)
        self.last_sync: dict[str, Any] | None = None  # timings of the last sync_weights

    # -- settings, as given to the constructor (read-only views of the parts) ---------------
    api_key = property(lambda self: self.http.api_key)
    request_timeout_s = property(lambda self: self.http.request_timeout_s)
    connect_timeout_s = property(lambda self: self.http.connect_timeout_s)
    max_connections = property(lambda self: self.http.max_connections)
    max_retries = property(lambda self: self.retry.max_retries)
    backoff_s = property(lambda self: self.retry.base_s)
    max_backoff_s = property(lambda self: self.retry.cap_s)
    control_token = property(lambda self: self.weights.control_token)
    device = property(lambda self: self.weights.device)
    group_host = property(lambda self: self.weights.group_host)
    group_port = property(lambda self: self.weights.group_port)
    nccl_world_size = property(lambda self: self.weights.nccl_world_size)
    reuse_staging_buffer = property(lambda self: self.weights.reuse_staging_buffer)

    # -- tokenizer (loaded lazily: a weights-only client never needs it) -------------------
    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is False:
            raise RuntimeError(f"{self!r} was created with tokenizer=False (weights only); it cannot sample")
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_name)
        return self._tokenizer

    @property
    def chat_template(self) -> ChatTemplate:
        """The served model's chat template (renders prompts to the ids sent to the server)."""
        if self._chat_template is None:
            # the served model's generation-config EOS ids: vLLM stops on them, so the client's
            # stop list (and a completion's "ended on a stop token") must include them
            self._chat_template = ChatTemplate(self.tokenizer, generation_eos_ids(self.model_name))
            self._chat_template.context = self.max_model_len
        return self._chat_template

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def pad_token_id(self) -> int:
        tok = self.tokenizer
        return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)

    def __repr__(self) -> str:
        return f"VLLMChatClient(model_name={self.model_name!r}, api_base={self.api_base!r})"

    # -- ChatClient API -------------------------------------------------------------------
    def prompt_ids(self, request: ChatCompletionRequest) -> list[int]:
        """The exact prompt ids for ``request`` (its own ids, or the chat template's render)."""
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
        else:
            ids = self.chat_template.render_ids(
                request.messages, add_generation_prompt=True, tools=tool_schemas(request)
            )
        return check_prompt_ids(ids, self.vocab_size, self.max_model_len)

    def completion_body(self, request: ChatCompletionRequest, prompt: Sequence[int]) -> dict[str, Any]:
        """The ``/v1/completions`` JSON body for ``request`` (prompt given as token ids)."""
        body = completion_body(request, prompt, model_name=self.model_name, template=self.chat_template)
        if self.max_model_len is not None:  # vLLM refuses prompt + max_tokens past the context: cap, as in process
            body["max_tokens"] = min(body["max_tokens"], self.max_model_len - len(prompt))
        return body

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        """Sample one completion from the server (token ids in, token ids + logprobs out).

        Raises ``ValueError`` for a bad prompt, :class:`VLLMError` when the server refuses the
        request (4xx, or 5xx after retries), ``TimeoutError`` past ``request_timeout_s`` and
        :class:`VLLMServerUnavailable` when the server cannot be reached.
        """
        prompt = self.prompt_ids(request)
        body = self.completion_body(request, prompt)
        t0 = time.perf_counter()
        attempt = 0
        while True:
            resp = await self.http.request("POST", f"{self.api_base}/completions", json=body)
            data = resp.json()
            # a server shutting down aborts what it is sampling: retried like a lost connection
            if not is_aborted(data) or not self.retry.allows(attempt):
                break
            await asyncio.sleep(self.retry.delay(attempt))
            attempt += 1
        dt = time.perf_counter() - t0
        version = int_or_none(resp.headers.get(POLICY_VERSION_HEADER))
        if version is not None:
            self.policy_version = version
        response = parse_choice(
            request, prompt, data, version, template=self.chat_template, server=self.server_url, attempts=attempt + 1
        )
        usage = data.get("usage") or {}
        info = {
            "generate_s": dt,
            "prompt_tokens": len(prompt),
            "completion_tokens": int(usage.get("completion_tokens", len(response.completion_token_ids or ()))),
            "policy_version": response.policy_version,  # the oldest token's (in_flight servers)
            "server": self.server_url,
        }
        return response, info

    # -- server state ---------------------------------------------------------------------
    async def health(self) -> bool:
        """True when ``GET /health`` answers 200 (a single attempt, no retries)."""
        return await self.http.health()

    async def get_policy_version(self) -> int:
        """The version of the weights the server samples with now (``GET /runtime_version``)."""
        return int((await self.get_runtime_state())["version"])

    async def get_runtime_state(self) -> dict[str, Any]:
        """``GET /runtime_version`` whole: ``version``; on the bundled server also
        ``inflight_requests`` (generations admitted and not yet answered: an update waits for
        them) and ``update_pending`` (an update holds new requests back)."""
        r = await self.http.request("GET", f"{self.server_url}/runtime_version", timeout_s=self.connect_timeout_s + 30)
        state = dict(r.json())
        self.policy_version = int(state["version"])
        return state

    async def num_background_tasks(self) -> int:
        """Background tasks the server is running (``GET /get_num_background_tasks``)."""
        r = await self.http.request(
            "GET", f"{self.server_url}/get_num_background_tasks", timeout_s=self.connect_timeout_s + 30
        )
        return int(r.json()["num_background_tasks"])

    async def reset_prefix_cache(self) -> None:
        """Drop the server's prefix cache (``POST /reset_prefix_cache``)."""
        await self.http.request(
            "POST",
            f"{self.server_url}/reset_prefix_cache",
            timeout_s=self.connect_timeout_s + 60,
            headers=self.weights.headers(),
        )

    # -- weight updates (see weight_sync.py) ------------------------------------------------
    async def param_spec(self, *, refresh: bool = False) -> Any:
        """What an update must match (``GET /param_spec``): a
        :class:`~ludic_lab.inference.vllm.weight_transfer.spec.ModelParamSpec` (cached)."""
        return await self.weights.param_spec(refresh=refresh)

    async def init_communicator(self) -> None:
        """Open the weight-update channel (``POST /init_communicator``): shared memory on
        CPU; on a CUDA ``device`` an NCCL group on ``group_host:group_port`` (joined here
        while the server's workers join)."""
        await self.weights.init_communicator()

    async def close_communicator(self) -> None:
        """Close the weight-update channel (``POST /close_communicator``); idempotent."""
        await self.weights.close_communicator()

    def _prepare(self, params: Mapping[str, Any], spec: Any, *, cast: bool = True) -> dict[str, Any]:
        return self.weights.prepare(params, spec, cast=cast)

    async def sync_weights_async(
        self,
        params: Mapping[str, Any],
        *,
        timeout_s: float = 600.0,
        version: str | int | None = None,
    ) -> str:
        """Async :meth:`sync_weights`."""
        if not self.enable_weight_updates:
            raise RuntimeError(
                "this VLLMChatClient was created with enable_weight_updates=False; pass "
                "enable_weight_updates=True (and serve with python -m ludic_lab.inference.vllm_server)"
            )
        self.policy_version, self.last_sync = await self.weights.push(params, timeout_s=timeout_s, version=version)
        return str(self.policy_version)

    def sync_weights(
        self,
        params: Mapping[str, Any],
        *,
        timeout_s: float = 600.0,
        version: str | int | None = None,
    ) -> str:
        """Load ``params`` (HF state-dict names of the served model) into the server.

        Floating tensors are cast to the server's dtype. The server checks every name, shape
        and dtype before applying anything (a mismatch raises :class:`WeightUpdateRejected`
        naming the parameter; the old weights keep serving), applies the batch between
        engine steps, resets its prefix cache and bumps its version (to ``version`` if
        given). Returns the new version as a string. Callable from any thread, also while an
        event loop runs in it (e.g. a Jupyter cell).
        """
        return run_sync(self.sync_weights_async(params, timeout_s=timeout_s, version=version))

    # -- lifecycle ------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Close the weight-update channel (if open) and this event loop's connections."""
        try:
            await self.close_communicator()
        except (VLLMError, VLLMServerUnavailable, TimeoutError):
            pass  # a dead server has nothing left to close
        await self.http.aclose()

    def close(self) -> None:
        """Sync :meth:`aclose`."""
        run_sync(self.aclose())


def _folder_context(model_name: str) -> int | None:
    """``max_position_embeddings`` (or the like) of the served folder's ``config.json``, if readable."""
    from types import SimpleNamespace

    try:
        with open(os.path.join(model_name, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return None
    return context_length(SimpleNamespace(**cfg)) if isinstance(cfg, dict) else None
