"""How long `python -m granikv.server` takes from launch to ready, and where that time goes.

    python -m harness.diagnostics.server_start [--runs 5] [--out results/cpu/microbench/server-start.json]

Why: every serving cell starts a server, and on the GPU host start-up (each cell's
`startup` record) is a large share of a cell's device time. The server reports its own split in `/server_info`
(`startup`: the engine's `build_s` and `capture_s`, the engine process's `engine_s`, the server's
spawn-to-ready `process_s`); this launches the server `--runs` times with the given engine flags
and records, per run, the seconds from launch to its "ready" line (`ready_s`, what
`harness.run.systems` waits for) beside that split. The default is the tiny model on the CPU, so a
CPU host measures it; on a GPU host pass e.g. `--device cuda --model llama-3.1-8b`.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

from harness.microbench._timing import write_result
from harness.microbench.storage import env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_once(flags: list[str], timeout_s: float) -> dict:
    port = _free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "granikv.server", "--port", str(port), "--log-level", "warning",
                             *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:  # the server prints one line when it serves
            lines.append(line)
            if "ready on" in line:
                break
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"no ready line within {timeout_s:.0f} s")
        else:
            raise RuntimeError("the server exited before it was ready:\n" + "".join(lines[-20:]))
        ready_s = time.perf_counter() - t0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=30) as r:
            info = json.load(r)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {"ready_s": round(ready_s, 3), **(info.get("startup") or {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.diagnostics.server_start", description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--extra", default="", help="more server flags, one string (e.g. '--system granikv')")
    ap.add_argument("--timeout-s", type=float, default=300)
    ap.add_argument("--out", default="results/cpu/microbench/server-start.json")
    args = ap.parse_args(argv)
    flags = ["--model", args.model, "--device", args.device, *args.extra.split()]
    runs = []
    for i in range(args.runs):
        rec = start_once(flags, args.timeout_s)
        runs.append(rec)
        print(f"run {i}: " + "  ".join(f"{k} {v}" for k, v in rec.items()), flush=True)
    keys = sorted({k for r in runs for k in r if isinstance(r[k], (int, float))})
    median = {k: round(statistics.median(r[k] for r in runs if k in r), 3) for k in keys}
    print("median: " + "  ".join(f"{k} {v}" for k, v in median.items()))
    write_result(args.out, vars(args), runs, env=env(), median=median)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
