"""A cell's Hydra config turned into values: its identity and result path, the workload file it
reads, the engine arguments, the effective M_sat and the KV budget (harness.run.cell runs the cell).

Pure functions of the composed config (conf/config.yaml and its groups), so the cell app, the
batch runner (harness.run.batch) and tests derive the same values; importing this module registers
the `${cell_id:}` resolver the config's run directory uses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness.run.sweeps import cell_id

FORCE_CASCADE_M_SAT = 2**31  # never dense: the SGL-C/GKV column of Tables 13-14


class CellError(RuntimeError):
    """A cell could not be measured; the message says why."""


# --------------------------------------------------------------------------- config -> values


def identity(cfg: DictConfig) -> dict[str, Any]:
    """The top-level values that name the cell (config groups by name)."""
    return {
        "system": cfg.system.name, "model": cfg.model.name, "tp": cfg.tp, "workload": cfg.workload.kind,
        "lp": cfg.lp, "batch": cfg.batch, "k": cfg.k, "rep": cfg.rep, "hot_fraction": cfg.hot_fraction,
        "cold_page_size": cfg.cold_page_size, "page_size": cfg.page_size, "m_sat": cfg.m_sat,
        "rate": rate_value(cfg.rate), "tag": cfg.get("tag"), "share_depth": cfg.get("share_depth"),
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
    from harness.run.workloads.config import WorkloadConfig

    wl = plain(cfg.workload)
    names = {f.name for f in fields(WorkloadConfig)}
    d = {k: v for k, v in wl.items() if k in names}
    d.update(lp=int(cfg.lp), k=int(cfg.k), num_requests=int(cfg.num_prompts), output_len=int(cfg.output_len))
    if d.get("vocab_size") is None:
        d["vocab_size"] = int(cfg.model.vocab_size)  # ids must be valid for the model (tiny: 1024)
    if d.get("kind") == "hetero" and not d.get("lps"):
        return WorkloadConfig.for_kind("hetero", **{k: v for k, v in d.items() if k not in ("kind", "lps")})
    return WorkloadConfig.from_dict(d)


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
        if cfg.get("share_depth") is not None:  # granikv's knob: levels of a tree read once per step
            args["share_depth"] = int(cfg.share_depth)
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
    """The engine's context limit: the longest prompt the client will send (a closed-loop
    session's last round holds every earlier output) plus the output, rounded up."""
    from harness.run.workloads.requests import max_prompt_len

    if cfg.server.max_context:
        return int(cfg.server.max_context)
    longest = max_prompt_len(requests) + int(cfg.output_len)
    return int(math.ceil((longest + 16) / 256) * 256)

