"""One cell end to end: `python -m harness.run.cell <Hydra overrides>` -> one result file.

    python -m harness.run.cell system=granikv model=llama-3.1-8b tp=1 workload=sharegpt lp=16384 batch=256

Steps: generate (or reuse) the workload file; start the system (harness.run.systems); warm up and
flush the cache (the client does both when the config says so); run the streaming client;
with profile=true, capture N steady decode steps beside the client (harness.run.profile: POST
/profile once /server_info shows steady decode; a failed capture is recorded, never fatal);
fetch /server_info for the engine counters (`engine`: since server start; `engine_after_warmup`:
the same scalar counters between warm-up and measured run, so the run's own steps are the
difference); stop the system (always, even when a step fails);
write `results/<hardware>/<sweep>/<cell-id>.json` atomically (DESIGN §7) and print a one-line
summary. An existing result is never replaced unless `overwrite=true`: a result is a
measurement, and re-running a cell silently would hide that the number changed.

Hydra's run directory is pinned next to the result (`<cell-id>.run/`): the resolved config and
overrides (`hydra/`), the server log, the client's per-request records and the raw
/server_info all live there, so every number in the result file can be traced back.

Exit codes: 0 written (or skipped: the system is not installed here, with a message);
3 the result exists and overwrite=false; 1 the cell failed (message on stderr).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig

from granikv.server import aio
from harness.run import systems
from harness.run.config import (
    CellError,
    effective_m_sat,
    engine_args,
    identity,
    max_context_for,
    plain,
    result_path,
    workload_config,
)
from harness.run.env import check_gpu_model, check_gpus_idle, environment
from harness.run.sweeps import ROOT, cell_id

if TYPE_CHECKING:
    from harness.run.client.benchmark import ClientConfig

EXIT_EXISTS = 3
PROFILE_STEPS = 20  # decode steps in a profile=true cell's capture window (harness.run.profile)


# --------------------------------------------------------------------------- engine counters


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
    if isinstance(info.get("loop"), Mapping):  # the engine process's loop clock (granikv.server.proc)
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


# --------------------------------------------------------------------------- the cell


def write_json_atomic(path: Path, doc: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def summary(doc: Mapping[str, Any], path: Path | str) -> str:
    c, m = doc["config"], doc["metrics"]
    return (f"cell {c['cell_id']}: {m['output_throughput']:.1f} out tok/s, TTFT p50 {m['median_ttft_ms']:.1f} ms, "
            f"TPOT p50 {m['median_tpot_ms']:.2f} ms, {m['completed']}/{m['completed'] + m['failed']} ok, "
            f"{m['duration_s']:.1f} s -> {path}")


def launch_spec(cfg: DictConfig, run_dir: Path, max_context: int) -> systems.LaunchSpec:
    host = cfg.server.host
    port = int(cfg.server.port or systems.free_port(host))
    common = dict(host=host, port=port, log_path=run_dir / "server.log",
                  ready_timeout_s=float(cfg.server.ready_timeout_s), stop_grace_s=float(cfg.server.stop_grace_s),
                  cwd=str(ROOT), env={str(k): str(v) for k, v in (plain(cfg.hardware.get("env")) or {}).items()})
    if cfg.system.kind == "engine":
        argv = systems.engine_command(engine_args(cfg, max_context), host, port, module=cfg.server.module)
        if cfg.server.get("incremental_streaming_output"):
            argv.append("--incremental-streaming-output")
        return systems.LaunchSpec(name=cfg.system.name, argv=tuple(argv), **common)
    if cfg.system.kind == "external":
        systems.require_module(cfg.system.name, cfg.system.module)
        from granikv.model.spec import load_spec

        model_dir = run_dir / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "config.json").write_text(json.dumps(load_spec(cfg.model.name).to_hf_config(), indent=1))
        values = dict(python=sys.executable, model_path=str(model_dir), tp=cfg.tp, host=host, port=port,
                      page_size=cfg.page_size, max_running=int(cfg.server.max_running or cfg.batch),
                      max_context=max_context, hot_fraction=cfg.hot_fraction, batch=cfg.batch,
                      **(plain(cfg.system.get("extra_values")) or {}))
        argv = systems.external_command(cfg.system.command, values)
        return systems.LaunchSpec(name=cfg.system.name, argv=tuple(argv),
                                  health_path=cfg.system.get("health_path", "/health"), **common)
    raise CellError(f"system kind must be engine or external, got {cfg.system.kind!r}")


def _progress(info: Mapping[str, Any]) -> tuple[str, int]:
    """(a fingerprint of the engine's step counters, requests it holds) from /server_info."""
    attn = info.get("attention") if isinstance(info.get("attention"), Mapping) else {}
    steps = json.dumps([info.get("steps"), attn.get("decode_steps")], sort_keys=True, default=str)
    held = int(info.get("running") or 0) + int(info.get("waiting") or 0)
    return steps, held


async def guarded(system: systems.RunningSystem, benchmark, info_path: str | None, stall_s: float):
    """Run the client, but give up when the server dies or (engine systems) holds requests and
    makes no step progress for `stall_s` seconds: a crashed engine thread behind a live HTTP
    listener would otherwise keep the cell waiting for the client's per-request timeout."""
    task = asyncio.ensure_future(benchmark)
    last, since = None, time.monotonic()
    poll = max(0.5, min(10.0, stall_s / 4))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll)
            if done:
                return task.result()
            code = system.proc.poll() if system.proc else None
            if code is not None:
                raise CellError(f"the server exited with code {code} during the run; log {system.spec.log_path}:\n"
                                f"{systems.log_tail(system.spec.log_path)}")
            if info_path is None:
                continue
            try:
                info = await asyncio.to_thread(systems.get_json, system.base_url, info_path, 10.0)
            except Exception:  # noqa: BLE001 - a busy server may answer late; death is caught above
                continue
            steps, held = _progress(info)
            now = time.monotonic()
            if steps != last or held == 0:
                last, since = steps, now
            elif now - since > stall_s:
                raise CellError(f"the engine holds {held} requests but made no step for {stall_s:.0f} s; "
                                f"log {system.spec.log_path}:\n{systems.log_tail(system.spec.log_path)}")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def client_config(cfg: DictConfig) -> ClientConfig:
    """The client's settings from the cell config: every `client.*` key the client reads, so the
    result file's `config.client` (the client's own `to_dict`) records what it did."""
    from harness.run.client.benchmark import ClientConfig

    return ClientConfig(
        rate=float(str(cfg.rate)), max_concurrency=int(cfg.batch), warmup_requests=int(cfg.warmup),
        warmup_output_len=int(cfg.client.warmup_output_len), flush_cache=bool(cfg.flush_cache),
        # the hint is a GraniKV API field: sent to the bundled engine (paged/cascade ignore it),
        # never to an external server that may reject unknown fields
        send_prefix_hint=bool(cfg.client.send_prefix_hint) and cfg.system.kind == "engine",
        request_timeout_s=float(cfg.client.request_timeout_s),
        progress=bool(cfg.client.progress),
        api=str(cfg.client.get("api", "generate")), model=cfg.client.get("model"))


def run_cell(cfg: DictConfig, run_dir: Path, stopped: threading.Event | None = None) -> tuple[dict[str, Any], Path]:
    """Measure the cell; return the result document and where it was written. Once `stopped` is
    set (SIGTERM), no result is written: the run was cut short."""
    from harness.run.client.benchmark import run_benchmark
    from harness.run.workloads.requests import read_workload
    from harness.run.workloads.store import check_header, ensure_workload

    started_at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = result_path(cfg)
    if out.exists() and not cfg.overwrite:
        raise FileExistsError(out)
    if cfg.system.kind == "external":  # before any work: skip cleanly where it is not installed
        systems.require_module(cfg.system.name, cfg.system.module)
    check_gpu_model(cfg)  # before any work: a cell on the wrong card would land in another card's tables
    run_dir.mkdir(parents=True, exist_ok=True)

    wcfg = workload_config(cfg)
    wpath = ensure_workload(wcfg, Path(cfg.workloads_dir))
    workload = read_workload(wpath)
    check_header(workload.header, wcfg, wpath)
    requests = workload.requests
    max_context = max_context_for(cfg, requests)
    spec = launch_spec(cfg, run_dir, max_context)
    client_cfg = client_config(cfg)

    gpu_at_start = check_gpus_idle(cfg)
    t0 = time.monotonic()
    info_path = cfg.system.get("server_info_path", "/server_info")
    with systems.launch(spec) as system:
        ready_s = system.ready_after_s
        watch = info_path if cfg.system.kind == "engine" else None
        warmed: dict[str, Any] = {}

        async def snapshot() -> None:  # the counters after the warm-up, before the measured run
            try:
                warmed.update(await asyncio.to_thread(systems.get_json, system.base_url, info_path, 10.0))
            except Exception as e:  # noqa: BLE001 - recorded, never fatal
                warmed["error"] = f"{type(e).__name__}: {e}"

        benchmark = run_benchmark(system.base_url, requests, client_cfg,
                                  on_warmed=snapshot if cfg.system.kind == "engine" else None)
        profile: dict[str, Any] = {}
        if cfg.profile and cfg.system.kind == "engine":  # Tables 13/14/22: a capture of steady decode
            from harness.run.profile import SteadyPolicy, alongside

            policy = SteadyPolicy.for_batch(int(cfg.batch), int(cfg.num_prompts), steps=PROFILE_STEPS)
            benchmark = alongside(benchmark, system.base_url, policy, profile)
        result = aio.run(guarded(system, benchmark, watch, float(cfg.server.stall_timeout_s)))
        try:
            info = systems.get_json(system.base_url, info_path)
        except Exception as e:  # noqa: BLE001 - an external system may not report counters
            if cfg.system.kind == "engine":
                raise CellError(f"GET {info_path} failed: {e}") from e
            info = {"error": f"{type(e).__name__}: {e}"}
    wall_s = time.monotonic() - t0
    (run_dir / "server_info.json").write_text(json.dumps(info, indent=1, sort_keys=True, default=str) + "\n")
    (run_dir / "client.json").write_text(json.dumps(result.to_dict(with_records=True), default=str) + "\n")

    if result.metrics.get("completed", 0) == 0:
        raise CellError(f"no request completed; errors: {result.errors()} (server log {spec.log_path})")

    ident = identity(cfg)
    config = {
        **ident, "m_sat": effective_m_sat(cfg) if cfg.system.kind == "engine" else cfg.m_sat,
        "num_prompts": int(cfg.num_prompts), "output_len": int(cfg.output_len),
        "warmup": int(cfg.warmup), "flush_cache": bool(cfg.flush_cache), "sweep": cfg.sweep.name,
        "hardware": cfg.hardware.name, "cell_id": cell_id(ident), "profile": bool(cfg.profile),
        "stands_for": plain(cfg.stands_for),
        "engine_args": engine_args(cfg, max_context) if cfg.system.kind == "engine" else None,
        "workload_config": asdict(wcfg), "workload_file": str(wpath),
        "workload_prefix_lengths": workload.header.get("prefix_lengths"),
        "client": client_cfg.to_dict(), "max_context": max_context,
        "overrides": _task_overrides(),
    }
    doc = {
        "config": config,
        "metrics": result.metrics,
        "engine": engine_counters(info) if cfg.system.kind == "engine" else {"decode_steps": 0, "reported": False},
        # the same counters after the warm-up: the measured run's own steps are the difference
        # (engine.* counts from server start, warm-up request included)
        **({"engine_after_warmup": warmup_counters(warmed)} if cfg.system.kind == "engine" else {}),
        "env": environment(started_at, gpu_at_start),
        "run": {"dir": str(run_dir), "server_log": str(spec.log_path), "argv": list(spec.argv),
                "ready_s": ready_s, "wall_s": wall_s, "errors": result.errors(),
                "flush_status": result.flush_status, "max_in_flight": result.max_in_flight,
                "client_cpu_s": result.client_cpu_s},
    }
    if cfg.profile:
        doc["profile"] = profile if cfg.system.kind == "engine" else {
            "error": "the profiler capture needs the bundled engine's POST /profile"}
    if out.exists() and not cfg.overwrite:  # a parallel run won the race: still never overwrite
        raise FileExistsError(out)
    if stopped is not None and stopped.is_set():
        raise SystemExit(128 + signal.SIGTERM)
    write_json_atomic(out, doc)
    return doc, out


def _task_overrides() -> list[str]:
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except Exception:  # noqa: BLE001 - not under @hydra.main (tests)
        return []


def _run_dir() -> Path:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir)


def _terminator(stopped: threading.Event) -> Callable[[int, Any], None]:
    """The SIGTERM handler. SIGTERM (Snakemake, harness.run.batch's deadline, a user stopping the
    job) must unwind through launch()'s finally, so the server is stopped too; Python's default
    would exit without running it. The SystemExit alone is not enough: raised inside aiohttp's
    protocol callback (which catches BaseException) it becomes one failed request and the run
    goes on, so the event also tells run_cell not to write a result."""
    def terminate(signum: int, _frame: Any) -> None:
        stopped.set()
        raise SystemExit(128 + signum)
    return terminate


@hydra.main(config_path="../../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, _terminator(stopped))
    try:
        doc, out = run_cell(cfg, _run_dir(), stopped=stopped)
    except FileExistsError as e:
        print(f"result {e.args[0]} exists; not overwriting it (pass overwrite=true to measure again)", file=sys.stderr)
        sys.exit(EXIT_EXISTS)
    except systems.SystemUnavailable as e:
        print(f"skipped: {e}")
        sys.exit(0)
    except (CellError, systems.SystemStartError, ValueError) as e:
        print(f"cell failed: {e}", file=sys.stderr)
        sys.exit(1)
    print(summary(doc, out))


if __name__ == "__main__":
    main()
