"""The result's engine sections from the server's `/server_info`: `engine` (since server start)
and `engine_after_warmup` (the same scalar counters between warm-up and measured run).

Why a snapshot after the warm-up: the engine counts from its start, warm-up request included, so
the measured run's own steps are the difference of the two sections; keeping the raw sections
(not the difference) lets a reader check either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def warmup_counters(info: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar step counters of `engine_counters` (no step log, storage or graph detail)."""
    if "error" in info:
        return {"error": info["error"]}
    return {k: v for k, v in engine_counters(info).items() if isinstance(v, int | float) and not isinstance(v, bool)}


def engine_counters(info: Mapping[str, Any]) -> dict[str, Any]:
    """The result's "engine" section from /server_info: attention step counters at top level
    (decode_steps, dense_steps, cascade_steps, paged_steps, ...), retractions, HOT admits and
    fallbacks, and the storage report."""
    out: dict[str, Any] = {}
    attn = info.get("attention") or {}
    if isinstance(attn, Mapping):
        out.update({k: v for k, v in attn.items() if not isinstance(v, Mapping | list)})
        for key in ("class_decisions", "class_sizes"):  # granikv's dispatcher: how steps split into classes
            if isinstance(attn.get(key), Mapping):
                out[key] = attn[key]
    for key in ("retractions", "hot_admits", "hot_fallbacks", "hot_slab_tokens", "decode_steps", "prefill_steps"):
        if key in info and not isinstance(info[key], Mapping):
            out[key] = info[key]
    for key, suffix in (("steps", "_steps"), ("step_time_s", "_time_s")):
        if isinstance(info.get(key), Mapping):  # {"extend": n, "decode": n} -> extend_steps, ...
            for phase, value in info[key].items():
                out.setdefault(f"{phase}{suffix}", value)
    if isinstance(info.get("step_log"), Mapping):  # per-phase step times (which phase cost the time)
        out["step_log"] = info["step_log"]
    if isinstance(info.get("graphs"), Mapping):  # captures at start vs during the run
        out["graphs"] = info["graphs"]
    if isinstance(info.get("startup"), Mapping):  # where the server's start-up went (engine build, captures)
        out["startup"] = info["startup"]
    if isinstance(info.get("server"), Mapping):  # the HTTP process: CPU seconds, chunks streamed
        out.update({f"server_{k}": v for k, v in info["server"].items()})
    if isinstance(info.get("loop"), Mapping):  # the engine process's loop clock (granikv.runtime.process)
        out.update({f"loop_{k}": v for k, v in info["loop"].items()})
    for key in ("running", "waiting"):
        if key in info:
            out[f"{key}_at_end"] = info[key]
    if isinstance(info.get("storage"), Mapping):
        out["storage"] = info["storage"]
        for key in ("hot_slab_tokens", "hot_admits", "hot_fallbacks"):
            if key in info["storage"] and key not in out:
                out[key] = info["storage"][key]
    out.setdefault("decode_steps", 0)
    return out
