"""OpenAI's error object for every answer of the endpoint that is not a completion.

:class:`EndpointError` is a refusal with its status, ``param`` and ``code``; :func:`install_handlers`
makes the app answer it, Starlette's own 404 / 405, and anything unexpected in OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``) instead of ``{"detail": ...}``. A client
that hung up while sending its request gets nothing (there is no one to answer): one log line.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("ludic_lab.endpoint")

_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error", 429: "rate_limit_error"}


def error_body(
    message: str, *, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_type(status: int) -> str:
    """OpenAI's ``type`` for an HTTP status (``invalid_request_error`` for a 4xx, ``server_error`` for a 5xx)."""
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    close: bool = False,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """A JSON response holding OpenAI's error object; ``close`` ends the connection after it."""
    hdrs = dict(headers or {})
    if close:
        hdrs["Connection"] = "close"
    body = error_body(message, type_=error_type(status), param=param, code=code)
    return JSONResponse(body, status_code=status, headers=hdrs or None)


class EndpointError(Exception):
    """A request the endpoint refuses: HTTP ``status``, OpenAI ``param`` and ``code``;
    ``close`` closes the connection after the answer (a body left unread on it)."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None, close: bool = False
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.close = status, param, code, close


class ClientGone(Exception):
    """The client hung up before its request was read whole: nothing to answer."""


def install_handlers(app: FastAPI) -> None:
    """Answer :class:`EndpointError`, a hung-up client, Starlette's 404 / 405 and any unexpected
    exception in OpenAI's error shape (the last still logged with its traceback: a bug)."""

    @app.exception_handler(EndpointError)
    async def _on_endpoint_error(request: Request, exc: EndpointError) -> JSONResponse:
        return error_response(exc.status, str(exc), param=exc.param, code=exc.code, close=exc.close)

    @app.exception_handler(ClientGone)
    async def _on_client_gone(request: Request, exc: ClientGone) -> Response:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return Response(status_code=400, headers={"Connection": "close"})  # written to no one

    @app.exception_handler(StarletteHTTPException)
    async def _on_http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no route {request.url.path!r} here (this endpoint serves /v1/chat/completions, /v1/models)"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path!r}"
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, message, headers=dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"the endpoint failed: {type(exc).__name__}", code="internal_error")
