"""What every route of the server shares: the engine it serves from, the model it names, the
request checks (validation.py), its metrics, and its life — the engine's failure and a graceful
shutdown.

The SGLang-native routes (app.Server, which extends this) and the OpenAI routes (openai_api.py,
which hold one) both work on a ServerState, so neither route module needs the other. A failure of
the engine is the server's failure: logged once with its traceback, then every request is a 503
(errors.py) and /health turns 503 (`python -m granikv.server` then exits non-zero, for its
supervisor to restart it). A shutdown refuses new work while the requests in flight finish
(`drain`), then ends those still running (`cut`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from granikv.runtime.loop import EngineLoop  # torch-free: the server process never imports torch
from granikv.server.errors import (
    ENGINE_FAILURE,
    SHUTDOWN,
    ApiError,
    EngineUnavailable,
    ShuttingDown,
    event_error,
)
from granikv.server.metrics import Metrics
from granikv.server.text import TextCodec
from granikv.server.validation import RequestValidator

log = logging.getLogger("granikv.server")


class ServerState:
    """The engine handle, the names served, the checks, the metrics, and the server's life."""

    def __init__(self, loop: EngineLoop, codec: TextCodec, served_model_name: str | None = None,
                 model_path: str | None = None, context_length: int | None = None,
                 max_request_bytes_: int | None = None) -> None:
        self.loop = loop  # EngineLoop (engine thread) or EngineProcess (engine process): one interface
        self.codec = codec
        info = loop.info
        self.checks = RequestValidator(codec, info, context_length, max_request_bytes_)
        self.model = info["model"]
        self.served_name = served_model_name or self.model
        self.model_path = model_path
        self.model_names = {n for n in (self.served_name, model_path) if n}
        self.logprobs_supported = bool(info.get("logprobs"))
        self.metrics = Metrics()
        self.started = time.time()
        self.chunks_sent = 0  # streamed events written, for /server_info's "server" section
        self._failure_logged = False
        # a shutdown in progress: new work is refused (503) while in-flight requests finish
        self.draining = False
        self.inflight = 0  # generation handlers running (a shutdown waits for them)
        self._idle = asyncio.Event()
        self._idle.set()

    # -- the engine's failure ---------------------------------------------------------------------
    def engine_error_seen(self) -> None:
        """Log the engine's traceback once, the first time a handler meets its failure."""
        fatal = getattr(self.loop, "fatal", None)
        if fatal and not self._failure_logged:
            self._failure_logged = True
            log.error("the engine failed; requests are answered 503 from now on:\n%s", fatal)

    def check_alive(self) -> None:
        """Refuse new work once the engine failed, or while the server shuts down (503)."""
        if getattr(self.loop, "fatal", None):
            self.engine_error_seen()
            raise EngineUnavailable()
        if self.draining:
            raise ShuttingDown()

    def event_failure(self, error: str) -> ApiError:
        """The answer to an engine Event's error (errors.event_error), logging an engine failure."""
        if error == ENGINE_FAILURE or getattr(self.loop, "fatal", None):
            self.engine_error_seen()
            return EngineUnavailable()
        return event_error(error)

    # -- shutdown --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def tracked(self):
        """Count a generation handler as in flight for as long as it runs (`drain` waits on it)."""
        self.inflight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.inflight -= 1
            if self.inflight == 0:
                self._idle.set()

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new work and wait up to `timeout_s` for in-flight requests to finish; True when
        they all did. Those still running afterwards are `cut`."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    async def cut(self, wait_s: float = 5.0) -> None:
        """End every in-flight request now: each gets its API's error (a 503, or an error event
        and [DONE] on a stream that already started), and the engine frees its KV."""
        self.draining = True
        self.loop.fail_all(SHUTDOWN)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), wait_s)  # the handlers write their errors
