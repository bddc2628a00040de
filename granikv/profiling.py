"""Profiler capture of engine steps: where a step's time goes (Tables 13, 14, 22).

The paper splits a decode step into prefix attention, suffix/decode attention, linear GEMMs,
NCCL and the host gap (GPU idle while the host schedules). We capture N consecutive engine
steps with torch.profiler (CUDA activity), put every GPU kernel into one of those categories by
its name, and sum per category over the window. The result is the cell's "profile" section
(harness.report.tables.extract reads it): `<category>_ms`, `total_kernel_ms` (sum of all kernel
durations), `decode_wall_ms` (host wall time of the window) and `host_gap_ms` (wall time with no
kernel running = wall - union of kernel intervals; kernels on parallel streams overlap, so the
union, not the sum, is what keeps the GPU busy).

`categorize` and `summarize` work on plain (name, start_us, end_us) tuples so they are testable
without a GPU; `capture` is the only part that needs torch.profiler. The server's
`POST /profile` (granikv.server.app) runs `capture` on its engine thread between steps; the
harness asks for it (harness.run.profile) and reads the categories from here.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

CATEGORIES = ("prefix_attention", "decode_attention", "linear_gemm", "nccl", "other")


@dataclass(frozen=True)
class Rule:
    """A kernel whose name matches `pattern` (case-insensitive search) is in `category`."""

    category: str
    pattern: re.Pattern


# First match wins, so the specific attention kernels come before the generic GEMM patterns
# (a Triton kernel's name never contains "gemm", but torch.matmul's cuBLAS kernels do).
RULES: tuple[Rule, ...] = tuple(Rule(c, re.compile(p, re.IGNORECASE)) for c, p in (
    ("nccl", r"nccl"),
    # granikv/kernels/prefix_cascade.py (cascade and dense prefix pass) and the combine of its
    # split-K partials (splits.py `_combine_prefix_kernel`): the shared-prefix work
    ("prefix_attention", r"_prefix_kernel|combine_prefix"),
    # per-request KV: decode_paged.py `_decode_kernel`, splits.py `_fold`/`_combine_decode_kernel`,
    # merge.py `_merge_kernel` (prefix + suffix states), and torch's SDPA decode kernels
    ("decode_attention", r"_decode_kernel|_fold|combine|_merge_kernel|flash|fmha|attention"),
    # cuBLAS / cuBLASLt / CUTLASS GEMMs (Hopper's cuBLASLt ships `nvjet_*` kernels)
    ("linear_gemm", r"gemm|gemv|cutlass|cublas|nvjet"),
))


def categorize(kernel_name: str) -> str:
    """The step category of a GPU kernel, from its name ("other" when no rule matches)."""
    for rule in RULES:
        if rule.pattern.search(kernel_name):
            return rule.category
    return "other"


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (overlapping kernels counted once)."""
    ivs = sorted((s, e) for s, e in intervals if e > s)
    if not ivs:
        return 0.0
    total, cur_s, cur_e = 0.0, ivs[0][0], ivs[0][1]
    for s, e in ivs[1:]:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s)


def summarize(events: Iterable[tuple[str, float, float]], steps: int, wall_ms: float | None = None) -> dict:
    """The profile section from kernel events (name, start_us, end_us) of a window of `steps`.

    `wall_ms` is the host-measured window; without it the window is the span from the first
    kernel's start to the last kernel's end (which misses host time before the first and after
    the last kernel, so it understates the host gap). The wall is never shorter than the span.
    """
    events = [(n, float(s), float(e)) for n, s, e in events]
    per_cat = dict.fromkeys(CATEGORIES, 0.0)
    counts = dict.fromkeys(CATEGORIES, 0)
    for name, s, e in events:
        c = categorize(name)
        per_cat[c] += max(0.0, e - s)
        counts[c] += 1
    busy_ms = union_us((s, e) for _, s, e in events) / 1e3
    span_ms = (max(e for _, _, e in events) - min(s for _, s, _ in events)) / 1e3 if events else 0.0
    wall = max(span_ms, wall_ms if wall_ms is not None else 0.0)
    out = {f"{c}_ms": per_cat[c] / 1e3 for c in CATEGORIES}
    out.update(
        total_kernel_ms=sum(per_cat.values()) / 1e3, gpu_busy_ms=busy_ms, kernel_span_ms=span_ms,
        decode_wall_ms=wall, host_gap_ms=max(0.0, wall - busy_ms), steps=int(steps),
        step_ms=wall / steps if steps else 0.0, kernels=len(events),
        kernel_counts={c: n for c, n in counts.items() if n},
        wall_source="host" if wall_ms is not None else "kernel_span",
    )
    return out


def top_kernels(events: Iterable[tuple[str, float, float]], steps: int, n: int = 24) -> list[dict]:
    """The `n` kernels with the most GPU time in a window of `steps`: name, category, launches
    and ms per step, and mean µs per launch. Which kernel a step's excess over its floor is in."""
    per: dict[str, list[float]] = {}
    for name, s, e in events:
        acc = per.setdefault(name, [0, 0.0])
        acc[0] += 1
        acc[1] += max(0.0, float(e) - float(s))
    steps = max(1, int(steps))
    rows = sorted(per.items(), key=lambda kv: -kv[1][1])[:n]
    return [{"name": name[:160], "category": categorize(name), "launches_per_step": cnt / steps,
             "ms_per_step": us / 1e3 / steps, "us_per_launch": us / cnt} for name, (cnt, us) in rows]


def kernel_events(prof) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of every GPU activity (kernels, memcpy, memset) in a finished
    torch.profiler session.

    `record_function` ranges (granikv.trace's `granikv::*` step phases) are mirrored on the GPU
    timeline as user annotations spanning many kernels; they are not kernels and would count
    the phase's time twice, so they are dropped (by flag where torch has it, else by name)."""
    import torch

    out = []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA or e.time_range.elapsed_us() <= 0:
            continue
        if getattr(e, "is_user_annotation", False) or is_annotation(e.name):
            continue
        out.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    return out


def host_phase_ms(prof) -> dict[str, float]:
    """Host time per engine phase (granikv.trace spans: schedule, plan, dispatch, forward,
    sample), summed over the window; inclusive of nested spans. Where the host gap goes."""
    import torch

    out: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("granikv::"):
            key = e.name.removeprefix("granikv::")
            out[key] = out.get(key, 0.0) + e.time_range.elapsed_us() / 1e3
    return out


def is_annotation(name: str) -> bool:
    """A profiler range name (ours, or the profiler's step marker), not a GPU activity."""
    return name.startswith(("granikv::", "ProfilerStep"))


def capture(step_fn: Callable[[], object], steps: int) -> dict:
    """Profile `steps` calls of `step_fn` (one engine step each) and summarize them.

    The device is synchronized before the window (so earlier queued work is not counted) and
    after it (so every kernel the steps launched is in it); the wall is measured in between.
    `step_fn` may return False to say there was nothing to step: the window then ends early
    and `steps` in the result says how many steps ran. On a host without CUDA the window has
    no kernels: the result has the wall time and zero kernel time, with `device: "cpu"`.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    ran = 0
    sync()
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            if step_fn() is False:
                break
            ran += 1
        sync()
        wall_ms = (time.perf_counter() - t0) * 1e3
    out = summarize(kernel_events(prof) if cuda else [], ran, wall_ms)
    out["host_phase_ms"] = host_phase_ms(prof)
    out["device"] = "cuda" if cuda else "cpu"
    out["requested_steps"] = int(steps)
    return out
