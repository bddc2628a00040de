"""Process checks shared by the harness tests that start servers and stop them."""

from __future__ import annotations

import os
import time


def alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie still answers kill(0), so /proc's state decides."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pid: int, seconds: float = 10.0) -> bool:
    """Poll until `pid` is gone; False when it still runs after `seconds`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False
