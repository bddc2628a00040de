"""What the served engine runs on this host, decided where the engine is built.

Kernel path. `KernelOps` has two paths: "triton" (the GPU kernels; on a CPU they run only in
Triton's interpreter, and only when TRITON_INTERPRET=1 is set before triton is first imported) and
"torch" (the float32 references). With `--kernel-impl auto` (the server's default) a host without
CUDA gets the torch path: it is the kernels' reference, needs no environment variable, and decodes
faster than the interpreter. An explicit `--kernel-impl triton` on a CPU is honoured by setting
TRITON_INTERPRET=1 before the engine imports triton (the engine process, or the server process with
`--engine-thread`, has not imported it yet: the server side never imports torch or triton).

Prefill chunk. `--chunked-prefill-tokens auto` (the default) is 8192 tokens on CUDA and
`CPU_CHUNKED_PREFILL_TOKENS` on a CPU: the torch reference attention builds each chunk's
[chunk, context] score matrix, and nothing else runs during a step: an 8K-token prompt prefilled as
one chunk holds the engine for its whole prefill, and smaller chunks shorten both the longest step
and the total (`python -m harness.diagnostics.cpu_prefill_chunk`,
results/cpu/microbench/cpu-prefill-chunk.json). 512 keeps every step of the tiny model well under
a second on two cores.

`--device cuda` on a host whose torch sees no CUDA device is a configuration error with a message,
not an assertion from deep inside torch.

This runs in the process that builds the engine, since only there is torch imported to ask
whether CUDA exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from granikv.config import EngineConfig

AUTO = "auto"
CPU_CHUNKED_PREFILL_TOKENS = 512


@dataclass(frozen=True)
class HostRequest:
    """The flags whose value depends on the host: `auto`, or what the operator asked for."""

    kernel_impl: str = AUTO  # auto | triton | torch
    chunked_prefill_tokens: int | None = None  # None: auto


def resolve_kernels(cfg: EngineConfig, requested: str, cuda: bool) -> tuple[EngineConfig, bool]:
    """(the config to build, whether the Triton interpreter must be switched on) for a host with
    or without CUDA. `requested` is the --kernel-impl flag: auto | triton | torch."""
    on_cpu = cfg.device == "cpu" or (cfg.device == "auto" and not cuda)
    if requested == AUTO:
        return cfg.replace(kernel_impl="torch" if on_cpu else "triton"), False
    cfg = cfg.replace(kernel_impl=requested)
    return cfg, on_cpu and requested == "triton"


def resolve_host(cfg: EngineConfig, request: HostRequest, cuda: bool) -> tuple[EngineConfig, bool]:
    """`resolve_kernels`, plus the prefill chunk, plus the device check."""
    if cfg.device.startswith("cuda") and not cuda:
        raise ValueError(f"--device {cfg.device}: this host's torch sees no CUDA device (a CPU-only build, or "
                         "no GPU visible: check nvidia-smi and CUDA_VISIBLE_DEVICES); use --device cpu or auto")
    cfg, interpret = resolve_kernels(cfg, request.kernel_impl, cuda)
    on_cpu = cfg.device == "cpu" or (cfg.device == "auto" and not cuda)
    chunk = request.chunked_prefill_tokens
    if chunk is None and on_cpu:
        chunk = CPU_CHUNKED_PREFILL_TOKENS
    if chunk is not None:
        cfg = cfg.replace(chunked_prefill_tokens=chunk)
    return cfg, interpret


def build_engine(cfg: EngineConfig, requested: HostRequest | str = AUTO):
    """The engine for `cfg` as `resolve_host` resolves it for this host (EngineProcess's factory).
    A plain string is the --kernel-impl flag alone."""
    import torch

    request = requested if isinstance(requested, HostRequest) else HostRequest(kernel_impl=requested)
    cfg, interpret = resolve_host(cfg, request, torch.cuda.is_available())
    if interpret:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from granikv.runtime.tp import create_engine

    return create_engine(cfg)


def describe_kernels(info: dict) -> str:
    """The device and the kernel path the engine runs."""
    impl, dev = info.get("kernel_impl"), info.get("device_type")
    if impl == "torch":
        how = "torch reference kernels (KernelOps impl='torch')"
    elif dev == "cuda":
        how = "Triton kernels"
    else:
        how = "Triton kernels in Triton's interpreter (TRITON_INTERPRET=1)"
    return f"engine on {dev}: {how}"


def describe_engine(info: dict, context_limit: int) -> str:
    """One line of what runs, from the built engine (not the flags): system, model, device and
    kernels, dtype, CUDA graphs, the context length served, concurrency and KV capacity."""
    parts = [f"{info.get('system')} serving {info.get('model')}" + (f" on {info['tp']} ranks" if info.get("tp", 1)
                                                                    > 1 else ""),
             describe_kernels(info).removeprefix("engine "),
             f"dtype {info.get('dtype')}",
             "CUDA graphs " + ("on" if info.get("cuda_graphs") else "off"),
             f"context {context_limit} tokens",
             f"up to {info.get('max_running')} requests at once",
             f"prefill chunks of {info.get('chunked_prefill_tokens')} tokens"]
    cap = info.get("kv_capacity")
    if cap:
        parts.append(f"KV cache {info.get('kv_slots')} slots ({cap} tokens for one request, "
                     f"{cap / max(context_limit, 1):.2g}x the context)")
    return ", ".join(parts)
