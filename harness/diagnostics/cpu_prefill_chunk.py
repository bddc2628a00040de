"""How the prefill chunk size shapes a long prefill on the CPU: step times and total.

    python -m harness.diagnostics.cpu_prefill_chunk [--prompt 8000] [--chunks 8192 2048 1024 512 256]
        [--out results/cpu/microbench/cpu-prefill-chunk.json]

Why: the server's `--chunked-prefill-tokens auto` is 8192 with CUDA and smaller on a CPU
(granikv/runtime/engine_setup.py). On the CPU the engine runs the torch reference attention, whose
cost grows with the chunk times the context (it builds the chunk's score matrix), and nothing
else runs while a step does: the longest step bounds how late other requests, /metrics and
/health_generate are answered. This prefills one `--prompt`-token prompt on the tiny model with
each chunk size and records every step's seconds, the longest, and the total.
"""

from __future__ import annotations

import argparse
import time

from harness.microbench._timing import write_result
from harness.microbench.storage import env


def prefill_steps(chunk: int, prompt: int) -> list[float]:
    from granikv.config import EngineConfig
    from granikv.engine.engine import Engine
    from granikv.engine.request import SamplingParams

    eng = Engine(EngineConfig(model="tiny", device="cpu", kernel_impl="torch", num_slots=prompt + 64,
                              max_context=8192, chunked_prefill_tokens=chunk, cuda_graphs=False))
    eng.add_request([5] * prompt, SamplingParams(max_new_tokens=1))
    steps = []
    while eng.has_work():
        t0 = time.perf_counter()
        eng.step()
        steps.append(round(time.perf_counter() - t0, 3))
    return steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.diagnostics.cpu_prefill_chunk",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--prompt", type=int, default=8000)
    ap.add_argument("--chunks", type=int, nargs="+", default=[8192, 2048, 1024, 512, 256])
    ap.add_argument("--out", default="results/cpu/microbench/cpu-prefill-chunk.json")
    args = ap.parse_args(argv)
    records = []
    for chunk in args.chunks:
        steps = prefill_steps(chunk, args.prompt)
        rec = {"chunk": chunk, "prompt": args.prompt, "steps": len(steps), "step_s": steps,
               "longest_step_s": max(steps), "total_s": round(sum(steps), 3)}
        records.append(rec)
        print(f"chunk {chunk:5d}: {len(steps)} steps, longest {rec['longest_step_s']:.2f} s, "
              f"total {rec['total_s']:.2f} s", flush=True)
    write_result(args.out, vars(args), records, env=env())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
