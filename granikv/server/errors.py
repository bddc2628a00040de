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

_TYPES = {400: "invalid_request_error", 404: "not_found_error", 409: "conflict_error",
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


def openai_body(e: ApiError) -> dict:
    return {"error": {"message": e.message, "type": e.type, "param": e.param, "code": e.code}}


def openai_response(e: ApiError) -> web.Response:
    return web.json_response(openai_body(e), status=e.status)


def native_body(e: ApiError) -> dict:
    return {"error": {"message": e.message}}


def native_response(e: ApiError) -> web.Response:
    return web.json_response(native_body(e), status=e.status)


def event_error(error: str) -> ApiError:
    """The ApiError for an engine Event's error: the engine's failure is the server's (503);
    anything else the engine refused at admission (ValueError) is the request's (400)."""
    if error == ENGINE_FAILURE:
        return EngineUnavailable()
    return BadRequest(error)
