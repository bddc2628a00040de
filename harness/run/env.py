"""The environment a cell measures in: versions, GPUs, the call it ran in, and whether the GPUs it
needs are idle.

Recorded in every result file (`environment`), so a number can be traced to the host and library
versions it was measured with, and to the call that measured it (`call_id`: the cells of one point
share it, `harness.run.point`); `check_gpus_idle` refuses to measure beside another job's memory.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import uuid
from typing import Any

from harness.run.config import Cell, CellError
from harness.run.provenance import git_sha

# The call a cell runs in: harness.run.point and harness.run.batch export one id to every cell of a point,
# so the cells whose ratios are compared can be told to come from one run on one machine.
CALL_ID_ENV = "GRANIKV_CALL_ID"


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


def check_gpus_idle(cell: Cell) -> list[dict[str, int]] | None:
    """Read every GPU's memory before the server starts (recorded as env.gpu_memory_at_start)
    and raise CellError when one this cell will use is busy (`server.busy_gpu_mib`; null: no
    check)."""
    rows = gpu_memory()
    limit = cell.server.busy_gpu_mib
    if rows and limit is not None and cell.on_gpu:  # a CPU cell on a GPU host shares nothing with it
        busy = busy_gpus(rows, cell.identity.tp, os.environ.get("CUDA_VISIBLE_DEVICES"), limit)
        if busy:
            held = ", ".join(f"GPU {r['index']}: {r['used_mib']} of {r['total_mib']} MiB" for r in busy)
            raise CellError(
                f"the GPU is not idle before the server starts ({held}); another process — often an "
                f"earlier cell's server that outlived its cell — holds it, and the engine would size its "
                f"KV pool from what is left. `nvidia-smi --query-compute-apps=pid,used_memory "
                f"--format=csv` names it; stop it, or pass server.busy_gpu_mib=null to measure anyway")
    return rows


def gpu_matches(profile_gpu: str | None, host_gpu: str) -> bool:
    """Whether a host's GPU names (`gpus()`, comma-joined) are all the hardware profile's card.
    No card in the profile (CPU, emulations): anything matches. Matching is by the profile's name
    as a word-bounded substring, case-insensitive: "NVIDIA H200" matches "NVIDIA H200" and
    "NVIDIA H200 NVL" but not "NVIDIA H100 80GB HBM3"."""
    if not profile_gpu:
        return True
    want = re.compile(rf"(^|\W){re.escape(profile_gpu.strip())}(\W|$)", re.IGNORECASE)
    names = [n.strip() for n in host_gpu.split(",") if n.strip()]
    return bool(names) and all(want.search(n) for n in names)


def check_gpu_model(cell: Cell) -> None:
    """Raise CellError when the host's GPU is not the hardware profile's card.

    Why: a profile's numbers (m_sat, ceilings, the results/<hardware>/ folder its cells land in)
    belong to one card; an `h200` cell measured on an H100 would sit in the H200 tables as an H200
    number. `hardware.gpu=null` measures anyway (the file still records the card in `env.gpu`)."""
    hw = cell.hardware
    want = hw.gpu
    if not want or not cell.on_gpu or hw.emulate:  # an emulated card runs on another one
        return
    host, count = gpus()
    if count and not gpu_matches(str(want), host):
        raise CellError(
            f"this host's GPU is {host}, but hardware={hw.name} is the profile of {want} "
            f"(its m_sat, ceilings and results/{hw.name}/ folder are that card's); pass the "
            f"hardware profile of this card, or hardware.gpu=null to measure here anyway")


def new_call_id() -> str:
    """A fresh, unique call id (hex, no separators: safe in file names and shell words)."""
    return uuid.uuid4().hex


def call_id() -> str:
    """The call this cell runs in: `GRANIKV_CALL_ID` when set (the cells of one point share it),
    else a fresh id — a cell run alone is a call of its own."""
    return os.environ.get(CALL_ID_ENV, "").strip() or new_call_id()


def environment(started_at: str, gpu_memory_at_start: list[dict[str, int]] | None) -> dict[str, Any]:
    gpu, count = gpus()
    return {
        "gpu": gpu, "gpu_count": count, "torch": _version("torch"), "triton": _version("triton"),
        "python": platform.python_version(), "git_sha": git_sha(), "call_id": call_id(), "started_at": started_at,
        "host": platform.node(), "cpu_count": os.cpu_count(),
        "gpu_memory_at_start": gpu_memory_at_start,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }

