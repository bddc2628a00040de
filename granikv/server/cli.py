"""`EngineConfig` <-> command-line flags: one flag per config field, generated, so the server's
`--help` can never drift from the config."""

from __future__ import annotations

import argparse
import dataclasses
import typing

from granikv.config import EngineConfig
from granikv.runtime.engine_setup import AUTO, CPU_CHUNKED_PREFILL_TOKENS, HostRequest

_FIELD_HELP = {
    "model": "model name under conf/model/ (tiny, llama-3.1-8b, ...) or a dir with config.json",
    "system": "KV storage + decode attention: paged | cascade | granikv",
    "tp": "tensor-parallel ranks",
    "kv_budget_gb": "cap the KV cache at this many GB (emulate a smaller GPU)",
    "hot_fraction": "f_p: share of KV slots reserved for HOT slabs (granikv)",
    "m_sat": "dense prefix pass when n_class*g >= m_sat (see conf/hardware/<gpu>.yaml)",
    "prefix_pass_min_saved_mib": "a prefix pass kind's classes take it only when together they avoid this many "
                                 "MiB of K/V re-reads per layer; None = 192 on CUDA (H200 fit), 0 on CPU",
    "num_slots": "explicit KV slot count (overrides kv_budget_gb / mem_fraction)",
    "fused_elementwise": "Triton kernels for residual add + RMSNorm, SiLU*up and RoPE on CUDA (CPU: torch)",
    "extend_split_keys": "split the keys of small prefill steps behind long cached prefixes across programs",
    "extend_split_rule": "how many key splits: fill (fill 2 waves of SMs) or long-keys (also >= 4 behind >= 8K "
                         "keys, none behind shorter keys once one split fills 3/4 of a wave)",
}


def _auto_int(s: str) -> int | None:
    return None if s == AUTO else int(s)


def _parse_bool(s: str) -> bool:
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {s!r}")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(EngineConfig)
    defaults = EngineConfig()
    for f in dataclasses.fields(EngineConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        hint = hints[f.name]
        help_ = _FIELD_HELP.get(f.name, f.name.replace("_", " ")) + f" (default: {default})"
        args = typing.get_args(hint)
        if f.name == "kernel_impl":  # resolved where the engine is built: engine_setup.resolve_host
            p.add_argument(flag, choices=(AUTO, "triton", "torch"), default=AUTO,
                           help="kernel path: triton | torch | auto (default: auto = triton with CUDA, the torch "
                                "reference kernels without; triton on a CPU runs in Triton's interpreter)")
        elif f.name == "chunked_prefill_tokens":  # likewise
            p.add_argument(flag, type=_auto_int, default=None, metavar="N|auto",
                           help=f"prefill chunk in tokens (default: auto = {default} on CUDA, "
                                f"{CPU_CHUNKED_PREFILL_TOKENS} on a CPU, where the reference attention's cost "
                                "grows with the chunk)")
        elif hint is bool:
            p.add_argument(flag, type=_parse_bool, default=default, metavar="BOOL", help=help_)
        elif typing.get_origin(hint) is tuple:  # graph_batch_sizes, extend_graph_tokens, ...
            p.add_argument(flag, type=lambda s: tuple(int(x) for x in s.split(",") if x), default=default,
                           metavar="N,N,...", help=help_)
        else:
            base = next((a for a in args if a is not type(None)), hint) if args else hint
            conv = {int: int, float: float, str: str}.get(base, str)
            p.add_argument(flag, type=conv, default=default, help=help_)
    # alias used by SGLang-style launch commands
    p.add_argument("--attention", dest="system", help="alias of --system")


def config_from_args(ns: argparse.Namespace) -> EngineConfig:
    """The config the flags say; the host-dependent flags left at `auto` keep the config's
    defaults, which `engine_setup.build_engine` replaces by what the host runs (`host_request`)."""
    kw = {f.name: getattr(ns, f.name) for f in dataclasses.fields(EngineConfig) if hasattr(ns, f.name)}
    if kw.get("kernel_impl") == AUTO:
        del kw["kernel_impl"]
    if kw.get("chunked_prefill_tokens", 0) is None:
        del kw["chunked_prefill_tokens"]
    return EngineConfig(**kw)


def host_request(ns: argparse.Namespace) -> HostRequest:
    """The host-dependent flags as given (`auto` or a value)."""
    return HostRequest(kernel_impl=getattr(ns, "kernel_impl", AUTO) or AUTO,
                       chunked_prefill_tokens=getattr(ns, "chunked_prefill_tokens", None))
