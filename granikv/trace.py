"""Named ranges around the engine's phases (schedule, plan, dispatch, forward, sample).

Each range is a `torch.profiler.record_function` (visible in torch.profiler traces, which is
what granikv/profiling.py reads) and, on CUDA hosts, an NVTX range (visible in Nsight tools).
Both cost well under a microsecond when no profiler is attached.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def span(name: str):
    nvtx = torch.cuda.is_available()
    if nvtx:
        torch.cuda.nvtx.range_push(name)
    try:
        with torch.profiler.record_function(f"granikv::{name}"):
            yield
    finally:
        if nvtx:
            torch.cuda.nvtx.range_pop()
