"""One CPU server per test session, started as a user starts it: `python -m granikv.server
--model tiny --device cpu` in a subprocess on a free loopback port, with TRITON_INTERPRET
removed from its environment (tests/conftest.py sets it for the test process; a user's shell
does not have it), so the tests also check that the server runs on a CPU with no extra variable."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass

import pytest


@dataclass
class LiveServer:
    url: str
    ready_line: str
    proc: subprocess.Popen
    log: list[str]

    @property
    def v1(self) -> str:
        return self.url + "/v1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(*extra: str, timeout_s: float = 180.0) -> LiveServer:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.Popen([sys.executable, "-m", "granikv.server", "--model", "tiny", "--device", "cpu",
                             "--port", str(port), *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    t0, line = time.time(), ""
    log: list[str] = []  # everything the server printed, its start-up lines included
    while "ready" not in line and time.time() - t0 < timeout_s:
        line = proc.stdout.readline()
        log.append(line)
        if not line and proc.poll() is not None:
            break
    if "ready" not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    # drain the server's output, so a full pipe never blocks its logging
    threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        assert r.status == 200
    return LiveServer(url, line, proc, log)


def stop_server(srv: LiveServer) -> None:
    srv.proc.send_signal(signal.SIGTERM)
    try:
        srv.proc.wait(60)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
        srv.proc.wait(10)


@pytest.fixture(scope="session")
def cpu_server():
    srv = start_server()
    try:
        yield srv
    finally:
        stop_server(srv)
