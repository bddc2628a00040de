"""One cell end to end: `python -m harness.cell <Hydra overrides>` -> one result file.

    python -m harness.cell system=granikv model=llama-3.1-8b tp=1 workload=sharegpt lp=16384 batch=256

Steps: generate (or reuse) the workload file; start the system (harness.systems); warm up and
flush the cache (the client does both when the config says so); run the streaming client;
with profile=true, capture N steady decode steps beside the client (harness.profile: POST
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
import fcntl
import hashlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from granikv.server import aio
from harness import systems
from harness.provenance import git_sha
from harness.sweeps import ROOT, cell_id

EXIT_EXISTS = 3
FORCE_CASCADE_M_SAT = 2**31  # never dense: the SGL-C/GKV column of Tables 13-14
PROFILE_STEPS = 20  # decode steps in a profile=true cell's capture window (harness.profile)


class CellError(RuntimeError):
    """A cell could not be measured; the message says why."""


# --------------------------------------------------------------------------- config -> values


def identity(cfg: DictConfig) -> dict[str, Any]:
    """The top-level values that name the cell (config groups by name)."""
    return {
        "system": cfg.system.name, "model": cfg.model.name, "tp": cfg.tp, "workload": cfg.workload.kind,
        "lp": cfg.lp, "batch": cfg.batch, "k": cfg.k, "rep": cfg.rep, "hot_fraction": cfg.hot_fraction,
        "cold_page_size": cfg.cold_page_size, "page_size": cfg.page_size, "m_sat": cfg.m_sat,
        "rate": rate_value(cfg.rate), "tag": cfg.get("tag"),
    }


def _cell_id_resolver(*, _root_: DictConfig) -> str:
    return cell_id(identity(_root_))


if not OmegaConf.has_resolver("cell_id"):
    OmegaConf.register_new_resolver("cell_id", _cell_id_resolver)


def plain(node: Any) -> Any:
    """A plain Python value of a config node (DictConfig/ListConfig resolved, others as is)."""
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def rate_value(rate: Any) -> float | str:
    """`inf` (the string the YAML gives) or a positive number."""
    r = float(str(rate))
    if not r > 0:
        raise CellError(f"rate must be > 0 or inf, got {rate!r}")
    return "inf" if math.isinf(r) else r


def result_path(cfg: DictConfig) -> Path:
    return Path(cfg.results_dir) / cfg.hardware.name / cfg.sweep.name / f"{cell_id(identity(cfg))}.json"


def group_size(model: Mapping[str, Any]) -> int:
    return int(model["num_heads"]) // int(model["num_kv_heads"])


def hardware_m_sat(block: Any, g: int) -> int | None:
    """The fitted threshold for GQA group size g from a hardware file's `m_sat` entry.

    Accepts a number, or a mapping keyed by g (`4`, `"4"`, `"g4"`), possibly nested one level
    (e.g. `{by_group_size: {4: 1024}}`), or holding a single `value`/`m_sat`.
    """
    if block is None:
        return None
    if isinstance(block, int | float) and not isinstance(block, bool):
        return int(block)
    if isinstance(block, Mapping):
        for key in (g, str(g), f"g{g}", f"g={g}"):
            if key in block and isinstance(block[key], int | float):
                return int(block[key])
        for key in ("value", "m_sat", "default"):
            if isinstance(block.get(key), int | float):
                return int(block[key])
        for sub in block.values():
            if isinstance(sub, Mapping):
                found = hardware_m_sat({k: v for k, v in sub.items() if not isinstance(v, Mapping)}, g)
                if found is not None:
                    return found
    return None


def kv_budget_gb(hw: Mapping[str, Any], model_name: str, tp: int) -> float | None:
    """The KV budget per rank: the hardware file's number, or the emulated GPU's leftover.

    Emulation (conf/hardware/a100-40gb.yaml documents the arithmetic):
    hbm_gib * 2^30 * static_fraction - bf16 weights per rank, in GB (1e9 bytes, as the engine).
    """
    if hw.get("kv_budget_gb") is not None:
        return float(hw["kv_budget_gb"])
    emu = hw.get("emulate")
    if not emu:
        return None
    from granikv.model.spec import load_spec

    weights_gb = load_spec(model_name).num_params() * 2 / 1e9 / tp
    budget = float(emu["hbm_gib"]) * 2**30 * float(emu["static_fraction"]) / 1e9 - weights_gb
    if budget <= 0:
        raise CellError(f"{model_name} at TP={tp} does not fit {hw['name']}: weights {weights_gb:.1f} GB per rank")
    return round(budget, 3)


def workload_config(cfg: DictConfig):
    """The WorkloadConfig of the cell: the workload group, with the top-level lp/k/n/output_len."""
    from harness.workloads import WorkloadConfig

    wl = plain(cfg.workload)
    names = {f.name for f in fields(WorkloadConfig)}
    d = {k: v for k, v in wl.items() if k in names}
    d.update(lp=int(cfg.lp), k=int(cfg.k), num_requests=int(cfg.num_prompts), output_len=int(cfg.output_len))
    if d.get("vocab_size") is None:
        d["vocab_size"] = int(cfg.model.vocab_size)  # ids must be valid for the model (tiny: 1024)
    if d.get("kind") == "hetero" and not d.get("lps"):
        return WorkloadConfig.for_kind("hetero", **{k: v for k, v in d.items() if k not in ("kind", "lps")})
    return WorkloadConfig.from_dict(d)


# THIN ADAPTER (pipeline side): harness.workloads.workload_filename loads the tokenizer (about
# 9 s of BPE tables on this host) only to learn its name and vocabulary size. For the default
# tokenizer (tokenizer_path None: cl100k_base) both are constants, so the name is derived with
# them filled in; `check_header` verifies them against every file actually read. Drop this when
# workload_filename stops loading the tokenizer.
DEFAULT_TOKENIZER = ("cl100k", 100277)


def workload_file_name(wcfg) -> str:
    from harness import workloads

    if wcfg.tokenizer_path is not None:
        return workloads.workload_filename(wcfg)
    original = workloads._tokenizer_tag
    workloads._tokenizer_tag = lambda path: DEFAULT_TOKENIZER if path is None else original(path)
    try:
        return workloads.workload_filename(wcfg)
    finally:
        workloads._tokenizer_tag = original


def check_header(header: Mapping[str, Any], wcfg, path: Path) -> None:
    if wcfg.tokenizer_path is None and (header.get("tokenizer"), header.get("n_vocab")) != DEFAULT_TOKENIZER:
        raise CellError(f"{path}: tokenizer {header.get('tokenizer')}/{header.get('n_vocab')} is not the "
                        f"expected default {DEFAULT_TOKENIZER}; delete the file or set workload.tokenizer_path")


def ensure_workload(wcfg, workloads_dir: Path) -> Path:
    """The workload file for `wcfg`, generated under a file lock if absent (parallel cells share it)."""
    from harness.workloads import write

    path = Path(workloads_dir) / workload_file_name(wcfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = hashlib.blake2b(str(path.resolve()).encode(), digest_size=8).hexdigest()
    with open(Path(tempfile.gettempdir()) / f"granikv-workload-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            write(wcfg, path)
    return path


def engine_args(cfg: DictConfig, max_context: int) -> dict[str, Any]:
    """EngineConfig fields for the bundled engine (validated by building an EngineConfig)."""
    from granikv.config import EngineConfig

    m_sat = effective_m_sat(cfg)
    args: dict[str, Any] = {
        "model": cfg.model.name, "system": cfg.system.name, "tp": int(cfg.tp), "device": cfg.hardware.device,
        "page_size": int(cfg.page_size), "cold_page_size": int(cfg.cold_page_size),
        "hot_fraction": float(cfg.hot_fraction), "m_sat": m_sat,
        "kv_budget_gb": kv_budget_gb(plain(cfg.hardware), cfg.model.name, int(cfg.tp)),
        "max_running": int(cfg.server.max_running or cfg.batch), "max_context": max_context,
        "kernel_impl": cfg.server.kernel_impl, "cuda_graphs": cfg.server.cuda_graphs,
    }
    if cfg.system.name == "granikv":  # the dispatcher's plain-path threshold, fitted per GPU
        args["prefix_pass_min_saved_mib"] = cfg.hardware.get("prefix_pass_min_saved_mib")
    args.update(plain(cfg.system.get("engine_args")) or {})
    args.update(plain(cfg.server.extra) or {})
    known = {f.name for f in fields(EngineConfig)}
    unknown = sorted(set(args) - known)
    if unknown:
        raise CellError(f"not EngineConfig fields: {unknown}")
    try:
        EngineConfig(**{k: v for k, v in args.items() if v is not None})
    except (TypeError, ValueError) as e:
        raise CellError(f"invalid engine configuration: {e}") from e
    return args


def effective_m_sat(cfg: DictConfig) -> int:
    from granikv.config import EngineConfig

    if cfg.m_sat is not None:
        return int(cfg.m_sat)
    hw = plain(cfg.hardware)
    g = group_size(cfg.model)
    # the kernels microbench writes `m_sat` (g=4) and `m_sat_by_g` (per group size) into the file
    fitted = hardware_m_sat(hw.get("m_sat_by_g"), g) if hw.get("m_sat_by_g") else None
    fitted = fitted if fitted is not None else hardware_m_sat(hw.get("m_sat"), g)
    return fitted if fitted is not None else EngineConfig().m_sat


def max_context_for(cfg: DictConfig, requests) -> int:
    if cfg.server.max_context:
        return int(cfg.server.max_context)
    longest = max(len(r.input_ids) for r in requests) + int(cfg.output_len)
    return int(math.ceil((longest + 16) / 256) * 256)


# --------------------------------------------------------------------------- environment


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def gpus() -> tuple[str, int]:
    """(GPU name, count) from nvidia-smi, without importing torch in this process (slow, and the
    server is the one that uses the GPU)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return f"none (CPU: {platform.processor() or platform.machine()})", 0
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return (", ".join(sorted(set(names))), len(names)) if names else ("none", 0)


def parse_gpu_memory(text: str) -> list[dict[str, int]]:
    """`nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits` rows."""
    rows = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 3 and all(x.isdigit() for x in parts):
            rows.append({"index": int(parts[0]), "used_mib": int(parts[1]), "total_mib": int(parts[2])})
    return rows


def gpu_memory() -> list[dict[str, int]] | None:
    """Device memory in use on every GPU before the cell's server starts. The engine sizes its KV
    cache from the memory it finds free, so memory another process still holds shrinks the cell's
    KV capacity (a Table 20 k=64 cell next to another process's memory gets far fewer slots than
    on an idle H200) and with it every KV-bound number. Recorded so that a cell's
    capacity can always be explained."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_gpu_memory(out)


def busy_gpus(rows: list[dict[str, int]], tp: int, visible: str | None, limit_mib: int) -> list[dict[str, int]]:
    """The GPUs this cell's server will use (the first `tp` of CUDA_VISIBLE_DEVICES, or of all)
    that already hold more than `limit_mib` of memory.

    Why refuse such a cell: the engine sizes its KV pool from the memory it finds free, and a
    process still holding the GPU is usually an earlier cell's server that outlived its cell
    (a cell killed outright cannot stop it). Measured beside it, a cell runs a smaller engine on
    a shared GPU, and its numbers look like an engine regression."""
    indices = [r["index"] for r in rows]
    if visible is not None and visible.strip():
        parts = [x.strip() for x in visible.split(",")]
        if all(x.isdigit() for x in parts):
            indices = [int(x) for x in parts]
    use = set(indices[:max(1, tp)])
    return [r for r in rows if r["index"] in use and r["used_mib"] > limit_mib]


def check_gpus_idle(cfg: DictConfig) -> list[dict[str, int]] | None:
    """Read every GPU's memory before the server starts (recorded as env.gpu_memory_at_start)
    and raise CellError when one this cell will use is busy (`server.busy_gpu_mib`; null: no
    check)."""
    rows = gpu_memory()
    limit = cfg.server.get("busy_gpu_mib")
    on_gpu = cfg.system.kind != "engine" or cfg.hardware.get("device", "cuda") != "cpu"
    if rows and limit is not None and on_gpu:  # a CPU cell on a GPU host shares nothing with it
        busy = busy_gpus(rows, int(cfg.tp), os.environ.get("CUDA_VISIBLE_DEVICES"), int(limit))
        if busy:
            held = ", ".join(f"GPU {r['index']}: {r['used_mib']} of {r['total_mib']} MiB" for r in busy)
            raise CellError(
                f"the GPU is not idle before the server starts ({held}); another process — often an "
                f"earlier cell's server that outlived its cell — holds it, and the engine would size its "
                f"KV pool from what is left. `nvidia-smi --query-compute-apps=pid,used_memory "
                f"--format=csv` names it; stop it, or pass server.busy_gpu_mib=null to measure anyway")
    return rows


def environment(started_at: str, gpu_memory_at_start: list[dict[str, int]] | None) -> dict[str, Any]:
    gpu, count = gpus()
    return {
        "gpu": gpu, "gpu_count": count, "torch": _version("torch"), "triton": _version("triton"),
        "python": platform.python_version(), "git_sha": git_sha(), "started_at": started_at,
        "host": platform.node(), "cpu_count": os.cpu_count(),
        "gpu_memory_at_start": gpu_memory_at_start,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


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


def run_cell(cfg: DictConfig, run_dir: Path) -> tuple[dict[str, Any], Path]:
    """Measure the cell; return the result document and where it was written."""
    from harness.client import ClientConfig, run_benchmark
    from harness.workloads import read_workload

    started_at = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = result_path(cfg)
    if out.exists() and not cfg.overwrite:
        raise FileExistsError(out)
    if cfg.system.kind == "external":  # before any work: skip cleanly where it is not installed
        systems.require_module(cfg.system.name, cfg.system.module)
    run_dir.mkdir(parents=True, exist_ok=True)

    wcfg = workload_config(cfg)
    wpath = ensure_workload(wcfg, Path(cfg.workloads_dir))
    workload = read_workload(wpath)
    check_header(workload.header, wcfg, wpath)
    requests = workload.requests
    max_context = max_context_for(cfg, requests)
    spec = launch_spec(cfg, run_dir, max_context)
    client_cfg = ClientConfig(
        rate=float(str(cfg.rate)), max_concurrency=int(cfg.batch), warmup_requests=int(cfg.warmup),
        warmup_output_len=int(cfg.client.warmup_output_len), flush_cache=bool(cfg.flush_cache),
        # the hint is a GraniKV API field: sent to the bundled engine (paged/cascade ignore it),
        # never to an external server that may reject unknown fields
        send_prefix_hint=bool(cfg.client.send_prefix_hint) and cfg.system.kind == "engine",
        request_timeout_s=float(cfg.client.request_timeout_s),
        progress=bool(cfg.client.progress), api=str(cfg.client.get("api") or "generate"),
        model=cfg.client.get("model") or cfg.model.name)

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
            from harness.profile import SteadyPolicy, alongside

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


def _terminate(signum: int, _frame: Any) -> None:
    # SIGTERM (Snakemake or a user stopping the job) must unwind through launch()'s finally, so
    # the server is stopped too; Python's default would exit without running it.
    raise SystemExit(128 + signum)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    signal.signal(signal.SIGTERM, _terminate)
    try:
        doc, out = run_cell(cfg, _run_dir())
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
