"""Host time the server process spends on one `/generate` body before the engine sees it.

    python -m harness.diagnostics.http_parse [--out results/cpu/microbench/http-parse.json]

Why: every prompt crosses the HTTP side first — JSON parse, validation (`Server._parse_generate`)
and the int32 array the engine process is sent (`EngineProcess.submit`) — on the server's one
event loop. A burst of 256 long prompts queues behind that work, so its per-request cost is the
spacing of their arrivals at the engine (the admission ramp that TTFT sees). Host only: a CPU
host measures it; the GPU host's CPU differs.

Per Lp: a body of Lp + 100 random token ids (as SGLang's bench_serving sends them), timed
`--reps` times: `json` (json.loads of the text, as aiohttp's `request.json()`), `validate`
(`_parse_generate`: sampling params, the id checks) and `to_array` (`np.asarray(ids, int32)`, a
no-op once validation returns the array). Records the median µs of each and of their sum.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from granikv.server.app import Server
from granikv.server.text import TextCodec
from harness.microbench._timing import write_result
from harness.microbench.storage import env

VOCAB = 128256
SUFFIX = 100


class _InfoOnly:
    """The one thing Server reads of its engine loop at construction."""

    info = {"vocab_size": VOCAB, "max_context": 1 << 20, "model": "llama-3.1-8b", "device_type": "cpu"}


def run(lp: int, reps: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, size=lp + SUFFIX).tolist()
    text = json.dumps({"input_ids": ids, "stream": True, "return_logprob": False,
                       "sampling_params": {"max_new_tokens": 256, "temperature": 0.0, "ignore_eos": True}})
    server = Server(_InfoOnly(), TextCodec(None))
    phases: dict[str, list[float]] = {"json": [], "validate": [], "to_array": [], "total": []}
    perf = time.perf_counter
    for _ in range(reps):
        t0 = perf()
        body = json.loads(text)
        t1 = perf()
        g = server._parse_generate(body)
        t2 = perf()
        arr = np.asarray(g.input_ids, dtype=np.int32)
        t3 = perf()
        assert len(arr) == lp + SUFFIX
        for k, v in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
            phases[k].append(v * 1e6)
    return {"lp": lp, "tokens": lp + SUFFIX, "reps": reps,
            **{f"{k}_us": round(statistics.median(v), 1) for k, v in phases.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.diagnostics.http_parse", description=__doc__.split("\n")[0])
    ap.add_argument("--lp", default="512,16384", help="prefix lengths, comma-separated")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--out", default="results/cpu/microbench/http-parse.json")
    args = ap.parse_args(argv)
    records = []
    for lp in (int(x) for x in args.lp.split(",")):
        rec = run(lp, args.reps)
        records.append(rec)
        print(f"Lp={lp:6d}: json {rec['json_us']:8.1f} µs  validate {rec['validate_us']:8.1f} µs  "
              f"to_array {rec['to_array_us']:7.1f} µs  total {rec['total_us']:8.1f} µs", flush=True)
    write_result(args.out, vars(args), records, env=env())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
