"""Storage-layer microbenchmark: host bookkeeping per decode step at engine scale.

    python -m harness.microbench.storage [--out results/cpu/microbench/storage.json]

Scenario (the paper's headline cell, bookkeeping only, no GPU work): a 1M-slot space, a 16K-token
shared prefix, 500 requests with ShareGPT-like suffixes (16–512 tokens, seeded) and 256 output
tokens each, at most 256 running. Each decode step grows every running request by one slot
(`grow_batch`); requests are admitted as rows free up (the first one's prompt is cached right
after its prefill, so the rest share the prefix: a HOT slab for granikv, shared pages for paged)
and finished (inserted into the radix tree) when they reach their output length. The figure of
merit is host microseconds per decode step, admit/finish amortized over the steps.

Also times the single operations on their own (admit, cache_prompt, finish of one request,
grow_batch of 256 rows, COLD alloc/free of 256 slots, slab alloc/release). Wall clock
(`time.perf_counter_ns`) and, for the decode step, the thread's CPU time too
(`time.thread_time_ns`), which a busy shared host inflates less. Each repetition starts after a
full garbage collection (outside the timing): a finished run's radix tree and admissions are
reference cycles, and collecting them inside the next repetition's timing made one repetition in
five an outlier several times slower than the others.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from granikv.memory import ColdPool, HotPool
from granikv.systems import make_storage
from harness.run.provenance import git_sha

NUM_SLOTS = 1 << 20
LP = 16384
NUM_REQUESTS = 500
OUTPUT_LEN = 256
BATCH = 256
SYSTEMS = ("paged", "cascade", "granikv")


def env() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    sha = git_sha(None)
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "loadavg_1m": os.getloadavg()[0],
            "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__, "git_sha": sha,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def sharegpt_like_suffixes(n: int, seed: int = 42) -> np.ndarray:
    """Lengths in [16, 512], log-normal like ShareGPT user turns (median ~100 tokens)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(mean=np.log(100), sigma=0.9, size=n), 16, 512).astype(np.int64)


def run_decode(system: str, seed: int = 42, num_slots: int | None = None, lp: int | None = None,
               num_requests: int | None = None, output_len: int | None = None, batch: int | None = None) -> dict:
    """The 500-request run (module constants unless given); returns timings in microseconds and
    the storage counters."""
    num_slots = num_slots or NUM_SLOTS
    lp = lp or LP
    num_requests = num_requests or NUM_REQUESTS
    output_len = output_len or OUTPUT_LEN
    batch = batch or BATCH
    rng = np.random.default_rng(seed)
    st = make_storage(system, num_slots + 1, page_size=16, hot_fraction=0.2, max_running=batch,
                      max_context=lp + 512 + output_len + 16)
    prefix = rng.integers(1000, 120000, size=lp, dtype=np.int32)
    suffix_lens = sharegpt_like_suffixes(num_requests, seed)
    prompts = [np.concatenate([prefix, rng.integers(0, 120000, size=int(n), dtype=np.int32)])
               for n in suffix_lens]
    outputs = rng.integers(0, 120000, size=(num_requests, output_len), dtype=np.int32)

    pending = list(range(num_requests))[::-1]
    running: dict[int, tuple[int, object]] = {}  # row -> (request id, admission)
    generated = np.zeros(batch, dtype=np.int64)
    wall = {"admit": 0, "finish": 0, "grow": 0}
    cpu = dict(wall)
    n_admit = n_finish = steps = 0
    grow_samples = []
    cached = 0
    perf, tcpu = time.perf_counter_ns, time.thread_time_ns
    while pending or running:
        while pending and len(running) < batch:
            i = pending[-1]
            t0, c0 = perf(), tcpu()
            adm = st.admit(prompts[i], shared_prefix_len=lp)
            if adm is not None:
                st.cache_prompt(adm, prompts[i])  # the prefill finished: later requests reuse it
            wall["admit"] += perf() - t0
            cpu["admit"] += tcpu() - c0
            if adm is None:
                break
            pending.pop()
            n_admit += 1
            cached += adm.cached_len
            running[adm.row] = (i, adm)
            generated[adm.row] = 0
        rows = np.fromiter(running.keys(), dtype=np.int64, count=len(running))
        t0, c0 = perf(), tcpu()
        slots = st.grow_batch(rows)
        dt = perf() - t0
        cpu["grow"] += tcpu() - c0
        assert slots is not None, "the scenario fits: no retraction expected"
        wall["grow"] += dt
        grow_samples.append(dt)
        steps += 1
        generated[rows] += 1
        for r in rows[generated[rows] >= output_len].tolist():
            i, adm = running.pop(r)
            tokens = np.concatenate([prompts[i], outputs[i]])  # the engine has these already
            t0, c0 = perf(), tcpu()
            st.finish(adm, tokens)
            wall["finish"] += perf() - t0
            cpu["finish"] += tcpu() - c0
            n_finish += 1
    s = st.stats()
    return {
        "steps": steps, "requests": n_admit, "cached_tokens": cached,
        "grow_us_median": float(np.median(grow_samples)) / 1e3,
        "grow_us_mean": wall["grow"] / steps / 1e3,
        "admit_us_mean": wall["admit"] / n_admit / 1e3,
        "finish_us_mean": wall["finish"] / n_finish / 1e3,
        "step_us": sum(wall.values()) / steps / 1e3,
        "step_cpu_us": sum(cpu.values()) / steps / 1e3,
        "cpu_us": {"grow_batch": cpu["grow"] / steps / 1e3, "admit": cpu["admit"] / n_admit / 1e3,
                   "finish": cpu["finish"] / n_finish / 1e3},
        "hot_admits": s.get("hot_admits", 0), "hot_hits": s.get("hot_hits", 0),
        "hot_fallbacks": s.get("hot_fallbacks", 0), "live_after": s["live_requests"],
        "cached_slots_after": s["cached_slots"],
    }


def _median_us(fn, reps: int) -> float:
    perf = time.perf_counter_ns
    out = []
    for _ in range(reps):
        t0 = perf()
        fn()
        out.append(perf() - t0)
    return float(np.median(out)) / 1e3


def request_ops(system: str, n: int = 300, seed: int = 7) -> list[dict]:
    """Each storage call on its own, at engine scale: median over n requests (16K shared prefix,
    100-token suffix, 256 outputs) and over n grow_batch calls of 256 rows."""
    rng = np.random.default_rng(seed)
    st = make_storage(system, NUM_SLOTS + 1, max_running=BATCH, max_context=LP + 1024)
    prefix = rng.integers(1000, 120000, size=LP, dtype=np.int32)
    prompts = [np.concatenate([prefix, rng.integers(0, 120000, size=100, dtype=np.int32)]) for _ in range(n)]
    full = [np.concatenate([p, rng.integers(0, 120000, size=OUTPUT_LEN, dtype=np.int32)]) for p in prompts]
    first = st.admit(prompts[0], shared_prefix_len=LP)
    st.cache_prompt(first, prompts[0])
    perf = time.perf_counter_ns
    t = {"admit": [], "cache_prompt": [], "finish": [], "grow_batch": []}
    for p, f in zip(prompts[1:], full[1:]):
        t0 = perf()
        adm = st.admit(p, shared_prefix_len=LP)
        t1 = perf()
        st.cache_prompt(adm, p)
        t2 = perf()
        st.grow(adm, OUTPUT_LEN)
        t3 = perf()
        st.finish(adm, f)
        t4 = perf()
        t["admit"].append(t1 - t0)
        t["cache_prompt"].append(t2 - t1)
        t["finish"].append(t4 - t3)
    live = [st.admit(p, shared_prefix_len=LP) for p in prompts[1:BATCH]] + [first]
    rows = np.array([a.row for a in live], dtype=np.int64)
    for _ in range(n):
        t0 = perf()
        st.grow_batch(rows)
        t["grow_batch"].append(perf() - t0)
    return [{"op": op, "system": system, "n": BATCH if op == "grow_batch" else LP + 100,
             "us": float(np.median(v)) / 1e3, "us_p10": float(np.percentile(v, 10)) / 1e3}
            for op, v in t.items()]


def pool_ops() -> list[dict]:
    recs = []
    hot = HotPool(1, NUM_SLOTS // 5)
    cold = ColdPool(1 + NUM_SLOTS // 5, NUM_SLOTS + 1, lender=hot)

    def cold_cycle():
        cold.free(cold.alloc(BATCH))

    recs.append({"op": "cold_alloc_free", "system": "granikv", "n": BATCH, "us": _median_us(cold_cycle, 2000)})

    def slab_cycle():
        hot.release(hot.alloc_slab(LP))

    recs.append({"op": "slab_alloc_release", "system": "granikv", "n": LP, "us": _median_us(slab_cycle, 2000)})
    return recs


BEGIN, END = "<!-- storage-table:begin -->", "<!-- storage-table:end -->"


def render_notes(result: dict) -> str:
    """Markdown tables of a result file (the figures the perf notes show)."""
    env, recs = result["env"], result["records"]
    load = env.get("loadavg_1m")
    load = f"{load:.2f}" if isinstance(load, float) else "?"
    lines = [f"Machine: {env['cpu']} ({env['cpu_count']} cores, 1-min load {load} at start), "
             f"Python {env['python']}, numpy {env['numpy']}, git {str(env['git_sha'])[:10]}, {env['started_at']}.",
             "",
             "| system | decode steps | µs/step (best rep) | µs/step (median rep) | CPU µs/step (best) "
             "| grow_batch µs (median) | admit+cache_prompt µs (mean) | finish µs (mean) |",
             "|---|---|---|---|---|---|---|---|"]
    for system in SYSTEMS:
        steps = [r for r in recs if r["op"] == "decode_step" and r["system"] == system]
        if not steps:
            continue
        best = min(steps, key=lambda r: r["us"])
        rep = best["rep"]
        pick = {r["op"]: r for r in recs if r["system"] == system and r.get("rep") == rep}
        med = float(np.median([r["us"] for r in steps]))
        lines.append(f"| {system} | {best['steps']} | {best['us']:.1f} | {med:.1f} | "
                     f"{min(r['cpu_us'] for r in steps):.1f} | {pick['grow_batch']['us']:.1f} | "
                     f"{pick['admit']['us']:.1f} | {pick['finish']['us']:.1f} |")
    lines += ["", "| single operation | system | n | µs (median) |", "|---|---|---|---|"]
    for r in recs:
        if "rep" not in r:
            lines.append(f"| {r['op']} | {r['system']} | {r['n']} | {r['us']:.1f} |")
    return "\n".join(lines)


def write_notes(result_path: str, notes_path: str) -> None:
    """Replace the generated block of the Storage layer section of the perf notes."""
    table = render_notes(json.loads(Path(result_path).read_text()))
    doc = Path(notes_path).read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{notes_path} has no {BEGIN} ... {END} block")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    Path(notes_path).write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")
    print(f"updated {notes_path}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/cpu/microbench/storage.json")
    ap.add_argument("--reps", type=int, default=3, help="runs of the 500-request scenario per system")
    ap.add_argument("--notes-into", default=None,
                    help="only render --out (existing) into this markdown file's storage-table block")
    args = ap.parse_args(argv)
    if args.notes_into:
        write_notes(args.out, args.notes_into)
        return
    info = env()
    records = []
    print(f"{'system':8} {'steps':>5} {'grow µs (med)':>13} {'admit µs':>9} {'finish µs':>9} "
          f"{'µs/step':>8} {'cpu µs/step':>11}  "
          f"(B={BATCH}, Lp={LP}, {NUM_REQUESTS} req × {OUTPUT_LEN} out, {NUM_SLOTS} slots)")
    for system in SYSTEMS:
        runs = []
        for _ in range(args.reps):
            gc.collect()  # the previous run's garbage is not collected inside this one's timing
            runs.append(run_decode(system, seed=42))
        best = min(runs, key=lambda r: r["step_us"])  # least disturbed run; all runs are kept below
        print(f"{system:8} {best['steps']:5d} {best['grow_us_median']:13.1f} {best['admit_us_mean']:9.1f} "
              f"{best['finish_us_mean']:9.1f} {best['step_us']:8.1f} {best['step_cpu_us']:11.1f}")
        for rep, r in enumerate(runs):
            base = {"system": system, "B": BATCH, "Lp": LP, "num_slots": NUM_SLOTS, "rep": rep,
                    "requests": r["requests"], "steps": r["steps"]}
            records += [
                {**base, "op": "decode_step", "us": r["step_us"], "cpu_us": r["step_cpu_us"],
                 "hot_admits": r["hot_admits"], "hot_hits": r["hot_hits"], "hot_fallbacks": r["hot_fallbacks"],
                 "cached_tokens": r["cached_tokens"]},
                {**base, "op": "grow_batch", "us": r["grow_us_median"], "us_mean": r["grow_us_mean"],
                 "cpu_us": r["cpu_us"]["grow_batch"]},
                {**base, "op": "admit", "us": r["admit_us_mean"], "cpu_us": r["cpu_us"]["admit"]},
                {**base, "op": "finish", "us": r["finish_us_mean"], "cpu_us": r["cpu_us"]["finish"]},
            ]
    print("single operations (median µs):")
    single = []
    for system in ("paged", "granikv"):
        gc.collect()
        single += request_ops(system)
    for rec in single + pool_ops():
        print(f"  {rec['op']:20} {rec['system']:8} n={rec['n']:6d} {rec['us']:8.1f}")
        records.append(rec)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"env": info, "records": records}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
