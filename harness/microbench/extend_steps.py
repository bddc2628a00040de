"""Extend (prefill) attention at the shapes of serving steps: one split vs key splits.

    python -m harness.microbench.extend_steps                 # GPU: Llama-3.1-8B heads, bf16
    python -m harness.microbench.extend_steps --device cpu    # dry run: tiny shapes, interpreter

Why: in a ShareGPT run behind a long shared prefix, requests reach the engine a few at a time,
so most extend steps prefill 1-3 suffixes of ~20-300 tokens; with G=4 query heads packed per KV
head that is 1-15 query tiles x 8 KV heads, i.e. 8-120 programs on 132 SMs, each walking the
whole cached prefix alone: in H200 cells at Lp=16K, B=256 without key splits, such steps took
many times the time of reading the weights once (`engine.step_log.extend.recent`).
For each case (n requests x `new` tokens behind an Lp-token prefix, scattered slots) this
times the extend kernel with one split and with the splits `extend_splits` picks (`--splits`
adds fixed counts, to tune ExtendSplitPolicy), and reports the floor max(FLOPs / 779 TFLOP/s,
bytes / 4.48 TB/s) (docs/design.md, "Numbers to design against") and the fraction reached.
FLOPs = 4 Hq d x (keys each new token sees); bytes = the K/V of every request read once + q, o.
Times are medians of CUDA-graph replays with the L2 flushed (_timing.py). Records:
{"Lp", "n", "new", "splits", "us", "TFLOPs", "floor_us", "frac_of_floor", "rel_err"}.

`--engine` times whole extend steps of the engine instead (`Engine.step()` wall time, CUDA
synchronized, and a torch.profiler window of the same step for its GPU-busy time): for each case,
n requests of `new` fresh tokens behind an Lp-token prefix the engine has cached, one extend step
each, `--reps` times, with `extend_split_keys` on and off. The step's host share (1 - busy/wall)
says how much of a small extend step is launch and Python work rather than kernels. Records:
{"mode": "engine", "system", "tp", "Lp", "n", "new", "split", "step_ms", "gpu_busy_ms", "host_share"}.
`--tp 2` runs the default variant as a TP engine (one per process): the TP extend step's cost.

On CPU (no CUDA, or --device cpu) the kernels run in the Triton interpreter on tiny shapes:
the numbers only prove the script runs; nothing is written unless --out is given.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import torch

GEMM_TFLOPS = 779.0  # measured bf16 GEMM ceiling on the H200 (docs/design.md, "Numbers to design against")
READ_TBPS = 4.48  # measured cuDNN decode read bandwidth on the H200


def _setup(device: str) -> None:
    if device == "cpu":  # before granikv.kernels (triton.jit reads it at decoration time)
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _case(lp: int, n: int, new: int, hq: int, hkv: int, d: int, dtype, dev, gen) -> dict:
    total = lp + new
    slots = n * total
    # drawn on the device (a 64 x 16K case is 2 x 1M x 8 x 128 values)
    k = torch.randn(slots, hkv, d, generator=gen, device=dev, dtype=dtype)
    v = torch.randn(slots, hkv, d, generator=gen, device=dev, dtype=dtype)
    table = torch.randperm(slots, generator=gen, device=dev).to(torch.int32).view(n, total)
    q = torch.randn(n * new, hq, d, generator=gen, device=dev, dtype=dtype)
    i32 = {"dtype": torch.int32, "device": dev}
    return {
        "k": k, "v": v, "table": table, "q": q, "out": torch.empty_like(q),
        "rows": torch.arange(n, **i32), "indptr": torch.arange(0, n * new + 1, new, **i32),
        "prefix": torch.full((n,), lp, **i32),
    }


def _cost(lp: int, n: int, new: int, hq: int, hkv: int, d: int, elt: int) -> tuple[float, float]:
    keys = n * sum(lp + i + 1 for i in range(new))
    flops = 4.0 * hq * d * keys
    nbytes = n * (lp + new) * 2 * hkv * d * elt + 2 * n * new * hq * d * elt
    return flops, nbytes


def run(args) -> list[dict]:
    from granikv.kernels import ExtendConfig, ExtendSplitPolicy, extend, extend_splits
    from granikv.kernels._common import num_sms
    from granikv.kernels.ref import extend_ref
    from harness.microbench._timing import bench

    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    elt = torch.empty((), dtype=dtype).element_size()
    cfg = ExtendConfig() if dev.type == "cuda" else ExtendConfig(block_m=16, block_n=16, num_warps=4, num_stages=2)
    policy = dataclasses.replace(ExtendSplitPolicy.named(args.rule), min_split_len=args.min_split_len)
    hq, hkv, d = args.heads
    sms = num_sms(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    sm = d ** -0.5
    records: list[dict] = []
    for lp in args.lp:
        for n, new in args.cases:
            c = _case(lp, n, new, hq, hkv, d, dtype, dev, gen)
            auto = extend_splits(n * new, n, hq, hkv, d, lp + new, cfg.block_m, sms, policy)
            flops, nbytes = _cost(lp, n, new, hq, hkv, d, elt)
            floor_us = max(flops / (GEMM_TFLOPS * 1e12), nbytes / (READ_TBPS * 1e12)) * 1e6
            ref = None
            if n * new * (lp + new) <= args.check_limit:
                ref = extend_ref(c["q"].float(), c["k"].float(), c["v"].float(), c["table"], c["rows"],
                                 c["indptr"], c["prefix"], sm)
            for splits in sorted({auto if x == "auto" else int(x) for x in args.splits}):
                def fn(splits=splits, c=c, new=new):
                    return extend(c["q"], c["k"], c["v"], c["table"], c["rows"], c["indptr"], c["prefix"], sm,
                                  out=c["out"], max_qo_len=new, cfg=cfg, splits=splits, policy=policy)

                t = bench(fn, rep_ms=args.rep_ms)
                rel = None
                if ref is not None:
                    fn()
                    rel = float((c["out"].cpu().double() - ref).norm() / ref.norm().clamp_min(1e-30))  # ref: CPU
                rec = {"Lp": lp, "n": n, "new": new, "splits": splits, "auto_splits": auto, "us": round(t.us, 2),
                       "p20_us": round(t.p20_us, 2), "p80_us": round(t.p80_us, 2), "graphed": t.graphed,
                       "TFLOPs": round(flops / (t.us * 1e-6) / 1e12, 1), "floor_us": round(floor_us, 2),
                       "frac_of_floor": round(floor_us / t.us, 3), "rel_err": rel,
                       "Hq": hq, "Hkv": hkv, "d": d, "dtype": str(dtype).removeprefix("torch.")}
                records.append(rec)
                print(f"  Lp={lp:6d} n={n:3d} new={new:4d} splits={splits:2d}: {t.us:9.1f} us "
                      f"{rec['TFLOPs']:6.1f} TFLOP/s, floor {floor_us:8.1f} us ({rec['frac_of_floor']:.2f})"
                      + (f", rel err {rel:.1e}" if rel is not None else ""), flush=True)
    return records


def run_engine(args) -> list[dict]:
    """Whole extend steps of the engine at the kernel cases' shapes: splits on and off, and with
    `--extend-graphs` a third engine whose small extend steps replay CUDA graphs.

    Both engines (one model, two KV caches) are built first and their timed steps alternate
    on/off within each case: timing every case with splits on, then every case with splits off,
    lets identical work differ by milliseconds between the two passes (host warm-up of a fresh
    engine), which swamps the kernel difference. Each record also splits
    the profiled step's host time by engine phase (granikv.trace spans) and lists the costliest
    host ops, because a small extend step is mostly host time."""
    import random
    import statistics

    from torch.profiler import ProfilerActivity, profile

    from granikv.config import EngineConfig
    from granikv.engine.engine import Engine
    from granikv.engine.request import SamplingParams
    from granikv.model.spec import load_spec
    from granikv.model.weights import load_model
    from granikv.runtime.tp import create_engine
    from harness.microbench.engine_steps import busy_and_span_ms, sync

    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    spec = load_spec(args.model)
    max_ctx = max(args.lp) + max(new for _, new in args.cases) + 64
    # one model shared by the TP=1 variants; TP engines load their own shards
    model = load_model(spec, None, "dummy", None, 0, dtype, dev, max_positions=max_ctx) if args.tp == 1 else None
    one = SamplingParams(max_new_tokens=1, ignore_eos=True)
    rng = random.Random(0)
    used: set[int] = set()  # first suffix tokens so far (see _fresh)
    # variant -> (key splits, extend-graph token buckets, split rule)
    variants = {"split": (True, (), "fill"), "no-split": (False, (), "fill")}
    if args.extend_graphs:
        variants["split+graphs"] = (True, tuple(args.extend_graphs), "fill")
    if args.rule != "fill":  # the same steps with the other split rule (EngineConfig.extend_split_rule)
        variants[f"split:{args.rule}"] = (True, (), args.rule)
        if args.extend_graphs:
            variants[f"split:{args.rule}+graphs"] = (True, tuple(args.extend_graphs), args.rule)
    if args.tp > 1:
        # one TP engine per process (rank 0 owns the default process group): the default
        # variant alone, which is what the TP extend step's fixed cost is measured on
        variants = {"split": variants["split"]}
    engines = {}
    for name, (split, buckets, rule) in variants.items():
        cfg = EngineConfig(model=args.model, device=args.device, system=args.system, max_context=max_ctx,
                           max_running=max(8, max(n for n, _ in args.cases)), cuda_graphs=bool(buckets),
                           capture_at_start=False, min_prefix_for_hot=min(args.lp), extend_split_keys=split,
                           extend_graph_tokens=buckets, extend_graph_reqs=(2, 4, 8, 16, 32, 64), extend_split_rule=rule,
                           kernel_impl="triton", kv_budget_gb=16.0 if dev.type == "cuda" else None, tp=args.tp)
        # at TP > 1 the engine is a TP engine (rank 0 here, the other ranks in worker processes
        # with their own shards), stepped like any engine: the step's wall time then holds the
        # command broadcast and the all-reduces that a TP=2 extend step pays
        engines[name] = Engine(cfg, model=model) if args.tp == 1 else create_engine(cfg)
    try:
        records: list[dict] = []
        for lp in args.lp:
            prefix = [rng.randrange(spec.vocab_size) for _ in range(lp)]
            for eng in engines.values():  # caches the prefix
                _finish(eng, [eng.add_request(p, one, shared_prefix_len=lp)
                              for p in _fresh(prefix, 1, 16, spec.vocab_size, rng, used)])
            for n, new in args.cases:
                times: dict[str, list[float]] = {name: [] for name in engines}
                shapes: dict[str, list[tuple]] = {name: [] for name in engines}
                for rep in range(args.reps + 1):  # rep 0: this shape's first launch (or capture), untimed
                    for name, eng in engines.items():
                        reqs = [eng.add_request(p, one, shared_prefix_len=lp)
                                for p in _fresh(prefix, n, new, spec.vocab_size, rng, used)]
                        sync()
                        t0 = time.perf_counter()
                        eng.step()
                        sync()
                        if rep:
                            times[name].append((time.perf_counter() - t0) * 1e3)
                            shapes[name].append(tuple(eng.step_log.extend.recent[-1][:2]))
                        _finish(eng, reqs)
                for name, eng in engines.items():
                    reqs = [eng.add_request(p, one, shared_prefix_len=lp)
                            for p in _fresh(prefix, n, new, spec.vocab_size, rng, used)]
                    sync()
                    with profile(activities=[ProfilerActivity.CPU]
                                 + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])) as prof:
                        t0 = time.perf_counter()
                        eng.step()
                        sync()
                        wall = (time.perf_counter() - t0) * 1e3
                    busy, _ = busy_and_span_ms(prof) if dev.type == "cuda" else (0.0, 0.0)
                    _finish(eng, reqs)
                    phases, top = host_breakdown(prof)
                    py_top = None
                    if args.py_profile:
                        reqs = [eng.add_request(p, one, shared_prefix_len=lp)
                                for p in _fresh(prefix, n, new, spec.vocab_size, rng, used)]
                        sync()
                        py_top = python_profile(eng.step, sync)
                        _finish(eng, reqs)
                    rec = {"mode": "engine", "system": args.system, "model": spec.name, "tp": args.tp, "Lp": lp, "n": n,
                           "new": new, "variant": name, "split": variants[name][0],
                           "extend_graphs": list(variants[name][1]), "split_rule": variants[name][2], "reps": args.reps,
                           "step_ms": round(statistics.median(times[name]), 3),
                           "step_ms_min": round(min(times[name]), 3), "step_shapes": sorted(set(shapes[name])),
                           "profiled_wall_ms": round(wall, 3), "gpu_busy_ms": round(busy, 3),
                           "host_share": round(1 - busy / wall, 3) if dev.type == "cuda" and wall else None,
                           "host_phase_ms": phases, "host_top_ops": top}
                    if py_top is not None:
                        rec["host_top_python"] = py_top
                    records.append(rec)
                    print(f"  engine {args.system} Lp={lp:6d} n={n:3d} new={new:4d} {name:12s}: "
                          f"step {rec['step_ms']:8.2f} ms (shapes {rec['step_shapes']}), GPU busy {busy:7.2f} ms "
                          f"of {wall:7.2f}; host by phase {phases}", flush=True)
                    for row in py_top or []:
                        print(f"      py {row[2]:8.3f} ms own {row[3]:8.3f} ms cum x{row[1]:<5d} {row[0]}", flush=True)
        return records
    finally:
        for eng in engines.values():
            close = getattr(eng, "close", None)  # TP engines stop their worker processes
            if close is not None:
                close()


def host_breakdown(prof, top: int = 8) -> tuple[dict[str, float], list[list]]:
    """(CPU ms per engine phase — the granikv.trace spans —, the `top` host ops by self CPU
    time as [name, calls, self ms]) of one profiled step. With CUDA activity on, a span also
    appears as a GPU-side annotation of the same name and no CPU time; the larger of the two
    is the span's host time (the GPU one reads 0.0)."""
    phases: dict[str, float] = {}
    ops = []
    for ev in prof.key_averages():
        name = ev.key
        if name.startswith("granikv::"):
            k = name.removeprefix("granikv::")
            phases[k] = max(phases.get(k, 0.0), round(ev.cpu_time_total / 1e3, 3))
        elif ev.self_cpu_time_total > 0:
            ops.append([name, int(ev.count), round(ev.self_cpu_time_total / 1e3, 3)])
    ops.sort(key=lambda o: -o[2])
    return phases, ops[:top]


def python_profile(fn, sync, top: int = 12) -> list[list]:
    """Run `fn` (one engine step) under cProfile and return the `top` Python functions by own
    time as [file:line(function), calls, own ms, cumulative ms]. torch.profiler lists ops only,
    and a small extend step's host time is mostly Python between them."""
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    fn()
    sync()
    pr.disable()
    st = pstats.Stats(pr)
    rows = []
    for (file, line, func), (_cc, ncalls, tt, ct, _callers) in st.stats.items():
        rows.append([f"{file.split('site-packages/')[-1].split('/work/main/')[-1]}:{line}({func})",
                     int(ncalls), round(tt * 1e3, 3), round(ct * 1e3, 3)])
    rows.sort(key=lambda r: -r[2])
    return rows[:top]


def _fresh(prefix: list[int], n: int, new: int, vocab: int, rng, used: set[int] | None = None) -> list[list[int]]:
    """n prompts: the cached prefix + `new` random tokens each. The first new token of each is
    one no earlier prompt had there (`used`), so the radix cache can never extend a match past
    the prefix (the tiny model's 1024-token vocabulary made that likely)."""
    out = []
    for _ in range(n):
        first = rng.randrange(vocab)
        while used is not None and first in used and len(used) < vocab:
            first = rng.randrange(vocab)
        if used is not None:
            used.add(first)
        out.append(prefix + [first] + [rng.randrange(vocab) for _ in range(new - 1)])
    return out


def _finish(eng, reqs) -> None:
    from granikv.engine.request import Status

    while any(r.status != Status.FINISHED for r in reqs):
        eng.step()


def engine_table(records: list[dict]) -> str:
    """Markdown: extend step ms of each engine variant, and their GPU-busy ms."""
    eng = [r for r in records if r.get("mode") == "engine"]
    names = list(dict.fromkeys(r["variant"] for r in eng))
    by = {(r["Lp"], r["n"], r["new"], r["variant"]): r for r in eng}
    lines = ["| Lp | n x new | " + " | ".join(f"step ms, {v}" for v in names) + " | GPU busy ms ("
             + " / ".join(names) + ") |", "|---|---|" + "---|" * (len(names) + 1)]
    for lp, n, new in dict.fromkeys((r["Lp"], r["n"], r["new"]) for r in eng):
        rs = [by.get((lp, n, new, v)) for v in names]
        lines.append(f"| {lp} | {n} x {new} | " + " | ".join(f"{r['step_ms']:.2f}" if r else "—" for r in rs)
                     + " | " + " / ".join(f"{r['gpu_busy_ms']:.2f}" if r else "—" for r in rs) + " |")
    return "\n".join(lines)


def table(records: list[dict], num_layers: int) -> str:
    """Markdown: one split vs the chosen splits per case, and the saving per step (x layers)."""
    by = {(r["Lp"], r["n"], r["new"], r["splits"]): r for r in records}
    lines = ["| Lp | n x new | 1 split µs | splits | split µs | speedup | floor µs | frac of floor | "
             f"saving ms/step (x{num_layers}) |", "|---|---|---|---|---|---|---|---|---|"]
    for (lp, n, new, s), one in by.items():
        if s != 1:
            continue
        auto = by.get((lp, n, new, one["auto_splits"]), one)
        lines.append(f"| {lp} | {n} x {new} | {one['us']:.1f} | {auto['splits']} | {auto['us']:.1f} | "
                     f"{one['us'] / auto['us']:.2f} | {one['floor_us']:.1f} | {auto['frac_of_floor']:.2f} | "
                     f"{(one['us'] - auto['us']) * num_layers / 1e3:.2f} |")
    return "\n".join(lines)


def _pairs(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        n, _, new = item.partition("x")
        out.append((int(n), int(new)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cuda (measurement) or cpu (dry run under the Triton interpreter)")
    ap.add_argument("--lp", default=None, help="cached prefix lengths (default 2048,16384; cpu: 96)")
    ap.add_argument("--cases", default=None,
                    help="NxNEW requests x new tokens (default 1x20,1x160,3x160,8x160,16x160,64x256; cpu: 1x5,2x7)")
    ap.add_argument("--heads", default=None, help="Hq,Hkv,d (default 32,8,128; cpu: 8,2,64)")
    ap.add_argument("--min-split-len", type=int, default=None,
                    help="ExtendSplitPolicy.min_split_len (default the policy's 512; cpu: 32)")
    ap.add_argument("--splits", default="1,auto",
                    help="split counts to time per case: integers and/or 'auto' (the policy's pick)")
    ap.add_argument("--layers", type=int, default=32, help="layers per step, for the per-step saving")
    ap.add_argument("--check-limit", type=int, default=64 * 160 * 16544,
                    help="check against the float32 reference when n*new*(Lp+new) is at most this")
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--engine", action="store_true", help="time whole engine extend steps (see above)")
    ap.add_argument("--model", default=None, help="--engine: model shapes (default llama-3.1-8b; cpu: tiny)")
    ap.add_argument("--system", default="granikv", help="--engine: paged | cascade | granikv")
    ap.add_argument("--tp", type=int, default=1,
                    help="--engine: tensor-parallel ranks (one GPU each; gloo ranks on CPU), the default "
                         "variant only: the TP extend step's fixed cost (docs/reproduction.md, TP=2)")
    ap.add_argument("--reps", type=int, default=5, help="--engine: timed extend steps per case")
    ap.add_argument("--extend-graphs", default="",
                    help="--engine: also time a variant with CUDA graphs for extend steps at these token "
                         "buckets (e.g. 32,64,128,256,512; EngineConfig.extend_graph_tokens)")
    ap.add_argument("--rule", default="fill", choices=("fill", "long-keys"),
                    help="ExtendSplitPolicy.named: the `auto` splits of the kernel records; --engine: adds "
                         "variants with EngineConfig.extend_split_rule set to it")
    ap.add_argument("--py-profile", action="store_true",
                    help="--engine: also run one step per case under cProfile (host_top_python)")
    ap.add_argument("--out", default=None,
                    help="result JSON (default results/h200/microbench/extend-steps.json on cuda; none on cpu)")
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        print("extend_steps: no CUDA device (use --device cpu for a dry run)", file=sys.stderr)
        return 2
    _setup(args.device)
    args.lp = [int(x) for x in (args.lp or ("96" if cpu else "2048,16384")).split(",")]
    args.cases = _pairs(args.cases or ("1x5,2x7" if cpu else "1x20,1x160,3x160,8x160,16x160,64x256"))
    args.splits = [x.strip() for x in args.splits.split(",") if x.strip()]
    args.extend_graphs = [int(x) for x in args.extend_graphs.split(",") if x.strip()]
    args.heads = tuple(int(x) for x in (args.heads or ("8,2,64" if cpu else "32,8,128")).split(","))
    if args.min_split_len is None:
        from granikv.kernels import ExtendSplitPolicy

        args.min_split_len = 32 if cpu else ExtendSplitPolicy().min_split_len
    if cpu:
        print("CPU dry run (Triton interpreter, wall clock): the numbers are not measurements")
    from harness.microbench._timing import write_result

    if args.engine:
        args.model = args.model or ("tiny" if cpu else "llama-3.1-8b")
        records = run_engine(args)
        print(engine_table(records))
    else:
        records = run(args)
        print(table(records, args.layers))
    bad = [r for r in records if r.get("rel_err") is not None and r["rel_err"] > 2e-2]
    default_out = "results/h200/microbench/extend-steps" + ("-engine" if args.engine else "") + ".json"
    out = args.out or (None if cpu else default_out)
    if out:
        write_result(out, dict(vars(args)), records)
    if bad:
        print(f"extend_steps: {len(bad)} case(s) off the float32 reference", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
