"""Host time of one request's way through the scheduler, without the forward: the engine-loop
work a prefill step pays per request besides launching kernels.

    python -m harness.diagnostics.admission [--out results/cpu/microbench/admission.json]

Why: `extend_steps --engine --py-profile` on the H200 host found, in an extend step of
8 requests behind a 16K-token cached prefix, ~11 ms of Python that grows with Lp: the prompt,
a 16K-int list, was converted to an int32 array three times per request (admission, caching
the prompt after its prefill, finishing), prompt + outputs concatenated four times, and the
scheduler's prefix key rebuilt as a 16K-tuple on every pass. `harness.microbench.storage`
times the storage calls on arrays, so it never saw the conversions.

Scenario, per system and Lp: the engine (tiny model on the CPU; 64K slots, at most 256
running, 8192-token prefill budget; no forward is run), the Lp-token prefix cached by a first
request; then `--rounds` rounds of `--batch` requests, each the prefix + a 100-token suffix
handed over as Python lists (as in-process callers pass them) or, with `--prompts array`, as the
int32 arrays the server process sends the engine process (both built before the timing).
Per round: `Engine.add_request` of each (checks, Request, queue: `create`), `schedule()`
(admission: radix match, HOT slab lookup, slots: `schedule`), `commit_prefill` of every item
(the prompt is cached: `commit`), one output token each, and `finish` (inserted into the radix
tree, freed: `finish`). Records the median µs per request of each phase and of their sum over
the rounds, and `unpickle_us`: receiving one prompt in that form over the server's pipe. Host
only, so a CPU host measures it; the device host's CPU differs, so these are not the H200
host's microseconds (`harness.microbench.extend_steps --engine --py-profile` measures those there).
"""

from __future__ import annotations

import argparse
import gc
import pickle
import time

import numpy as np

from granikv.config import EngineConfig
from granikv.engine.engine import Engine
from granikv.engine.request import Request, SamplingParams
from harness.microbench._timing import write_result
from harness.microbench.storage import env

SYSTEMS = ("paged", "cascade", "granikv")
NUM_SLOTS = 1 << 16  # room for the prefix and a round's suffixes in every system
SUFFIX = 100
PHASES = ("create", "schedule", "commit", "finish")


def run(system: str, lp: int, batch: int, rounds: int, seed: int = 0, form: str = "list") -> dict:
    rng = np.random.default_rng(seed)
    max_ctx = lp + 1024
    # the engine itself (tiny model on the CPU, no forward is run): its add_request, scheduler
    # and storage are what the timing covers
    eng = Engine(EngineConfig(model="tiny", system=system, device="cpu", dtype="float32", num_slots=NUM_SLOTS,
                              max_running=256, max_context=max_ctx, chunked_prefill_tokens=8192,
                              min_prefix_for_hot=min(lp, 512), cuda_graphs=False))
    sched = eng.scheduler
    prefix = rng.integers(1, 1000, size=lp).tolist()
    one = SamplingParams(max_new_tokens=1, ignore_eos=True)

    def prompts(k: int) -> list:
        ps = [prefix + rng.integers(1, 1000, size=SUFFIX).tolist() for _ in range(k)]
        return [np.asarray(p, dtype=np.int32) for p in ps] if form == "array" else ps

    def new_reqs(ps: list[list[int]]) -> list[Request]:
        return [eng.add_request(p, one, shared_prefix_len=lp) for p in ps]

    def one_round(times: dict[str, list[float]] | None) -> None:
        ps = prompts(batch)  # the client's lists exist before the engine sees them
        perf = time.perf_counter_ns
        t0 = perf()
        reqs = new_reqs(ps)
        t1 = perf()
        step = sched.schedule()
        t2 = perf()
        if step is None or step.mode != "extend" or len(step.prefill) != len(reqs):
            got = None if step is None else (step.mode, len(step.prefill))
            raise RuntimeError(f"expected one extend step of {len(reqs)} requests, got {got}")
        for it in step.prefill:
            sched.commit_prefill(it)
        t3 = perf()
        for r in reqs:
            r.output_ids.append(7)
            sched.finish(r)
            del eng.requests[r.rid]
        t4 = perf()
        if times is not None:
            for k, (a, b) in zip(PHASES, ((t0, t1), (t1, t2), (t2, t3), (t3, t4))):
                times[k].append((b - a) / 1e3 / len(reqs))

    first = new_reqs(prompts(1))[0]  # caches the prefix (granikv: promotes it into a slab), in chunks
    while first.kv_len < first.prefill_target or not first.kv_len:
        for it in sched.schedule().prefill:
            sched.commit_prefill(it)
    first.output_ids.append(7)
    sched.finish(first)
    del eng.requests[first.rid]
    one_round(None)  # warm-up
    gc.collect()
    times: dict[str, list[float]] = {k: [] for k in PHASES}
    for _ in range(rounds):
        one_round(times)
    total = [sum(v) for v in zip(*times.values())]
    # what the engine process pays to receive one prompt from the server process (Pipe.recv
    # unpickles it), in this form
    blobs = [pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL) for p in prompts(batch)]
    perf = time.perf_counter_ns
    unpickle = []
    for _ in range(rounds):
        for b in blobs:
            t0 = perf()
            pickle.loads(b)
            unpickle.append((perf() - t0) / 1e3)
    rec = {"system": system, "Lp": lp, "batch": batch, "rounds": rounds, "suffix": SUFFIX, "prompts": form,
           "us_per_request": round(float(np.median(total)), 2)}
    rec.update({f"{k}_us": round(float(np.median(v)), 2) for k, v in times.items()})
    rec["unpickle_us"] = round(float(np.median(unpickle)), 2)
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lp", default="512,16384")
    ap.add_argument("--batch", type=int, default=8, help="requests per prefill step")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--prompts", default="list", help="list (in-process callers) | array (int32, as the server "
                    "process sends them) | list,array")
    ap.add_argument("--label", default="", help="recorded as is (e.g. before/after a change)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    records = []
    print(f"{'system':8} {'Lp':>6} {'µs/request':>10} " + " ".join(f"{p + ' µs':>11}" for p in PHASES))
    for form in args.prompts.split(","):
        for system in args.systems.split(","):
            for lp in (int(x) for x in args.lp.split(",")):
                rec = run(system, lp, args.batch, args.rounds, form=form)
                rec["label"] = args.label
                records.append(rec)
                print(f"{system:8} {lp:6d} {rec['us_per_request']:10.1f} "
                      + " ".join(f"{rec[p + '_us']:11.1f}" for p in PHASES)
                      + f"  ({form}; unpickle {rec['unpickle_us']:.1f} µs)", flush=True)
    if args.out:
        write_result(args.out, vars(args), records, env=env())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
