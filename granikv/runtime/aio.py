"""One way to run an asyncio program: on uvloop when it is installed, else the stdlib loop.

Why: at B=256 the server streams ~20K chunks/s and the harness client parses as many; both are
one Python event loop each, and uvloop's transports and scheduling cost a fraction of the
stdlib's per event (SGLang's server and bench_serving use it for the same reason). It stays
optional: the engine needs no extra package, and `GRANIKV_UVLOOP=0` keeps the stdlib loop
(to compare the two, or to rule uvloop out when debugging).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def uvloop_enabled() -> bool:
    """Whether `run` uses uvloop: installed and not switched off by GRANIKV_UVLOOP=0."""
    if os.environ.get("GRANIKV_UVLOOP", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def event_loop_name() -> str:
    """'uvloop' or 'asyncio': recorded in result files beside the numbers it affects."""
    return "uvloop" if uvloop_enabled() else "asyncio"


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on uvloop's loop where `uvloop_enabled()`, else on the stdlib's."""
    if uvloop_enabled():
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)
