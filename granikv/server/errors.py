"""Errors a handler answers with, in the shape each API's clients parse.

A client's mistake is a 4xx naming the field it sent; a server-side failure (the engine died)
is a 5xx, never a 4xx, so clients and load balancers retry or alert instead of blaming the
request. The OpenAI routes answer `{"error": {"message", "type", "param", "code"}}` (what the
`openai` SDK turns into `BadRequestError`, `NotFoundError`, `InternalServerError`, ...); the
SGLang-native routes answer `{"error": {"message"}}` as SGLang's server does.
"""

from __future__ import annotations

from aiohttp import web

ENGINE_FAILURE = "engine failure"  # the Event error the engine loops send when the engine died
SHUTDOWN = "server shutting down"  # the Event error of requests cut by a shutdown's deadline
# how the scheduler's message starts when it ends a lone request the KV cache cannot grow
# (Scheduler.fail): the server's state, not the request's fault, so a 503 a client may retry
KV_EXHAUSTED = "the KV cache cannot hold"

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 409: "conflict_error", 413: "invalid_request_error",
          500: "server_error", 501: "not_implemented_error", 503: "service_unavailable"}


class ApiError(Exception):
    """An answer other than 200: status, message, and (OpenAI) the offending parameter."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")


class BadRequest(ApiError):
    """A malformed or unsupported request: 400, naming the client's field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, 400, param)


class EngineUnavailable(ApiError):
    """The engine failed (its traceback is in the server log): 503."""

    def __init__(self, message: str = "the engine failed; see the server log") -> None:
        super().__init__(message, 503, code="engine_failure")


class Unauthorized(ApiError):
    """A missing or wrong API key (`--api-key`): 401, as OpenAI, vLLM and SGLang answer it."""

    def __init__(self) -> None:
        super().__init__("invalid or missing API key: send the header `Authorization: Bearer <key>`", 401,
                         code="invalid_api_key")


class ShuttingDown(ApiError):
    """The server is draining for a shutdown: no new work (503, so load balancers go elsewhere)."""

    def __init__(self) -> None:
        super().__init__("the server is shutting down", 503, code="shutting_down")


def openai_body(e: ApiError) -> dict:
    return {"error": {"message": e.message, "type": e.type, "param": e.param, "code": e.code}}


def openai_response(e: ApiError) -> web.Response:
    return web.json_response(openai_body(e), status=e.status)


def native_body(e: ApiError) -> dict:
    return {"error": {"message": e.message}}


def native_response(e: ApiError) -> web.Response:
    return web.json_response(native_body(e), status=e.status)


def event_error(error: str) -> ApiError:
    """The ApiError for an engine Event's error: the engine's failure, a shutdown and a KV cache
    that cannot hold a lone request are the server's (503); anything else the engine refused at
    admission (ValueError) is the request's (400)."""
    if error == ENGINE_FAILURE:
        return EngineUnavailable()
    if error == SHUTDOWN:
        return ShuttingDown()
    if error.startswith(KV_EXHAUSTED):
        return ApiError(error, 503, code="kv_cache_exhausted")
    return BadRequest(error)
