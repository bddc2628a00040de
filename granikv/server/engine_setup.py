"""Which kernel path the served engine runs, decided where the engine is built.

`KernelOps` has two paths: "triton" (the GPU kernels; on a CPU they run only in Triton's
interpreter, and only when TRITON_INTERPRET=1 is set before triton is first imported) and
"torch" (the float32 references). A CPU server used to build a "triton" engine without the
interpreter, so its first step died. With `--kernel-impl auto` (the server's default) a host
without CUDA gets the torch path: it is the kernels' reference, needs no environment variable,
and decodes faster than the interpreter. An explicit
`--kernel-impl triton` on a CPU is honoured by setting TRITON_INTERPRET=1 before the engine
imports triton (the engine process, or the server process with `--engine-thread`, has not
imported it yet: the server side never imports torch or triton).

This runs in the process that builds the engine, since only there is torch imported to ask
whether CUDA exists.
"""

from __future__ import annotations

import os

from granikv.config import EngineConfig

AUTO = "auto"


def resolve_kernels(cfg: EngineConfig, requested: str, cuda: bool) -> tuple[EngineConfig, bool]:
    """(the config to build, whether the Triton interpreter must be switched on) for a host
    with or without CUDA. `requested` is the --kernel-impl flag: auto | triton | torch."""
    on_cpu = cfg.device == "cpu" or (cfg.device == "auto" and not cuda)
    if requested == AUTO:
        return cfg.replace(kernel_impl="torch" if on_cpu else "triton"), False
    cfg = cfg.replace(kernel_impl=requested)
    return cfg, on_cpu and requested == "triton"


def build_engine(cfg: EngineConfig, requested: str = AUTO):
    """The engine for `cfg` with the kernel path `resolve_kernels` picks (EngineProcess's factory)."""
    import torch

    cfg, interpret = resolve_kernels(cfg, requested, torch.cuda.is_available())
    if interpret:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from granikv.engine.tp import create_engine

    return create_engine(cfg)


def describe_kernels(info: dict) -> str:
    """One line for the start-up log: the device and the kernel path the engine runs."""
    impl, dev = info.get("kernel_impl"), info.get("device_type")
    if impl == "torch":
        how = "torch reference kernels (KernelOps impl='torch')"
    elif dev == "cuda":
        how = "Triton kernels"
    else:
        how = "Triton kernels in Triton's interpreter (TRITON_INTERPRET=1)"
    return f"engine on {dev}: {how}"
