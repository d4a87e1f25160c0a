"""``OpenAIEndpoint``: the OpenAI-compatible endpoint, started in the background from a cell or a script.

The app (:mod:`ludic_lab.endpoint.app`) runs under uvicorn on its own thread and event loop,
bound to 127.0.0.1 on a free port, so a notebook cell returns at once and the server keeps
answering between cells. Each episode opens a :class:`~ludic_lab.endpoint.sessions.Session`
and hands its agent program ``session.client()``: an ``openai.AsyncOpenAI`` bound to the
session's key.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from ludic_lab.endpoint.app import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_REQUEST_BYTES, build_app
from ludic_lab.endpoint.sessions import Session, SessionStore
from ludic_lab.inference.request import SamplingConfig

DEFAULT_MODEL_NAME = "policy"
"""The model name agent programs ask for (``client.chat.completions.create(model="policy", ...)``)."""


class OpenAIEndpoint:
    """Serve ``client`` (any ``ChatClient`` with a ``chat_template``; kept as ``backend``) as an OpenAI-compatible API.

    ``model_names``: the names requests may use (default ``["policy"]`` plus the client's
    ``model_name`` when it has one). ``host`` defaults to 127.0.0.1; ``port=None`` picks a
    free one. A request body over ``max_request_bytes`` is a 413, one not whole within
    ``body_timeout_s`` a 408. Use as a context manager, or ``start()`` / ``stop()``.
    """

    def __init__(
        self,
        client: Any,
        *,
        model_names: Sequence[str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        body_timeout_s: float | None = DEFAULT_BODY_TIMEOUT_S,
    ) -> None:
        names = list(model_names) if model_names else [DEFAULT_MODEL_NAME]
        own = getattr(client, "model_name", None)
        if not model_names and isinstance(own, str) and own not in names:
            names.append(own)
        self.backend = client
        self.model_names = names
        self.host = host
        self.port = port
        self.store = SessionStore()
        self.app = build_app(
            client, self.store, model_names=names, max_request_bytes=max_request_bytes, body_timeout_s=body_timeout_s
        )
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def model(self) -> str:
        """The first model name (what agent programs should pass as ``model=``)."""
        return self.model_names[0]

    @property
    def url(self) -> str:
        """``http://host:port`` (the OpenAI ``base_url`` is ``url + "/v1"``)."""
        if self.port is None:
            raise RuntimeError("the endpoint is not started: call start() first")
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout_s: float = 30.0) -> OpenAIEndpoint:
        """Start serving in a background thread; returns when the server accepts connections."""
        import uvicorn

        from ludic_lab.net import free_port

        if self.running:
            return self
        if self.port is None:
            self.port = free_port(self.host)
        config = uvicorn.Config(
            self.app, host=self.host, port=self.port, log_level="warning", lifespan="off", timeout_keep_alive=30
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(target=server.run, name="ludic-openai-endpoint", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the endpoint could not start on {self.host}:{self.port} (is the port taken?)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the endpoint did not start within {timeout_s:g} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (open sessions stay readable)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._thread = None

    def __enter__(self) -> OpenAIEndpoint:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- sessions ------------------------------------------------------------------------------
    def open_session(
        self,
        *,
        sampling: SamplingConfig | None = None,
        seed: int | None = None,
        max_calls: int | None = None,
        max_completion_tokens: int | None = None,
        timeout_s: float | None = None,
        label: str | None = None,
    ) -> Session:
        """A new session (one per episode); see :class:`Session` for the arguments."""
        return self.store.open(
            sampling=sampling,
            seed=seed,
            max_calls=max_calls,
            max_completion_tokens=max_completion_tokens,
            timeout_s=timeout_s,
            label=label,
        )

    def close_session(self, session: Session) -> None:
        """End a session: later calls with its key are refused (401 ``session_closed``)."""
        self.store.close(session)

    def client(self, session: Session, *, timeout_s: float = 600.0) -> Any:
        """An ``openai.AsyncOpenAI`` bound to ``session`` (no retries: a refusal is final). It
        confirms each reply's delivery as the program reads it (:mod:`ludic_lab.endpoint.delivery`)."""
        import httpx
        import openai

        from ludic_lab.endpoint.delivery import DeliveryTransport

        # plain http: no TLS context to build (20-50 ms of CA loading per client); no proxy from the environment
        inner = httpx.AsyncHTTPTransport(verify=False, limits=_limits(), trust_env=False)
        http = openai.DefaultAsyncHttpxClient(
            transport=DeliveryTransport(inner, session.mark_delivered), timeout=timeout_s, trust_env=False
        )
        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key=session.key, max_retries=0, timeout=timeout_s, http_client=http
        )

    def sync_client(self, session: Session, *, timeout_s: float = 600.0) -> Any:
        """An ``openai.OpenAI`` (blocking) bound to ``session``, confirming delivery as :meth:`client` does."""
        import httpx
        import openai

        from ludic_lab.endpoint.delivery import SyncDeliveryTransport

        inner = httpx.HTTPTransport(verify=False, limits=_limits(), trust_env=False)
        http = openai.DefaultHttpxClient(
            transport=SyncDeliveryTransport(inner, session.mark_delivered), timeout=timeout_s, trust_env=False
        )
        return openai.OpenAI(
            base_url=self.base_url, api_key=session.key, max_retries=0, timeout=timeout_s, http_client=http
        )

    def __repr__(self) -> str:
        state = f"serving {self.base_url}" if self.running else "stopped"
        name = type(self.backend).__name__
        return f"OpenAIEndpoint({name}, models={self.model_names}, {state}, sessions={len(self.store)})"


def _limits() -> Any:
    """The ``openai`` SDK's own connection limits (what its default HTTP client uses)."""
    import httpx

    return httpx.Limits(max_connections=1000, max_keepalive_connections=100)
