"""Start and stop a serving system for one cell: the bundled engine or an external SGLang.

Every system is a subprocess that speaks the same HTTP API (docs/design.md,
"Engine and server"), so the client and the
metrics never know which one they talk to. A cell must never leave a server behind, whatever
happens: the process runs in its own process group (TP workers included), and `stop()` sends
SIGTERM to the group, waits a grace period, then SIGKILLs the group. The server's stdout and
stderr go straight to a log file (the OS streams it, nothing buffers in this process), so a
crash is diagnosable afterwards and the tail of the log is quoted in the error.

- Bundled engine (`paged`, `cascade`, `granikv`): `python -m granikv.server` with one flag per
  `EngineConfig` field that differs from the default (`engine_command`).
- External (`sglang`): a command template from `conf/system/sglang.yaml`, formatted with the
  cell's values (`external_command`). When the `sglang` module is not importable here,
  `require_module` raises `SystemUnavailable` with a clear message and the cell is skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENGINE_SYSTEMS = ("paged", "cascade", "granikv")


class SystemUnavailable(RuntimeError):
    """The system cannot run on this host at all (e.g. SGLang is not installed): skip, don't fail."""


class SystemStartError(RuntimeError):
    """The system was launched but never became healthy (exited, or timed out)."""


@dataclass(frozen=True)
class LaunchSpec:
    """How to launch one system and how long to wait for it."""

    name: str
    argv: tuple[str, ...]
    host: str
    port: int
    log_path: Path
    ready_timeout_s: float = 600.0
    stop_grace_s: float = 30.0
    health_path: str = "/health"
    env: Mapping[str, str] = field(default_factory=dict)  # added to os.environ
    cwd: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def module_available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def require_module(system: str, module: str) -> None:
    """Raise SystemUnavailable unless `module` is importable (the external system is installed)."""
    if not module_available(module):
        raise SystemUnavailable(
            f"system {system!r} needs the Python module {module!r}, which is not installed on this host "
            f"({sys.executable}); skipping it. Install it (e.g. `pip install {module}`) to run this system."
        )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def engine_command(engine_args: Mapping[str, Any], host: str, port: int,
                   python: str = sys.executable, module: str = "granikv.server") -> list[str]:
    """`python -m granikv.server` with one `--flag value` per engine argument.

    `engine_args` are EngineConfig field names; None values are left out (the engine's default
    applies), bools are spelled true/false, tuples as comma lists.
    """
    argv = [python, "-m", module, "--host", host, "--port", str(port)]
    for key, value in engine_args.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, list | tuple):
            text = ",".join(str(v) for v in value)
        else:
            text = str(value)
        argv += ["--" + key.replace("_", "-"), text]
    return argv


def external_command(template: str, values: Mapping[str, Any]) -> list[str]:
    """Format a command template (`{python} -m sglang.launch_server --port {port} ...`) and split it."""
    try:
        text = template.format(**values)
    except KeyError as e:
        raise ValueError(f"command template needs {e.args[0]!r}; known: {sorted(values)}") from e
    return shlex.split(text)


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; raises OSError subclasses when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get_json(base_url: str, path: str, timeout: float = 30.0) -> dict[str, Any]:
    status, body = http_get(base_url.rstrip("/") + path, timeout=timeout)
    if status != 200:
        raise RuntimeError(f"GET {path} answered HTTP {status}: {body[:300]!r}")
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise RuntimeError(f"GET {path} did not answer a JSON object")
    return doc


class RunningSystem:
    """A launched system. Use as a context manager: it is always stopped on exit."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.ready_after_s: float | None = None
        self._log = None

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        spec = self.spec
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(spec.log_path, "ab", buffering=0)  # noqa: SIM115 - closed in stop()
        header = f"# {time.strftime('%Y-%m-%dT%H:%M:%S')} launching {spec.name}: {shlex.join(spec.argv)}\n"
        self._log.write(header.encode())
        env = {**os.environ, **{k: str(v) for k, v in spec.env.items()}}
        env.setdefault("PYTHONUNBUFFERED", "1")
        # start_new_session: the server and everything it spawns (TP workers) form one process
        # group that stop() can signal as a whole.
        self.proc = subprocess.Popen(list(spec.argv), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, cwd=spec.cwd, start_new_session=True)

    def wait_ready(self) -> float:
        """Poll the health endpoint until it answers 200; return the seconds it took.

        Raises SystemStartError (with the log's tail) when the process exits first or the
        timeout passes.
        """
        assert self.proc is not None, "start() first"
        spec = self.spec
        t0 = time.monotonic()
        url = spec.base_url + spec.health_path
        while True:
            code = self.proc.poll()
            if code is not None:
                raise SystemStartError(
                    f"{spec.name} exited with code {code} before it was ready; log {spec.log_path}:\n"
                    f"{log_tail(spec.log_path)}")
            with contextlib.suppress(OSError):
                status, _ = http_get(url, timeout=2.0)
                if status == 200:
                    self.ready_after_s = time.monotonic() - t0
                    return self.ready_after_s
            if time.monotonic() - t0 > spec.ready_timeout_s:
                raise SystemStartError(
                    f"{spec.name} did not answer {spec.health_path} with 200 within {spec.ready_timeout_s:.0f} s "
                    f"at {spec.base_url}; log {spec.log_path}:\n{log_tail(spec.log_path)}")
            time.sleep(0.25)

    def _signal_group(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self) -> int | None:
        """SIGTERM the process group, SIGKILL it after the grace period; return the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.spec.stop_grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait()
        # Workers that outlived the leader still belong to its group: make sure they are gone.
        self._signal_group(signal.SIGKILL)
        self.returncode = self.proc.returncode
        if self._log is not None:
            self._log.write(f"# stopped, exit code {self.returncode}\n".encode())
            self._log.close()
            self._log = None
        return self.returncode

    def __enter__(self) -> RunningSystem:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def launch(spec: LaunchSpec) -> Iterator[RunningSystem]:
    """Start the system, wait until healthy, yield it, and stop it whatever happens."""
    system = RunningSystem(spec)
    system.start()
    try:
        system.wait_ready()
        yield system
    finally:
        system.stop()


def describe(spec: LaunchSpec) -> dict[str, Any]:
    """The launch, as recorded in the result file."""
    d = dataclasses.asdict(spec)
    d["argv"] = list(spec.argv)
    d["log_path"] = str(spec.log_path)
    d["env"] = dict(spec.env)
    return d


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m harness.run.systems --check sglang`: say whether a system can run here."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m harness.run.systems", description=__doc__.split("\n")[0])
    ap.add_argument("--check", default="sglang", help="system name (sglang or an engine system)")
    args = ap.parse_args(argv)
    if args.check in ENGINE_SYSTEMS:
        print(f"{args.check}: bundled engine (python -m granikv.server)")
        return 0
    try:
        require_module(args.check, args.check)
    except SystemUnavailable as e:
        print(str(e))
        return 1
    print(f"{args.check}: available")
    return 0


if __name__ == "__main__":
    sys.exit(main())
