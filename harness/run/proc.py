"""`python -m harness.run.cell` as a child process, stopped cleanly when its time is up.

Shared by the two runners of points (`harness.run.point` under Snakemake, `harness.run.batch` on a lent
GPU host), so both stop a cell the same way.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
STOP_GRACE_S = 40.0  # the server's stop_grace_s (30 s) and the cell's own unwinding


def cell_command(overrides: Sequence[str], python: str | None = None) -> list[str]:
    """The argv that measures one cell: `python -m harness.run.cell <overrides>`."""
    return [python or sys.executable, "-m", "harness.run.cell", *overrides]


def run_until(
    cmd: list[str],
    log: IO[str] | None,
    timeout_s: float | None,
    grace_s: float = STOP_GRACE_S,
    env: Mapping[str, str] | None = None,
) -> int | str:
    """Run `cmd` into `log` (None: this process's stdout); past `timeout_s` (None: no deadline),
    SIGTERM it and SIGKILL it only after `grace_s`. Returns the exit code, or "timeout" when the
    deadline passed.

    Why not subprocess.run(timeout=...): that SIGKILLs the cell at once, so harness.run.cell never
    reaches launch()'s finally, and its server — started in a session of its own so that it and
    its TP workers can be signalled as one group — lives on, holding most of the GPU's memory
    (the engine sizes its KV pool from the memory it finds free). Every later cell of the call
    then measures a smaller engine next to an idle one, or fails to start. SIGTERM is what
    harness.run.cell turns into SystemExit, which stops the server. The runner itself stopped while
    it waits (SIGTERM turned into SystemExit, Ctrl-C) stops the cell the same way before it
    unwinds, so no cell outlives its runner."""
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=dict(env) if env is not None else None,
    )
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop(proc, grace_s)
        return "timeout"
    finally:
        if proc.poll() is None:  # the runner is unwinding (a signal, an interrupt)
            stop(proc, grace_s)


def stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM `proc`, then SIGKILL it if it has not exited after `grace_s`."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
