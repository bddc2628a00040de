"""What every route shares: the API key check and errors in JSON.

Authentication follows vLLM and SGLang: with `--api-key` (or GRANIKV_API_KEY) set, every route
but /health needs `Authorization: Bearer <key>` (the header the `openai` SDK, LiteLLM and SGLang's
bench_serving send), so a load balancer can probe liveness without the key. The comparison takes
the same time whatever the key, so its timing says nothing about the key.

Every answer is JSON, in the shape of the route's API (OpenAI's under /v1, SGLang's elsewhere):
aiohttp's own 404, 405 and 413 pages are plain text, which clients' JSON parsers choke on, and a
handler's unexpected exception (a bug) is a logged 500 with a JSON body, never a traceback page.
"""

from __future__ import annotations

import hmac
import logging

from aiohttp import web

from granikv.server.errors import ApiError, Unauthorized, native_response, openai_response

log = logging.getLogger("granikv.server")

OPEN_ROUTES = frozenset({"/health"})  # answered without the API key (liveness probes)


def error_response(request: web.Request, e: ApiError) -> web.Response:
    """`e` in the shape of the API the request's path belongs to."""
    return openai_response(e) if request.path.startswith("/v1/") else native_response(e)


def _authorized(request: web.Request, key: bytes) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key)


def middlewares(api_key: str | None) -> list:
    key = api_key.encode() if api_key else None

    @web.middleware
    async def guard(request: web.Request, handler):
        if key is not None and request.path not in OPEN_ROUTES and not _authorized(request, key):
            return error_response(request, Unauthorized())
        try:
            return await handler(request)
        except ApiError as e:  # raised past a handler's own error handling (e.g. by body.read_json)
            return error_response(request, e)
        except web.HTTPException as e:  # aiohttp's routing and body-size errors: the same, in JSON
            if e.status < 400:
                raise
            code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(e.status)
            message = {404: f"no route {request.path}",
                       405: f"{request.method} is not allowed on {request.path}"}.get(e.status, e.reason)
            return error_response(request, ApiError(message, e.status, code=code))
        except ConnectionError:  # the client went away mid-answer: nothing to answer
            raise
        except Exception:  # noqa: BLE001 - a bug in a handler: logged, answered, never a text page
            log.exception("unhandled error serving %s %s", request.method, request.path)
            return error_response(request, ApiError("internal server error; see the server log", 500,
                                                     code="internal_error"))

    return [guard]
