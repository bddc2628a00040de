"""One cell end to end: `python -m harness.run.cell <Hydra overrides>` -> one result file.

    python -m harness.run.cell system=granikv model=llama-3.1-8b tp=1 workload=sharegpt lp=16384 batch=256

Steps: parse the config once into a typed Cell (harness.run.config: a bad key fails here, before
any work); generate (or reuse) the workload file; start the system (harness.run.systems); warm
up and flush the cache (the client does both when the config says so); run the streaming
client; with profile=true, capture N steady decode steps beside the client (harness.run.profile:
POST /profile once /server_info shows steady decode; a failed capture is recorded, never fatal);
fetch /server_info for the engine counters (harness.run.counters); stop the system (always, even
when a step fails); write `results/<hardware>/<sweep>/<cell-id>.json` atomically (docs/design.md,
"Result files") and print a one-line summary. An existing result is never replaced unless
`overwrite=true`: a result is a measurement, and re-running a cell silently would hide that the
number changed.

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
from typing import Any

import hydra
from omegaconf import DictConfig

from granikv.runtime import aio
from harness.run import systems
from harness.run.client.benchmark import ClientConfig, run_benchmark
from harness.run.config import Cell, CellError
from harness.run.counters import engine_counters, warmup_counters
from harness.run.env import check_gpu_model, check_gpus_idle, environment
from harness.run.launch import effective_m_sat, engine_args, launch_spec, max_context_for
from harness.run.workloads.requests import read_workload
from harness.run.workloads.store import check_header, ensure_workload

EXIT_EXISTS = 3
PROFILE_STEPS = 20  # decode steps in a profile=true cell's capture window (harness.run.profile)


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


def client_config(cell: Cell) -> ClientConfig:
    """The client's settings from the cell: every `client.*` key the client reads, so the result
    file's `config.client` (the client's own `to_dict`) records what it did."""
    c = cell.client
    return ClientConfig(
        rate=float(cell.identity.rate), max_concurrency=cell.identity.batch, warmup_requests=cell.measure.warmup,
        warmup_output_len=c.warmup_output_len, flush_cache=cell.measure.flush_cache,
        # the hint is a GraniKV API field: sent to the bundled engine (paged/cascade ignore it),
        # never to an external server that may reject unknown fields
        send_prefix_hint=c.send_prefix_hint and cell.system.is_engine,
        request_timeout_s=c.request_timeout_s, progress=c.progress, api=c.api, model=c.model)


def run_cell(cell: Cell, run_dir: Path, stopped: threading.Event | None = None) -> tuple[dict[str, Any], Path]:
    """Measure the cell; return the result document and where it was written. Once `stopped` is
    set (SIGTERM), no result is written: the run was cut short."""
    started_at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    engine = cell.system.is_engine
    out = cell.result_path
    if out.exists() and not cell.measure.overwrite:
        raise FileExistsError(out)
    if not engine:  # before any work: skip cleanly where it is not installed
        systems.require_module(cell.system.name, cell.system.module)
    check_gpu_model(cell)  # before any work: a cell on the wrong card would land in another card's tables
    run_dir.mkdir(parents=True, exist_ok=True)

    wpath = ensure_workload(cell.workload, cell.paths.workloads_dir)
    workload = read_workload(wpath)
    try:
        check_header(workload.header, cell.workload, wpath)
    except ValueError as e:
        raise CellError(str(e)) from e
    requests = workload.requests
    max_context = max_context_for(cell, requests)
    spec = launch_spec(cell, run_dir, max_context)
    client_cfg = client_config(cell)

    gpu_at_start = check_gpus_idle(cell)
    t0 = time.monotonic()
    info_path = cell.system.server_info_path
    with systems.launch(spec) as system:
        ready_s = system.ready_after_s
        watch = info_path if engine else None
        warmed: dict[str, Any] = {}

        async def snapshot() -> None:  # the counters after the warm-up, before the measured run
            try:
                warmed.update(await asyncio.to_thread(systems.get_json, system.base_url, info_path, 10.0))
            except Exception as e:  # noqa: BLE001 - recorded, never fatal
                warmed["error"] = f"{type(e).__name__}: {e}"

        benchmark = run_benchmark(system.base_url, requests, client_cfg, on_warmed=snapshot if engine else None)
        profile: dict[str, Any] = {}
        if cell.measure.profile and engine:  # Tables 13/14/22: a capture of steady decode
            from harness.run.profile import SteadyPolicy, alongside

            policy = SteadyPolicy.for_batch(cell.identity.batch, cell.measure.num_prompts, steps=PROFILE_STEPS)
            benchmark = alongside(benchmark, system.base_url, policy, profile)
        result = aio.run(guarded(system, benchmark, watch, cell.server.stall_timeout_s))
        try:
            info = systems.get_json(system.base_url, info_path)
        except Exception as e:  # noqa: BLE001 - an external system may not report counters
            if engine:
                raise CellError(f"GET {info_path} failed: {e}") from e
            info = {"error": f"{type(e).__name__}: {e}"}
    wall_s = time.monotonic() - t0
    (run_dir / "server_info.json").write_text(json.dumps(info, indent=1, sort_keys=True, default=str) + "\n")
    (run_dir / "client.json").write_text(json.dumps(result.to_dict(with_records=True), default=str) + "\n")

    if result.metrics.get("completed", 0) == 0:
        raise CellError(f"no request completed; errors: {result.errors()} (server log {spec.log_path})")

    doc = {
        "config": result_config(cell, max_context, client_cfg, wpath, workload.header),
        "metrics": result.metrics,
        "engine": engine_counters(info) if engine else {"decode_steps": 0, "reported": False},
        # the same counters after the warm-up: the measured run's own steps are the difference
        # (engine.* counts from server start, warm-up request included)
        **({"engine_after_warmup": warmup_counters(warmed)} if engine else {}),
        "env": environment(started_at, gpu_at_start),
        "run": {"dir": str(run_dir), "server_log": str(spec.log_path), "argv": list(spec.argv),
                "ready_s": ready_s, "wall_s": wall_s, "errors": result.errors(),
                "flush_status": result.flush_status, "max_in_flight": result.max_in_flight,
                "client_cpu_s": result.client_cpu_s},
    }
    if cell.measure.profile:
        doc["profile"] = profile if engine else {
            "error": "the profiler capture needs the bundled engine's POST /profile"}
    if out.exists() and not cell.measure.overwrite:  # a parallel run won the race: still never overwrite
        raise FileExistsError(out)
    if stopped is not None and stopped.is_set():
        raise SystemExit(128 + signal.SIGTERM)
    write_json_atomic(out, doc)
    return doc, out


def result_config(cell: Cell, max_context: int, client_cfg: ClientConfig, workload_file: Path,
                  header: Mapping[str, Any]) -> dict[str, Any]:
    """The result file's `config` section (docs/design.md, "Result files"): the identity, then what
    ran (the engine's arguments, the workload, the client), so the tables can match cells on it and
    a number can be traced to its settings. Its keys and their types are the contract committed
    results are read by (harness.run.results)."""
    engine = cell.system.is_engine
    return {
        **cell.identity.to_dict(), "m_sat": effective_m_sat(cell) if engine else cell.identity.m_sat,
        "num_prompts": cell.measure.num_prompts, "output_len": cell.measure.output_len,
        "warmup": cell.measure.warmup, "flush_cache": cell.measure.flush_cache, "sweep": cell.paths.sweep,
        "hardware": cell.hardware.name, "cell_id": cell.cell_id, "profile": cell.measure.profile,
        "stands_for": None if cell.measure.stands_for is None else dict(cell.measure.stands_for),
        "engine_args": engine_args(cell, max_context) if engine else None,
        "workload_config": asdict(cell.workload), "workload_file": str(workload_file),
        "workload_prefix_lengths": header.get("prefix_lengths"),
        "client": client_cfg.to_dict(), "max_context": max_context,
        "overrides": _task_overrides(),
    }


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
        doc, out = run_cell(Cell.from_config(cfg), _run_dir(), stopped=stopped)
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
