"""``VLLMChatClient``: token-in / token-out sampling from a vLLM server, and live weight sync.

Prompts are rendered here with the model's :class:`ChatTemplate` (or taken verbatim from
``request.prompt_token_ids``) and sent as token ids to ``/v1/completions``; the server returns
the sampled token ids and the logprob of each under the distribution it was drawn from (the
bundled server runs vLLM's ``processed_logprobs`` mode). Nothing is re-tokenized, so the ids
the trainer scores are the sampler's own. Text is decoded here with the same template as
:class:`~ludic_lab.inference.local_client.LocalChatClient`, and Hermes tool calls are parsed
by the same parser, so both backends answer a request the same way.

Transient failures (connection refused or reset, 5xx, 429) are retried with exponential
backoff a bounded number of times; a 4xx is the caller's error and raised at once; every
HTTP call has a timeout. ``sync_weights`` writes the tensors to a shared-memory safetensors
file and asks the server (``POST /update_param_batch``) to load them between engine steps.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import ssl
import time
import weakref
from typing import Any, Mapping, Optional, Sequence

import httpx

from ludic_lab.aio import run_sync
from ludic_lab.inference.chat_template import ChatTemplate, check_prompt_ids, generation_eos_ids
from ludic_lab.inference.request import ChatCompletionRequest, SamplingConfig
from ludic_lab.inference.tied_weights import check_tied_values
from ludic_lab.inference.tool_calls import parse_tool_calls, tool_schemas
from ludic_lab.types import ChatResponse

POLICY_VERSION_HEADER = "X-Ludic-Policy-Version"
"""Response header carrying the policy version a completion was sampled under."""

_TOKEN_PREFIX = "token_id:"


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process. httpx builds a new one (loading the CA bundle,
    10-40 ms) for every client, and a sync call from a script gets a fresh event loop and so
    a fresh client each time."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


def _body_bytes(body: Mapping[str, Any]) -> int:
    """Bytes of the tensors an update body declares (in their wire dtypes)."""
    from ludic_lab.inference.weight_transfer.base import ParamMeta

    return sum(ParamMeta.from_json(p).nbytes for p in body.get("params", []))


class VLLMError(RuntimeError):
    """The vLLM server refused or failed a request; ``reason`` is the server's message."""

    def __init__(self, message: str, *, status: Optional[int] = None, reason: Optional[str] = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason if reason is not None else message


class WeightUpdateRejected(VLLMError, ValueError):
    """The server refused a weight update (unknown name, wrong shape or dtype, ...); the
    message names the parameters, and nothing was loaded."""


class VLLMServerUnavailable(ConnectionError):
    """The server could not be reached (dead, not started, or restarting) after retries.

    ``maybe_received`` is True when the connection broke after the request was sent (the
    server may have acted on it)."""

    def __init__(self, message: str, *, maybe_received: bool = False) -> None:
        super().__init__(message)
        self.maybe_received = maybe_received


class RequestTimeout(TimeoutError):
    """No answer in time. ``sent`` is True when the whole request reached the server (it
    timed out waiting for the answer), False when it never got there completely."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


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
        api_key: Optional[str] = None,
        group_port: int = 51216,
        enable_weight_updates: bool = False,
        device: str = "cpu",
        *,
        tokenizer: Any = None,
        control_token: Optional[str] = None,
        request_timeout_s: float = 300.0,
        connect_timeout_s: float = 5.0,
        max_retries: int = 3,
        backoff_s: float = 0.25,
        max_backoff_s: float = 4.0,
        max_connections: int = 256,
        group_host: str = "127.0.0.1",
        nccl_world_size: int = 2,
        reuse_staging_buffer: bool = True,
    ) -> None:
        if not api_base.startswith(("http://", "https://")):
            raise ValueError(f"api_base must be an http(s) URL ending in /v1, got {api_base!r}")
        self.model_name = str(model_name)
        self.api_base = api_base.rstrip("/")
        self.server_url = self.api_base[: -len("/v1")] if self.api_base.endswith("/v1") else self.api_base
        self.api_key = api_key if api_key is not None else os.environ.get("VLLM_API_KEY")
        self.control_token = control_token if control_token is not None else os.environ.get("LUDIC_CONTROL_TOKEN")
        self.group_port = int(group_port)
        self.group_host = str(group_host)
        self.nccl_world_size = int(nccl_world_size)
        self.reuse_staging_buffer = bool(reuse_staging_buffer)
        self.enable_weight_updates = bool(enable_weight_updates)
        self.device = str(device)
        self.request_timeout_s = float(request_timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.max_connections = int(max_connections)
        if tokenizer is None and not os.path.isdir(self.model_name):
            raise ValueError(
                f"VLLMChatClient: model_name {self.model_name!r} is not a local folder, so its tokenizer cannot be "
                "loaded; pass tokenizer=AutoTokenizer.from_pretrained(<the served model folder>) "
                "(or tokenizer=False for a client that only pushes weights)"
            )
        self._tokenizer: Any = tokenizer  # None: loaded from model_name on first use; False: none
        self._chat_template: Optional[ChatTemplate] = None
        self.policy_version: Optional[int] = None  # last version seen (header or update)
        self.last_sync: Optional[dict[str, Any]] = None  # timings of the last sync_weights
        self._spec: Any = None  # the server's ModelParamSpec (GET /param_spec), cached
        self._sender: Any = None  # the open transport's WeightSender
        self._shm_dir: Optional[str] = None
        # one connection pool per event loop (httpx pools are bound to the loop that made them)
        self._http: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient]" = (
            weakref.WeakKeyDictionary()
        )

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

    # -- HTTP plumbing ------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        c = self._http.get(loop)
        if c is None or c.is_closed:
            limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
            c = self._http[loop] = httpx.AsyncClient(
                limits=limits, headers=self._headers(), trust_env=False, verify=_tls_context()
            )
        return c

    async def _request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        timeout_s: Optional[float] = None,
        retry: str = "transient",
        headers: Optional[dict[str, str]] = None,
    ) -> httpx.Response:
        """One HTTP call with bounded retries; returns a 2xx response or raises.

        ``retry="transient"`` retries connection errors, 5xx and 429; ``retry="connect"``
        retries only failures to connect (the request never reached the server: safe for
        calls that must not run twice). 4xx raise :class:`VLLMError` at once, timeouts
        ``TimeoutError``, an unreachable server :class:`VLLMServerUnavailable`.
        """
        timeout = httpx.Timeout(self.request_timeout_s if timeout_s is None else timeout_s, connect=self.connect_timeout_s)
        last: str = ""
        for attempt in range(self.max_retries + 1):
            wait = min(self.max_backoff_s, self.backoff_s * (2**attempt)) * (0.5 + random.random() / 2)
            try:
                resp = await self._client().request(method, url, json=json, timeout=timeout, headers=headers)
            except httpx.TimeoutException as e:
                if isinstance(e, httpx.ConnectTimeout):
                    last = f"connect timeout after {self.connect_timeout_s:g}s"
                else:
                    raise RequestTimeout(
                        f"{method} {url}: no answer within {timeout.read:g}s (request_timeout_s); "
                        "the server is overloaded or stuck",
                        sent=isinstance(e, httpx.ReadTimeout),
                    ) from e
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
                if retry == "connect" and not isinstance(e, httpx.ConnectError):
                    raise VLLMServerUnavailable(
                        f"{method} {url}: the connection broke while the server was handling the request "
                        f"({type(e).__name__}: {e}); it may or may not have been applied",
                        maybe_received=True,
                    ) from e
                last = f"{type(e).__name__}: {e or 'connection failed'}"
            else:
                if resp.status_code < 400:
                    return resp
                msg = _error_message(resp)
                transient = resp.status_code >= 500 or resp.status_code == 429
                if not transient or retry != "transient":
                    raise VLLMError(f"{method} {url} -> HTTP {resp.status_code}: {msg}", status=resp.status_code, reason=msg)
                last = f"HTTP {resp.status_code}: {msg}"
                ra = resp.headers.get("retry-after")
                if ra is not None and ra.replace(".", "", 1).isdigit():
                    wait = min(self.max_backoff_s, float(ra))
                if attempt == self.max_retries:
                    raise VLLMError(
                        f"{method} {url} failed after {attempt + 1} attempts: {last}", status=resp.status_code, reason=msg
                    )
            if attempt < self.max_retries:
                await asyncio.sleep(wait)
        raise VLLMServerUnavailable(
            f"vLLM server at {self.server_url} is not reachable ({last}) after {self.max_retries + 1} attempts; "
            "is it running? Start one with ludic_lab.inference.start_vllm_server(...) and "
            "wait_for_vllm_health(api_base)"
        )

    # -- ChatClient API -------------------------------------------------------------------
    def prompt_ids(self, request: ChatCompletionRequest) -> list[int]:
        """The exact prompt ids for ``request`` (its own ids, or the chat template's render)."""
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
        else:
            ids = self.chat_template.render_ids(request.messages, add_generation_prompt=True, tools=tool_schemas(request))
        return check_prompt_ids(ids, self.vocab_size)

    def completion_body(self, request: ChatCompletionRequest, prompt: Sequence[int]) -> dict[str, Any]:
        """The ``/v1/completions`` JSON body for ``request`` (prompt given as token ids)."""
        cfg: SamplingConfig = request.sampling
        ret = request.return_
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": list(prompt),
            "max_tokens": cfg.max_tokens,
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "top_k": cfg.top_k if cfg.top_k > 0 else 0,
            "frequency_penalty": cfg.frequency_penalty,
            "presence_penalty": cfg.presence_penalty,
            "stop_token_ids": sorted(self.chat_template.stop_token_ids),
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": True,
        }
        if cfg.seed is not None:
            body["seed"] = int(cfg.seed) & 0x7FFF_FFFF_FFFF_FFFF
        stops = [s for s in cfg.stop if s]
        if stops:
            body["stop"] = stops
        if ret.return_chosen_logprobs or ret.top_logprobs_k > 0:
            body["logprobs"] = max(0, int(ret.top_logprobs_k))
        extra = (request.extensions or {}).get("extra_body")
        if extra:
            if not isinstance(extra, Mapping):
                raise TypeError(f"extensions['extra_body'] must be a dict of vLLM request fields, got {type(extra).__name__}")
            body.update(extra)
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
        for attempt in range(self.max_retries + 1):
            resp = await self._request("POST", f"{self.api_base}/completions", json=body)
            data = resp.json()
            # a server shutting down aborts what it is sampling: retried like a lost connection
            if not _aborted(data) or attempt == self.max_retries:
                break
            await asyncio.sleep(min(self.max_backoff_s, self.backoff_s * (2**attempt)))
        dt = time.perf_counter() - t0
        version = _int_or_none(resp.headers.get(POLICY_VERSION_HEADER))
        if version is not None:
            self.policy_version = version
        response = self._parse_choice(request, prompt, data, version)
        usage = data.get("usage") or {}
        info = {
            "generate_s": dt,
            "prompt_tokens": len(prompt),
            "completion_tokens": int(usage.get("completion_tokens", len(response.completion_token_ids or ()))),
            "policy_version": version,
            "server": self.server_url,
        }
        return response, info

    def _parse_choice(
        self, request: ChatCompletionRequest, prompt: Sequence[int], data: dict[str, Any], version: Optional[int]
    ) -> ChatResponse:
        try:
            choice = data["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
        except (KeyError, IndexError, TypeError) as e:
            raise VLLMError(
                f"malformed completion from {self.server_url}: no choices[0].token_ids ({e!r}); "
                "is this a vLLM server (return_token_ids needs vLLM >= 0.10)?"
            ) from e
        server_prompt = choice.get("prompt_token_ids") or data.get("prompt_token_ids")
        if server_prompt is not None and [int(t) for t in server_prompt] != list(prompt):
            raise VLLMError(
                f"the server at {self.server_url} conditioned on other prompt ids than the {len(prompt)} it was "
                f"sent ({len(server_prompt)} ids): its completion would be trained on the wrong context"
            )
        ret = request.return_
        lps: Optional[list[float]] = None
        tops: Optional[list[dict[int, float]]] = None
        lp_block = choice.get("logprobs")
        if ret.return_chosen_logprobs or ret.top_logprobs_k > 0:
            if not lp_block:
                raise VLLMError(f"the server returned no logprobs although they were requested ({self.server_url})")
            raw = lp_block.get("token_logprobs") or []
            if len(raw) != len(ids) or any(x is None for x in raw):
                raise VLLMError(f"the server returned {len(raw)} logprobs for {len(ids)} completion tokens")
            lps = [float(x) for x in raw]
            if ret.top_logprobs_k > 0:
                k = int(ret.top_logprobs_k)
                tops = []
                for d in lp_block.get("top_logprobs") or []:
                    pairs = sorted(((_token_id(key), float(v)) for key, v in (d or {}).items()), key=lambda p: -p[1])
                    tops.append(dict(pairs[:k]))
                if len(tops) != len(ids):
                    raise VLLMError(f"the server returned {len(tops)} top-logprob rows for {len(ids)} completion tokens")
        finish = choice.get("finish_reason") or "length"
        if finish == "abort":
            raise VLLMError(
                f"the server at {self.server_url} aborted the completion {self.max_retries + 1} times "
                "(is it shutting down?)"
            )
        if finish not in ("stop", "length"):
            raise VLLMError(f"the server ended the completion with finish_reason={finish!r} ({self.server_url})")
        stop_ids = self.chat_template.stop_token_ids
        text = self.chat_template.decode(ids[:-1] if ids and ids[-1] in stop_ids else ids)
        stop_reason = choice.get("stop_reason")
        if isinstance(stop_reason, str):  # cut by a stop string: the text ends before it
            hits = [k for k in (text.find(s) for s in request.sampling.stop if s) if k >= 0]
            text = text[: min(hits)] if hits else str(choice.get("text", text))
        tool_calls, text_out = parse_tool_calls(text) if request.tools is not None else (None, text)
        want_ids = ret.return_token_ids or ret.return_chosen_logprobs
        return ChatResponse(
            text=text_out,
            completion_token_ids=tuple(ids) if want_ids else None,
            prompt_token_ids=tuple(prompt) if want_ids else None,
            completion_logprobs=tuple(lps) if ret.return_chosen_logprobs and lps is not None else None,
            top_logprobs=tuple(tops) if tops is not None else None,
            finish_reason=finish,
            policy_version=version,
            tool_calls=tool_calls,
        )

    # -- server state ---------------------------------------------------------------------
    async def health(self) -> bool:
        """True when ``GET /health`` answers 200 (a single attempt, no retries)."""
        try:
            r = await self._client().get(f"{self.server_url}/health", timeout=self.connect_timeout_s)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def get_policy_version(self) -> int:
        """The version of the weights the server samples with now (``GET /runtime_version``)."""
        return int((await self.get_runtime_state())["version"])

    async def get_runtime_state(self) -> dict[str, Any]:
        """``GET /runtime_version`` whole: ``version``; on the bundled server also
        ``inflight_requests`` (generations admitted and not yet answered: an update waits for
        them) and ``update_pending`` (an update holds new requests back)."""
        r = await self._request("GET", f"{self.server_url}/runtime_version", timeout_s=self.connect_timeout_s + 30)
        state = dict(r.json())
        self.policy_version = int(state["version"])
        return state

    async def num_background_tasks(self) -> int:
        """Background tasks the server is running (``GET /get_num_background_tasks``)."""
        r = await self._request("GET", f"{self.server_url}/get_num_background_tasks", timeout_s=self.connect_timeout_s + 30)
        return int(r.json()["num_background_tasks"])

    async def reset_prefix_cache(self) -> None:
        """Drop the server's prefix cache (``POST /reset_prefix_cache``)."""
        await self._request(
            "POST", f"{self.server_url}/reset_prefix_cache", timeout_s=self.connect_timeout_s + 60, headers=self._control_headers()
        )

    # -- weight updates -------------------------------------------------------------------
    def _control_headers(self) -> dict[str, str]:
        tok = self.control_token or self.api_key
        return {"Authorization": f"Bearer {tok}"} if tok else {}

    async def param_spec(self, *, refresh: bool = False) -> Any:
        """What an update must match (``GET /param_spec``): a
        :class:`~ludic_lab.inference.weight_transfer.spec.ModelParamSpec` (cached)."""
        from ludic_lab.inference.weight_transfer.spec import ModelParamSpec

        if self._spec is None or refresh:
            try:
                r = await self._request("GET", f"{self.server_url}/param_spec", timeout_s=self.connect_timeout_s + 30)
            except VLLMError as e:
                if e.status == 404:
                    raise VLLMError(
                        f"{self.server_url} has no weight-update routes (GET /param_spec: 404): serve the model with "
                        "python -m ludic_lab.inference.vllm_server (or start_vllm_server) to push weights",
                        status=404,
                    ) from None
                raise
            d = r.json()
            self._spec = ModelParamSpec(
                shapes={k: tuple(v) for k, v in d["params"].items()},
                dtype=d["dtype"],
                aliases=dict(d.get("aliases") or {}),
                packed_modules={k: tuple(v) for k, v in (d.get("packed_modules") or {}).items()},
            )
        return self._spec

    def _make_sender(self) -> Any:
        if self.device == "cpu":
            from ludic_lab.inference.weight_transfer.shm import ShmSender

            return ShmSender(self._shm_dir, reuse=self.reuse_staging_buffer)
        from ludic_lab.inference.weight_transfer.nccl import NcclSender

        return NcclSender(self.group_host, self.group_port, self.nccl_world_size)

    async def init_communicator(self) -> None:
        """Open the weight-update channel (``POST /init_communicator``): shared memory on
        CPU; on a CUDA ``device`` an NCCL group on ``group_host:group_port`` (joined here
        while the server's workers join)."""
        if self._sender is not None:
            return
        if self.device == "cpu":
            r = await self._request(
                "POST", f"{self.server_url}/init_communicator", json={"transport": "shm"}, timeout_s=60.0,
                headers=self._control_headers(),
            )
            self._shm_dir = r.json().get("shm_dir") or None
            self._sender = self._make_sender()
            return
        sender = self._make_sender()
        post = asyncio.ensure_future(
            self._request(
                "POST", f"{self.server_url}/init_communicator", json=sender.init_body(), timeout_s=300.0,
                headers=self._control_headers(), retry="connect",
            )
        )
        try:
            await asyncio.to_thread(sender.connect)
            await post
        except BaseException:
            post.cancel()
            sender.close()
            raise
        self._sender = sender

    async def close_communicator(self) -> None:
        """Close the weight-update channel (``POST /close_communicator``); idempotent."""
        sender, self._sender = self._sender, None
        if sender is None:
            return
        if sender.transport == "shm":  # nothing is held open on the server for files
            sender.close()
            return
        try:
            await self._request(
                "POST", f"{self.server_url}/close_communicator", timeout_s=60.0, headers=self._control_headers(), retry="connect"
            )
        finally:
            sender.close()

    def _prepare(self, params: Mapping[str, Any], spec: Any, *, cast: bool = True) -> dict[str, Any]:
        """Detached tensors in wire order; with ``cast``, floating tensors cast to the server's
        dtype (the shm sender casts while staging instead; others are sent as they are, for the
        server to accept or refuse). A tied alias (``lm_head.weight``) sent with its embedding
        must hold the same value (else :class:`~ludic_lab.inference.tied_weights.TiedWeightsMismatch`,
        the rule ``LocalChatClient`` applies too) and is not sent twice."""
        import torch

        target = getattr(torch, spec.dtype)
        check_tied_values(params, [[canon, alias] for alias, canon in spec.aliases.items()], who="sync_weights")
        out: dict[str, Any] = {}
        for k, v in params.items():
            if not isinstance(k, str):
                raise TypeError(f"sync_weights: parameter names must be strings, got {k!r}")
            canon = spec.aliases.get(k)
            if canon is not None and canon in params:
                continue  # one tensor, checked equal above: the server loads the embedding
            t = v if isinstance(v, torch.Tensor) else torch.as_tensor(v)
            t = t.detach()
            if cast and t.is_floating_point() and t.dtype != target:
                t = t.to(target)
            out[k] = t
        return out

    async def sync_weights_async(
        self,
        params: Mapping[str, Any],
        *,
        timeout_s: float = 600.0,
        version: Optional[str | int] = None,
    ) -> str:
        """Async :meth:`sync_weights`."""
        if not self.enable_weight_updates:
            raise RuntimeError(
                "this VLLMChatClient was created with enable_weight_updates=False; pass "
                "enable_weight_updates=True (and serve with python -m ludic_lab.inference.vllm_server)"
            )
        new_version = _check_version(version)
        if not params:
            raise ValueError("sync_weights: no parameters given")
        t0 = time.perf_counter()
        spec = await self.param_spec()
        await self.init_communicator()
        sender = self._sender
        t_prep = time.perf_counter()
        shm = sender.transport == "shm"
        tensors = self._prepare(params, spec, cast=not shm)
        t_stage = time.perf_counter()
        if shm:  # the cast to the server's dtype happens while copying into shared memory
            body = await asyncio.to_thread(sender.stage, tensors, version=new_version, dtype=spec.dtype)
        else:
            body = await asyncio.to_thread(sender.stage, tensors, version=new_version)
        t_staged = time.perf_counter()
        url = f"{self.server_url}/update_param_batch"
        hdr = self._control_headers()
        # the server removes the one-shot file of every request it received (also a refused
        # one); the client removes it only when the server surely never got the request. A
        # reused staging buffer is written again only after the server answered.
        undelivered, answered = False, False
        try:
            if sender.transport == "nccl":  # a refused update must not leave us broadcasting
                await self._request("POST", f"{self.server_url}/validate_param_batch", json=body, headers=hdr, retry="connect")
            post = asyncio.ensure_future(self._request("POST", url, json=body, timeout_s=timeout_s, headers=hdr, retry="connect"))
            if sender.transport == "nccl":
                await asyncio.to_thread(sender.send, tensors)
            resp = await post
            answered = True
        except VLLMError as e:
            answered = e.status is not None
            if e.status == 400:
                raise WeightUpdateRejected(f"sync_weights refused by {self.server_url}: {e.reason}", status=400) from None
            raise
        except RequestTimeout as e:
            undelivered = not e.sent  # sent: the server may still be applying it
            raise RequestTimeout(
                f"sync_weights: no answer from {self.server_url} within {timeout_s:g}s; the update is applied "
                "whole or not at all (check get_policy_version())",
                sent=e.sent,
            ) from e
        except VLLMServerUnavailable as e:
            undelivered = not (e.maybe_received and await self.health())  # a live server may be applying it
            raise
        finally:
            if undelivered:
                sender.discard(body)  # nobody will read it
            elif answered:
                sender.release(body)
            else:
                sender.abandon(body)  # the server may still be reading it
        data = resp.json()
        n = int(data.get("num_params", -1))
        if n != len(tensors):
            raise VLLMError(f"sync_weights: the server applied {n} of {len(tensors)} parameters ({self.server_url})")
        self.policy_version = int(data["version"])
        self.last_sync = {
            "seconds": time.perf_counter() - t0,
            "prepare_seconds": t_stage - t_prep,  # detach / cast to the server's dtype
            "stage_seconds": t_staged - t_stage,  # shm: writing the file; nccl: ~0
            "server_seconds": float(data.get("seconds", float("nan"))),
            "load_seconds": float(data.get("load_seconds", float("nan"))),
            "load_mode": data.get("load_mode"),  # "inplace", "reload" (+ "reason"), ...
            "pack_seconds": float(data.get("pack_seconds", float("nan"))),  # vLLM re-packing its CPU GEMM weights
            "num_params": n,
            "load_reason": data.get("reason"),  # why not in place, when it was not
            "server_phases": dict(data.get("phases") or {}),  # drain, pause, load, resume, reset_prefix_cache
            "drained_requests": data.get("drained_requests"),  # generations the update waited for
            "bytes": _body_bytes(body),
            "version": self.policy_version,
        }
        return str(self.policy_version)

    def sync_weights(
        self,
        params: Mapping[str, Any],
        *,
        timeout_s: float = 600.0,
        version: Optional[str | int] = None,
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
        loop = asyncio.get_running_loop()
        c = self._http.pop(loop, None)
        if c is not None:
            await c.aclose()

    def close(self) -> None:
        """Sync :meth:`aclose`."""
        run_sync(self.aclose())


# -- helpers ----------------------------------------------------------------------------------
def _error_message(resp: httpx.Response) -> str:
    """The server's error text: ``{"error": "..."}``, vLLM's ``{"error": {"message"}}``, or the body."""
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:500] or resp.reason_phrase
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        err = err.get("message", err)
    if isinstance(data, dict) and "detail" in data and err is data:
        err = data["detail"]
    return str(err)[:2000]


def _aborted(data: Any) -> bool:
    try:
        return data["choices"][0].get("finish_reason") == "abort"
    except (KeyError, IndexError, TypeError, AttributeError):
        return False


def _token_id(key: str) -> int:
    if key.startswith(_TOKEN_PREFIX):
        return int(key[len(_TOKEN_PREFIX):])
    raise VLLMError(f"top logprobs keyed by {key!r}: the server ignored return_tokens_as_token_ids")


def _int_or_none(x: Optional[str]) -> Optional[int]:
    try:
        return None if x is None else int(x)
    except ValueError:
        return None


def _check_version(version: Optional[str | int]) -> Optional[int]:
    if version is None:
        return None
    try:
        return int(version)
    except (TypeError, ValueError):
        raise ValueError(f"sync_weights: version must be an integer (or its string), got {version!r}") from None
