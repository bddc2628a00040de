"""Timing and environment helpers for the microbenchmarks.

On a GPU every timed function is captured once in a CUDA graph and its replays are timed with
`triton.testing.do_bench` (device events, median), which also overwrites a 256 MB buffer
before each replay so no run starts with a warm L2 from the previous one. Graphs remove the
launch gaps between the two stages of a split kernel, which would otherwise inflate small
cases. On a CPU host (smoke runs under the Triton interpreter) a wall-clock median stands in:
those numbers only prove the script runs, and nothing is written as a measurement from them.
"""

from __future__ import annotations

import platform
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.run.provenance import git_sha


@dataclass(frozen=True)
class Timing:
    us: float  # median of one launch, microseconds
    p20_us: float
    p80_us: float
    graphed: bool


def bench(fn: Callable[[], object], rep_ms: int = 100, warmup_ms: int = 25, graph: bool = True) -> Timing:
    """Median time of fn() (one launch); fn must be graph-capturable on a GPU (or graph=False)."""
    fn()  # compile / load / first-touch outside the measurement
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        fn()
        us = (time.perf_counter() - t0) * 1e6
        return Timing(us, us, us, False)
    import triton.testing

    torch.cuda.synchronize()
    target = fn
    graphed = False
    try:
        if not graph:
            raise RuntimeError("eager timing asked for")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        target = graph.replay
        graphed = True
    except Exception as exc:  # pragma: no cover - depends on the op
        if graph:
            print(f"  (graph capture failed, timing eager launches: {type(exc).__name__}: {exc})")
        torch.cuda.synchronize()
    q = triton.testing.do_bench(target, warmup=warmup_ms, rep=rep_ms, quantiles=[0.2, 0.5, 0.8])
    p20, med, p80 = (x * 1e3 for x in q)
    return Timing(med, p20, p80, graphed)


def write_result(out: str | Path, config: dict, records: list[dict], env: dict | None = None, **extra) -> Path:
    """Write a microbenchmark's result file: {"env", "config", "records", **extra} (what
    harness.run.results loads; `env` defaults to `env_info()`); returns its path."""
    import json

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"env": env_info() if env is None else env, "config": config, "records": records, **extra}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")
    return path


def env_info() -> dict:
    info = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_sha": git_sha(None),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:  # pragma: no cover
        info["triton"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(
            gpu=p.name,
            gpu_count=torch.cuda.device_count(),
            sms=p.multi_processor_count,
            l2_mb=round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
            mem_gb=round(p.total_memory / 1e9, 1),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
        )
        try:
            out = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=driver_version,clocks.sm,clocks.mem,power.limit",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
                timeout=10,
            )
            info["nvidia_smi"] = out.stdout.strip()
        except Exception:  # pragma: no cover
            pass
    else:
        info.update(gpu="cpu", gpu_count=0)
    return info
