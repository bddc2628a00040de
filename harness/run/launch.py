"""How a cell's system is launched: the engine's arguments (the effective M_sat, the KV budget,
the context limit) and the server's command line (harness.run.systems starts it).

Why apart from the cell app: these are pure functions of the typed Cell, recorded in the result
file (`config.engine_args`, `config.m_sat`, `config.max_context`), so tests and the docs can
derive them without launching anything; only `launch_spec` writes a file (an external server's
model config).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from harness.run import systems
from harness.run.config import Cell, CellError, Hardware
from harness.run.sweeps import ROOT
from harness.run.workloads.requests import WorkloadRequest, max_prompt_len


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


def kv_budget_gb(hw: Hardware, model_name: str, tp: int) -> float | None:
    """The KV budget per rank: the hardware file's number, or the emulated GPU's leftover.

    Emulation (conf/hardware/a100-40gb.yaml documents the arithmetic):
    hbm_gib * 2^30 * static_fraction - bf16 weights per rank, in GB (1e9 bytes, as the engine).
    """
    if hw.kv_budget_gb is not None:
        return float(hw.kv_budget_gb)
    emu = hw.emulate
    if not emu:
        return None
    from granikv.model.spec import load_spec

    weights_gb = load_spec(model_name).num_params() * 2 / 1e9 / tp
    budget = float(emu["hbm_gib"]) * 2**30 * float(emu["static_fraction"]) / 1e9 - weights_gb
    if budget <= 0:
        raise CellError(f"{model_name} at TP={tp} does not fit {hw.name}: weights {weights_gb:.1f} GB per rank")
    return round(budget, 3)


def effective_m_sat(cell: Cell) -> int:
    """The dispatcher threshold the engine gets: the cell's `m_sat`, else the hardware file's fit
    for the model's GQA group size, else the engine's default."""
    from granikv.config import EngineConfig

    if cell.identity.m_sat is not None:
        return int(cell.identity.m_sat)
    hw, g = cell.hardware, cell.model.group_size
    # the kernels microbench writes `m_sat` (g=4) and `m_sat_by_g` (per group size) into the file
    fitted = hardware_m_sat(hw.m_sat_by_g, g) if hw.m_sat_by_g else None
    fitted = fitted if fitted is not None else hardware_m_sat(hw.m_sat, g)
    return fitted if fitted is not None else EngineConfig().m_sat


def engine_args(cell: Cell, max_context: int) -> dict[str, Any]:
    """EngineConfig fields for the bundled engine (validated by building an EngineConfig)."""
    from granikv.config import EngineConfig

    ident, server = cell.identity, cell.server
    args: dict[str, Any] = {
        "model": cell.model.name, "system": cell.system.name, "tp": ident.tp, "device": cell.hardware.device,
        "page_size": ident.page_size, "cold_page_size": ident.cold_page_size,
        "hot_fraction": ident.hot_fraction, "m_sat": effective_m_sat(cell),
        "kv_budget_gb": kv_budget_gb(cell.hardware, cell.model.name, ident.tp),
        "max_running": server.max_running or ident.batch, "max_context": max_context,
        "kernel_impl": server.kernel_impl, "cuda_graphs": server.cuda_graphs,
    }
    if cell.system.name == "granikv":  # the dispatcher's plain-path threshold, fitted per GPU
        args["prefix_pass_min_saved_mib"] = cell.hardware.prefix_pass_min_saved_mib
        if ident.share_depth is not None:  # granikv's knob: levels of a tree read once per step
            args["share_depth"] = ident.share_depth
    args.update(cell.system.engine_args)
    args.update(server.extra)
    known = {f.name for f in fields(EngineConfig)}
    unknown = sorted(set(args) - known)
    if unknown:
        raise CellError(f"not EngineConfig fields: {unknown}")
    try:
        EngineConfig(**{k: v for k, v in args.items() if v is not None})
    except (TypeError, ValueError) as e:
        raise CellError(f"invalid engine configuration: {e}") from e
    return args


def max_context_for(cell: Cell, requests: Sequence[WorkloadRequest]) -> int:
    """The engine's context limit: the longest prompt the client will send (a closed-loop
    session's last round holds every earlier output) plus the output, rounded up."""
    if cell.server.max_context:
        return cell.server.max_context
    longest = max_prompt_len(requests) + cell.measure.output_len
    return int(math.ceil((longest + 16) / 256) * 256)


def launch_spec(cell: Cell, run_dir: Path, max_context: int) -> systems.LaunchSpec:
    """How harness.run.systems starts the cell's server: its argv, address, log and deadlines."""
    server, system, ident = cell.server, cell.system, cell.identity
    host = server.host
    port = int(server.port or systems.free_port(host))
    common = dict(host=host, port=port, log_path=run_dir / "server.log", ready_timeout_s=server.ready_timeout_s,
                  stop_grace_s=server.stop_grace_s, cwd=str(ROOT), env=dict(cell.hardware.env))
    if system.is_engine:
        argv = systems.engine_command(engine_args(cell, max_context), host, port, module=server.module)
        if server.incremental_streaming_output:
            argv.append("--incremental-streaming-output")
        return systems.LaunchSpec(name=system.name, argv=tuple(argv), **common)
    systems.require_module(system.name, system.module)
    from granikv.model.spec import load_spec

    model_dir = run_dir / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(load_spec(cell.model.name).to_hf_config(), indent=1))
    values = dict(python=sys.executable, model_path=str(model_dir), tp=ident.tp, host=host, port=port,
                  page_size=ident.page_size, max_running=server.max_running or ident.batch,
                  max_context=max_context, hot_fraction=ident.hot_fraction, batch=ident.batch,
                  **system.extra_values)
    argv = systems.external_command(system.command, values)
    return systems.LaunchSpec(name=system.name, argv=tuple(argv), health_path=system.health_path, **common)
