"""Decode-step benchmark of the bundled engine: the three systems on one set of weights.

For each cell (Lp, B) and system it admits B requests sharing an Lp-token prefix (with the
explicit `shared_prefix_len` hint) plus seeded suffixes of 16–512 tokens, prefills them, warms
up (CUDA-graph capture), then times steady decode steps:
- `step_ms`: median wall time of `Engine.step()` (plan + replay + sample: what a user waits);
- `gpu_busy_ms` / `host_gap_share`: from a torch.profiler window of N steps, the union of GPU
  kernel intervals and the idle share of the window (GPU idle while the host schedules);
- `floor_ms`: the roofline floor of the step, sum over its kernels of
  max(bytes / HBM_read_BW, FLOPs / bf16_peak) from the model's shapes (weights + KV bytes the
  system must read: paged reads every request's whole context, granikv/cascade read a shared
  prefix once per class plus each request's own tokens).
With `--trees "1x4096,4x4096,4x2048@256"` a cell is B requests over a tree of shared runs
(harness.microbench.tree_floor: the floor for each depth of sharing; no hint).
With `--sampled-share F` the first round(F·B) requests of each cell sample with
`--sampled-params` (default temperature 0.8, top-p 0.9, 5 logprobs; a `seed=S` there gives
request i the seed S+i) and the rest stay greedy: the cost of a step that runs the sampler
(granikv/engine/sampling.py) beside the default all-greedy step.
Optionally (`--http`) the same burst is served in-process and over HTTP (server + streaming
client in one process tree), each `--http-repeats` times on a warm engine, to compare output
throughput.

Writes results/<hw>/engine/steps.json: {"env", "records": [...], "http": {...}}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from granikv.attention.plan import MAX_SHARE_DEPTH
from granikv.config import EngineConfig
from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams, Status
from granikv.runtime import aio
from harness.microbench._timing import env_info


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def linear_floor_ms(spec, tp: int, b: int, bw: float, peak: float) -> float:
    h, d = spec.hidden_size, spec.head_dim
    q, kv = spec.num_heads * d // tp, spec.num_kv_heads * d // tp
    inter = spec.intermediate_size // tp
    mats = [(h, q + 2 * kv), (q, h), (h, 2 * inter), (inter, h)]
    t = 0.0
    for k_, n_ in mats:
        t += spec.num_layers * max(2 * k_ * n_ / bw, 2 * b * k_ * n_ / peak)
    t += max(2 * h * spec.vocab_size / tp / bw, 2 * b * h * spec.vocab_size / tp / peak)
    return t * 1e3


def kv_floor_ms(spec, tp: int, system: str, lp: int, ctx: list[int], classes: int,
                bw: float, peak: float) -> float:
    per_tok = 2 * spec.num_layers * spec.num_kv_heads // tp * spec.head_dim * 2  # bytes, K+V bf16
    if system == "paged" or classes == 0:
        return sum(ctx) * per_tok / bw * 1e3
    own = sum(c - lp for c in ctx) * per_tok / bw
    pref_bytes = classes * lp * per_tok
    flops = 4 * len(ctx) * spec.num_heads // tp * spec.head_dim * lp * spec.num_layers
    return (own + max(pref_bytes / bw, flops / peak)) * 1e3


def tree_kv_floors(spec, tp: int, tree: Sequence[tuple[int, int]], ctx: list[int], bw: float,
                   peak: float) -> dict[str, float]:
    """The K/V floor (ms) of a step over `tree` for each depth of sharing (harness.microbench.
    tree_floor): read per request (paged), the root once (cascade), two levels once (a head and
    one ext class), every shared node once (any depth)."""
    from harness.microbench.tree_floor import tree_kv_floor_ms, tree_nodes

    per_tok = 2 * spec.num_layers * spec.num_kv_heads // tp * spec.head_dim * 2  # bytes, K+V bf16
    flops = 4 * spec.num_heads // tp * spec.head_dim * spec.num_layers
    nodes = tree_nodes(tree, len(ctx))
    own = sum(ctx) - sum(n.readers * n.length for n in nodes)
    return {name: tree_kv_floor_ms(nodes, own, per_tok, flops, bw, peak, depth)
            for name, depth in (("paged", 0), ("root", 1), ("two_level", 2), ("any_depth", None))}


def tree_floor_key(system: str, share_depth: int) -> str:
    """Which of `tree_kv_floors` a system's step is held to: the sharing it can have (paged none,
    cascade the root, granikv the levels `share_depth` lets it read once; past two, every level
    a tree of the sweep has)."""
    if system != "granikv":
        return {"paged": "paged", "cascade": "root"}[system]
    return {1: "root", 2: "two_level"}.get(share_depth, "any_depth")


def tree_variants(systems: str, depths: str, flat: str = "on") -> list[tuple[str, int, bool]]:
    """(system, share_depth, flat_prefix) per tree record: granikv once per depth of `depths`
    ("5,2": every level, then the two-level cap, back to back on one engine's weights) and per
    `flat` setting ("both": the flattened launch, then one launch per level), the others once."""
    flats = {"on": [True], "off": [False], "both": [True, False]}[flat]
    out = []
    for system in filter(None, systems.split(",")):
        if system == "granikv":
            out += [(system, int(d), f) for d in depths.split(",") for f in flats]
        else:
            out.append((system, MAX_SHARE_DEPTH, True))
    return out


def set_flat_config(text: str) -> None:
    """`--flat-config bm,bn,warps,stages,target_programs`: the flattened launch's tiles for this
    benchmark process (the modules that size and launch it read FLAT_CONFIG), to time a
    candidate from harness.microbench.tree_passes inside whole engine steps."""
    import granikv.attention.plan as plan_mod
    import granikv.engine.graphs as graphs_mod
    import granikv.kernels.prefix_flat as flat_mod
    from granikv.kernels import PrefixConfig

    bm, bn, w, st, tp = (int(x) for x in text.split(","))
    cfg = PrefixConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=st, min_split_len=256, target_programs=tp)
    for mod in (flat_mod, plan_mod, graphs_mod):
        mod.FLAT_CONFIG = cfg


def make_tree_prompts(levels: Sequence[tuple[int, int]], b: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """B prompts over a tree of shared runs (`levels`: (fanout, length) per level): request i reads
    the root-to-leaf path of leaf i mod leaves (seeded runs, each distinct from its first token),
    then 16-512 tokens of its own, as make_prompts does for one prefix."""
    rng = random.Random(seed)
    runs: list[list[list[int]]] = []
    count = 1
    for fanout, length in levels:
        count *= fanout
        runs.append([[rng.randrange(vocab) for _ in range(length)] for _ in range(count)])
    leaves = count
    out = []
    for i in range(b):
        leaf, path = i % leaves, []
        below = leaves
        for d, (fanout, _) in enumerate(levels):
            below //= fanout
            path += runs[d][leaf // below]
        out.append(path + [rng.randrange(vocab) for _ in range(rng.randint(16, 512))])
    return out


def parse_tree(text: str) -> tuple[tuple[tuple[int, int], ...], int]:
    """`--trees` cell "1x4096,4x4096,4x2048@256": the levels (fanout x length) and B."""
    body, _, b = text.partition("@")
    if not b:
        raise ValueError(f"tree cell {text!r}: need levels@B, e.g. 1x4096,4x4096,4x2048@256")
    levels = tuple(tuple(int(x) for x in lv.split("x")) for lv in body.split(","))
    if any(len(lv) != 2 for lv in levels):
        raise ValueError(f"tree cell {text!r}: each level is fanout x length")
    return levels, int(b)  # type: ignore[return-value]


def make_prompts(b: int, lp: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(vocab) for _ in range(lp)]
    return [prefix + [rng.randrange(vocab) for _ in range(rng.randint(16, 512))] for _ in range(b)]


def prefill_all(eng: Engine) -> None:
    """Step the engine until every admitted request has its prompt prefilled (decode steps of
    the requests that are done run meanwhile, as in serving)."""
    while eng.scheduler.waiting or any(r.kv_len < r.prefill_target for r in eng.scheduler.running):
        eng.step()


def busy_and_span_ms(prof) -> tuple[float, float]:
    """(GPU-busy ms, window ms) of a profiler session: the union of GPU activity intervals
    (record_function ranges mirrored on the GPU timeline are not activity; harness.run.profile
    drops them) and the span from the first activity's start to the last one's end."""
    from granikv.profiling import kernel_events, union_us

    ivs = [(s, e) for _, s, e in kernel_events(prof)]
    if not ivs:
        return 0.0, 0.0
    span = max(e for _, e in ivs) - min(s for s, _ in ivs)
    return union_us(ivs) / 1e3, span / 1e3


def parse_sampled(text: str) -> dict:
    """`--sampled-params` ("temperature=0.8,top_p=0.9,logprobs=5") as SamplingParams keywords."""
    out: dict = {}
    for kv in filter(None, text.split(",")):
        k, v = kv.split("=")
        out[k.strip()] = float(v) if k.strip() in ("temperature", "top_p") else int(v)
    return out


def cell_params(b: int, max_new: int, share: float, sampled: dict) -> list[SamplingParams]:
    """Each request's SamplingParams: the first round(share·b) with `sampled` (seed S: S+i)."""
    n = round(share * b)
    out = []
    for i in range(b):
        kw = dict(sampled) if i < n else {}
        if "seed" in kw:
            kw["seed"] += i
        out.append(SamplingParams(max_new_tokens=max_new, ignore_eos=True, **kw))
    return out


def run_cell(model, base_cfg: EngineConfig, system: str, lp: int, b: int, steps: int, prof_steps: int,
             bw: float, peak: float, sampled_share: float = 0.0, sampled: dict | None = None,
             tree: Sequence[tuple[int, int]] | None = None, share_depth: int = MAX_SHARE_DEPTH,
             flat_prefix: bool = True) -> dict:
    """One (Lp, B) cell of one system; with `tree`, B requests over that tree of shared runs
    (no hint: the engine finds the sharing), `lp` is ignored (the path length stands in) and
    granikv reads up to `share_depth` shared levels once per step (its floor reads as many)."""
    cfg = base_cfg.replace(system=system, max_running=max(b, 8))
    if tree:  # the warm-up steps capture the one decode graph a tree step needs
        cfg = cfg.replace(capture_at_start=False)
    if tree and system == "granikv":
        cfg = cfg.replace(share_depth=share_depth, flat_prefix=flat_prefix)
    eng = Engine(cfg, model=model)
    spec = eng.spec
    if tree:
        prompts = make_tree_prompts(tree, b, spec.vocab_size)
        lp = sum(length for _, length in tree)
    else:
        prompts = make_prompts(b, lp, spec.vocab_size)
    params = cell_params(b, 16 + steps + prof_steps + 8, sampled_share, sampled or {})
    hint = None if tree else lp
    reqs = [eng.add_request(p, sp, shared_prefix_len=hint) for p, sp in zip(prompts, params)]
    sync()
    t0 = time.perf_counter()
    prefill_all(eng)
    sync()
    prefill_s = time.perf_counter() - t0
    for _ in range(8):  # warm-up: graph capture for this bucket/plan
        eng.step()
    sync()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        eng.step()
        times.append((time.perf_counter() - t) * 1e3)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(prof_steps):
            eng.step()
        sync()
    busy, span = busy_and_span_ms(prof)
    from granikv.profiling import kernel_events, top_kernels

    kernels = top_kernels(kernel_events(prof), prof_steps)
    ctx = [r.seq_len for r in reqs]
    att = eng.backend.stats()
    classes = 1 if system != "paged" and att.get("paged_steps", 0) < att.get("decode_steps", 1) else 0
    lin = linear_floor_ms(spec, cfg.tp, b, bw, peak)
    tree_floors = {}
    if tree:
        tree_floors = tree_kv_floors(spec, cfg.tp, tree, ctx, bw, peak)
        kvf = tree_floors[tree_floor_key(system, cfg.share_depth)]
    else:
        kvf = kv_floor_ms(spec, cfg.tp, system, lp, ctx, classes, bw, peak)
    rec = {
        "system": system, "model": spec.name, "Lp": lp, "B": b, "steps": steps,
        "sampled_requests": sum(not p.plain for p in params), "sampled_params": sampled or {},
        "step_ms": statistics.median(times), "step_ms_p10": sorted(times)[len(times) // 10],
        "step_ms_p90": sorted(times)[9 * len(times) // 10],
        "gpu_busy_ms_per_step": busy / prof_steps, "window_ms_per_step": span / prof_steps,
        "host_gap_share": 1 - busy / span if span else None,
        "floor_ms": lin + kvf, "floor_linear_ms": lin, "floor_kv_ms": kvf,
        "prefill_s": prefill_s, "kernels": kernels, "attention": att, "graphs": {
            "captures": eng.runner.graphs.captures if eng.runner.graphs else 0,
            "replays": eng.runner.graphs.replays if eng.runner.graphs else 0},
        "storage": {k: v for k, v in eng.storage.stats().items() if isinstance(v, (int, float, str))},
    }
    if tree:
        rec["tree"] = [list(lv) for lv in tree]
        rec["share_depth"] = cfg.share_depth
        rec["flat_prefix"] = cfg.flat_prefix
        from dataclasses import asdict

        import granikv.kernels.prefix_flat as flat_mod

        rec["flat_config"] = asdict(flat_mod.FLAT_CONFIG)
        rec["floor_kv_ms_by_depth"] = tree_floors  # paged / root / two_level / any_depth
    rec["step_over_floor"] = rec["step_ms"] / rec["floor_ms"]
    for r in reqs:
        if r.status != Status.FINISHED:
            eng.abort(r.rid)
    del eng
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rec


def http_vs_inprocess(model, base_cfg: EngineConfig, system: str, workload: str, mode: str = "process",
                      repeats: int = 2, incremental: bool = False) -> dict:
    """Output throughput of one workload file served in-process (Engine.generate) and over HTTP
    (this process serves; the streaming client runs as a separate process, as in a real cell).

    Each side serves the burst `repeats` times on the same engine and the last run counts: a burst
    of 256 x 128 tokens lasts ~2 s, so a fresh engine's one-time costs (Triton kernels loaded or
    compiled for the prefill shapes it meets first, in a new process on the HTTP side) would
    otherwise weigh as much as the serving itself. Every run's figure is recorded."""
    import subprocess
    import tempfile

    from aiohttp import web

    from granikv.runtime.loop import EngineLoop
    from granikv.server.app import build_app, tcp_site
    from granikv.server.text import TextCodec
    from harness.run.workloads.requests import read_workload, require_open_loop

    wl = read_workload(workload)
    reqs = wl.requests
    require_open_loop(reqs, "engine_steps")  # a debate's prompts need the server's outputs
    b = len(reqs)
    cfg = base_cfg.replace(system=system, max_running=b)
    out = {"system": system, "workload": Path(workload).name, "B": b, "output_len": reqs[0].output_len}
    eng = Engine(cfg, model=model)
    warm = [r.input_ids for r in reqs[:8]]
    eng.generate(warm, SamplingParams(max_new_tokens=8, ignore_eos=True),
                 shared_prefix_lens=[r.shared_prefix_len for r in reqs[:8]])
    sync()
    repeats = max(1, repeats)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        eng.generate([r.input_ids for r in reqs], [SamplingParams(max_new_tokens=r.output_len, ignore_eos=True)
                                                   for r in reqs],
                     shared_prefix_lens=[r.shared_prefix_len for r in reqs])
        sync()
        runs.append(sum(r.output_len for r in reqs) / (time.perf_counter() - t0))
    out["inprocess_runs"] = runs
    out["inprocess_output_throughput"] = runs[-1]
    del eng
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if mode == "thread":
        loop = EngineLoop(Engine(cfg, model=model))
        loop.start()
    else:  # what `python -m granikv.server` runs: the engine in its own process (same dummy weights)
        from granikv.runtime.process import EngineProcess

        loop = EngineProcess(cfg)
        loop.start()
    out["server_mode"] = mode
    out["incremental_streaming_output"] = incremental
    out["event_loop"] = aio.event_loop_name()  # the server's loop here and the client's (same env)
    tmp = Path(tempfile.mkdtemp())

    async def go() -> dict:
        import aiohttp

        runner = web.AppRunner(build_app(loop, TextCodec(), incremental_streaming_output=incremental), access_log=None)
        await runner.setup()
        await tcp_site(runner, "127.0.0.1", 30555).start()
        try:
            for i in range(repeats):
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "harness.run.client", "--url", "http://127.0.0.1:30555", "--workload",
                    workload, "--max-concurrency", str(b), "--warmup-requests", "8", "--warmup-output-len", "8",
                    "--send-prefix-hint", "--no-progress", "--no-records", "--output", str(tmp / f"client{i}.json"),
                    stdout=subprocess.DEVNULL)
                await proc.wait()
            async with aiohttp.ClientSession() as s, s.get("http://127.0.0.1:30555/server_info") as r:
                return await r.json()
        finally:
            await runner.cleanup()

    info = aio.run(go())
    loop.stop()
    runs = [json.loads((tmp / f"client{i}.json").read_text())["metrics"] for i in range(repeats)]
    metrics = runs[-1]
    out["http_runs"] = [m["output_throughput"] for m in runs]
    out["http_output_throughput"] = metrics["output_throughput"]
    out["http_metrics"] = metrics
    out["server_engine"] = {k: info.get(k) for k in ("graphs", "step_log", "step_time_s") if k in info}
    out["http_over_inprocess"] = out["http_output_throughput"] / out["inprocess_output_throughput"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="default: llama-3.1-8b on cuda, tiny on cpu (random weights of "
                                                    "an 8B model in float32 would not fit a CPU host)")
    ap.add_argument("--cells", default="512x256,16384x256,16384x8", help="LpxB,...")
    ap.add_argument("--trees", default="",
                    help="tree cells, ';'-separated: levels@B, e.g. '1x4096,4x4096,4x2048@256' (fanout x length "
                         "per level; request i reads leaf i mod leaves; no hint); each system's floor reads the "
                         "sharing it can have (paged none, cascade the root, granikv every shared node)")
    ap.add_argument("--share-depth", default=str(MAX_SHARE_DEPTH),
                    help="granikv share_depth(s) in --trees cells, comma-separated, one record each (default: every "
                         "level; 2 is the two-level cap)")
    ap.add_argument("--flat", default="on", choices=["on", "off", "both"],
                    help="granikv in --trees cells: the flattened prefix launch (EngineConfig.flat_prefix), one "
                         "launch per level, or both back to back")
    ap.add_argument("--flat-config", default="", help="bm,bn,warps,stages,target_programs of the flattened "
                                                      "launch (default: granikv.kernels.prefix_flat.FLAT_CONFIG)")
    ap.add_argument("--systems", default="paged,cascade,granikv")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--prof-steps", type=int, default=10)
    ap.add_argument("--sampled-share", type=float, default=0.0,
                    help="share of each cell's requests that sample with --sampled-params (0: all greedy)")
    ap.add_argument("--sampled-params", default="temperature=0.8,top_p=0.9,logprobs=5",
                    help="SamplingParams of the sampled requests, k=v,...; seed=S gives request i the seed S+i")
    ap.add_argument("--kv-budget-gb", type=float, default=40.0)
    ap.add_argument("--m-sat", type=int, default=1024)
    ap.add_argument("--hbm-tbps", type=float, default=4.48)
    ap.add_argument("--peak-tflops", type=float, default=779.0)
    ap.add_argument("--http", default="", help="workload .jsonl for the HTTP vs in-process check (granikv)")
    ap.add_argument("--http-mode", default="process", choices=["process", "thread"],
                    help="server's engine in its own process (what granikv.server runs) or on a thread")
    ap.add_argument("--http-streaming", default="cumulative", choices=["cumulative", "incremental"],
                    help="the server's /generate chunks: everything so far (SGLang's default) or only what is "
                         "new (--incremental-streaming-output); the client's parse cost of the former grows "
                         "with the square of the output length")
    ap.add_argument("--http-repeats", type=int, default=2,
                    help="serve the burst this many times on each side; the last run counts (warm engine)")
    ap.add_argument("--out", default=None, help="default: results/h200/engine/steps.json on cuda, "
                                                "results/cpu/engine/steps.json on cpu")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run of the script (tiny model)")
    ap.add_argument("--kernel-impl", default="triton")
    ap.add_argument("--notes", default=None, help="print the Markdown table of an existing steps.json and exit")
    args = ap.parse_args(argv)
    if args.notes:
        print(notes_table(args.notes))
        return 0
    if args.flat_config:
        set_flat_config(args.flat_config)
    on_cpu = args.device == "cpu"
    args.model = args.model or ("tiny" if on_cpu else "llama-3.1-8b")
    args.out = args.out or f"results/{'cpu' if on_cpu else 'h200'}/engine/steps.json"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("engine_steps needs a CUDA GPU (or --device cpu for a dry run)", file=sys.stderr)
        return 2
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    base = EngineConfig(model=args.model, device=args.device, kv_budget_gb=args.kv_budget_gb, max_context=17408,
                        m_sat=args.m_sat, chunked_prefill_tokens=8192, kernel_impl=args.kernel_impl,
                        min_prefix_for_hot=min([256] + [int(c.split("x")[0]) for c in args.cells.split(",") if c]))
    from granikv.model.spec import load_spec
    from granikv.model.weights import load_model

    spec = load_spec(args.model)
    t0 = time.perf_counter()
    model = load_model(spec, None, "dummy", None, 0, dtype, dev, max_positions=base.max_context)
    print(f"model {args.model} loaded in {time.perf_counter() - t0:.1f}s", flush=True)
    bw, peak = args.hbm_tbps * 1e12, args.peak_tflops * 1e12
    records = []
    for cell in filter(None, args.cells.split(",")):  # --cells "" runs only the HTTP check
        lp, b = (int(x) for x in cell.split("x"))
        for system in args.systems.split(","):
            rec = run_cell(model, base, system, lp, b, args.steps, args.prof_steps, bw, peak,
                           args.sampled_share, parse_sampled(args.sampled_params) if args.sampled_share else {})
            records.append(rec)
            print(f"{system:8s} Lp={lp:6d} B={b:4d} sampled {rec['sampled_requests']:3d} "
                  f"step {rec['step_ms']:7.2f} ms  floor {rec['floor_ms']:6.2f} "
                  f"({rec['step_over_floor']:.2f}x)  gap {rec['host_gap_share'] or 0:.3f}  "
                  f"att {rec['attention']}", flush=True)
    for cell in filter(None, args.trees.split(";")):
        tree, b = parse_tree(cell)
        for system, depth, flat in tree_variants(args.systems, args.share_depth, args.flat):
            rec = run_cell(model, base, system, 0, b, args.steps, args.prof_steps, bw, peak, tree=tree,
                           share_depth=depth, flat_prefix=flat)
            records.append(rec)
            print(f"{system:8s} tree={cell} depth={depth} flat={flat} step {rec['step_ms']:7.2f} ms  "
                  f"floor {rec['floor_ms']:6.2f} "
                  f"({rec['step_over_floor']:.2f}x)  att {rec['attention']}", flush=True)
    doc = {"env": env_info(), "config": vars(args), "records": records}
    if args.http:
        doc["http"] = http_vs_inprocess(model, base, "granikv", args.http, args.http_mode, args.http_repeats,
                                        incremental=args.http_streaming == "incremental")
        h = doc["http"]
        print(f"HTTP {h['http_output_throughput']:.0f} tok/s vs in-process {h['inprocess_output_throughput']:.0f} "
              f"tok/s: {h['http_over_inprocess']:.3f}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")
    return 0



def notes_table(path: str) -> str:
    """Markdown table of a steps.json (for docs/generated/decode-step.md; numbers are read, never typed)."""
    doc = json.loads(Path(path).read_text())
    lines = ["| system | Lp | B | step ms (median) | floor ms | step/floor | host-gap share | GPU busy ms/step |",
             "|---|---|---|---|---|---|---|---|"]
    for r in doc["records"]:
        lines.append(f"| {r['system']} | {r['Lp']} | {r['B']} | {r['step_ms']:.2f} | {r['floor_ms']:.2f} | "
                     f"{r['step_over_floor']:.2f} | {r['host_gap_share']:.3f} | {r['gpu_busy_ms_per_step']:.2f} |")
    h = doc.get("http")
    if h:
        lines.append("")
        lines.append(f"HTTP vs in-process ({h['system']}, {h.get('workload', 'burst')}, B={h['B']}): "
                     f"{h['http_output_throughput']:.0f} vs {h['inprocess_output_throughput']:.0f} tok/s "
                     f"= {h['http_over_inprocess']:.3f}")
        if h.get("http_runs"):
            inproc = ", ".join(f"{x:.0f}" for x in h["inprocess_runs"])
            http = ", ".join(f"{x:.0f}" for x in h["http_runs"])
            lines.append(f"(every run, first one cold: in-process {inproc}; HTTP {http} tok/s; the last run counts)")
    env = doc["env"]
    lines.append("")
    lines.append(f"Measured on {env.get('gpu')} (torch {env.get('torch')}, triton {env.get('triton')}), "
                 f"git {str(env.get('git_sha'))[:10]}, {env.get('started_at')}.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
