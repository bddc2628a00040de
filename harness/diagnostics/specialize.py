"""The prefix pass with and without Triton's int specialization, A/B in one process.

Why: Triton compiles an int argument equal to 1 in as a constant and marks one divisible by 16
as aligned, so each such value class is its own compiled variant. The prefix kernel took its
M tiles per class (TILES) and split count, and its split fold the number of classes, as
specialized ints; those change with how a decode batch splits into prefix classes, which the
engine's start-up captures (one class per step) never show. So the first multi-prefix run on a
machine compiled a variant inside the run (a second or more of one decode step). The kernels do
not specialize those arguments (`do_not_specialize`). This benchmark says what that costs and
what it saves:

1. per launch, the engine's (unspecialized) kernels against copies compiled from the same
   source with Triton's default specialization, at the class splits of the serving cells
   (Lp=8K, Llama-3.1-8B's heads, bf16), interleaved over `--reps` rounds, CUDA-graph replays
   timed with a cold L2 (`_timing.bench`);
2. the first launch of each case on each kernel copy, host wall time: with an empty Triton
   cache (`TRITON_CACHE_DIR` pointing at a new folder) that is the compile a serving run paid.

    python -m harness.diagnostics.specialize            # -> results/h200/microbench/specialize.json
    TRITON_CACHE_DIR=$(mktemp -d) python -m harness.diagnostics.specialize
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch

# (classes, requests per class): one class at the sizes the start-up captures meet, then the
# multi-prefix splits of a 256-request batch (Table 20 k = 4, 16, 64; Table 21's k = 8 as 8 x 32)
CASES = ((1, 16), (1, 64), (1, 256), (4, 64), (8, 32), (16, 16), (64, 4))


@dataclass(frozen=True)
class PrefixPassShape:
    lp: int = 8192
    hq: int = 32
    hkv: int = 8
    d: int = 128


def _modules():
    """The kernel modules (granikv.kernels re-exports functions of the same names)."""
    return (importlib.import_module("granikv.kernels.prefix_cascade"),
            importlib.import_module("granikv.kernels.splits"))


@contextlib.contextmanager
def using(prefix_kernel, combine_kernel):
    """Run the engine's prefix pass with the given kernel objects (module globals, restored)."""
    prefix_cascade, splits = _modules()
    old = prefix_cascade._prefix_kernel, splits._combine_prefix_kernel
    prefix_cascade._prefix_kernel, splits._combine_prefix_kernel = prefix_kernel, combine_kernel
    try:
        yield
    finally:
        prefix_cascade._prefix_kernel, splits._combine_prefix_kernel = old


def kernel_pairs() -> dict[str, tuple]:
    """{"unspecialized": the engine's kernels, "specialized": the same source, Triton's default}."""
    import triton

    prefix_cascade, splits = _modules()
    return {"unspecialized": (prefix_cascade._prefix_kernel, splits._combine_prefix_kernel),
            "specialized": (triton.jit(prefix_cascade._prefix_kernel.fn),
                            triton.jit(splits._combine_prefix_kernel.fn))}


def make_case(classes: int, size: int, shape: PrefixPassShape, dtype, device):
    """q for classes x size requests and their slab classes (class c's slab at c * lp + 1)."""
    from granikv.kernels.prefix_classes import PrefixClasses

    n = classes * size
    q = torch.randn(n, shape.hq, shape.d, dtype=dtype, device=device)
    members = [list(range(c * size, (c + 1) * size)) for c in range(classes)]
    pc = PrefixClasses.from_lists(members, [shape.lp] * classes, device,
                                  slab_base=[1 + c * shape.lp for c in range(classes)])
    return q, pc


def run(args) -> dict:
    from granikv.kernels.prefix_cascade import CASCADE_CONFIG, prefix_cascade, prefix_max_splits
    from harness.microbench._timing import bench

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = PrefixPassShape(lp=args.lp)
    if device.type == "cpu":  # a dry run of the script under the interpreter
        shape = PrefixPassShape(lp=64, hq=4, hkv=2, d=16)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    slots = 1 + max(c for c, _ in args.cases) * shape.lp
    k_cache = torch.randn(slots, shape.hkv, shape.d, dtype=dtype, device=device)
    v_cache = torch.randn_like(k_cache)
    scale = shape.d ** -0.5
    pairs = kernel_pairs()
    cases = [(c, s, *make_case(c, s, shape, dtype, device)) for c, s in args.cases]
    first_ms: dict[tuple, float] = {}
    times: dict[tuple, list[float]] = {}
    for rnd in range(args.reps):
        # alternate which copy goes first, so neither always runs on the other's warm clocks
        order = list(pairs) if rnd % 2 == 0 else list(reversed(pairs))
        for c, s, q, pc in cases:
            for name in order:
                with using(*pairs[name]):
                    def fn(q=q, pc=pc):
                        return prefix_cascade(q, k_cache, v_cache, pc, scale)
                    if (c, s, name) not in first_ms:
                        if device.type == "cuda":
                            torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        fn()
                        if device.type == "cuda":
                            torch.cuda.synchronize()
                        first_ms[(c, s, name)] = (time.perf_counter() - t0) * 1e3
                    t = bench(fn, rep_ms=args.rep_ms)
                    times.setdefault((c, s, name), []).append(t.us)
    records = []
    for c, s, q, pc in cases:
        outs = {}
        for name in pairs:  # both copies compute the same function: same output, bit for bit or nearly
            with using(*pairs[name]):
                outs[name] = prefix_cascade(q, k_cache, v_cache, pc, scale)
        (o_a, l_a), (o_b, l_b) = outs.values()
        tiles = -(-s * (shape.hq // shape.hkv) // CASCADE_CONFIG.block_m)
        splits = prefix_max_splits(pc, c * s, shape.hq // shape.hkv, shape.hkv, device, CASCADE_CONFIG)
        rec = {"classes": c, "class_size": s, "batch": c * s, "lp": shape.lp, "tiles": tiles, "max_splits": splits,
               "max_abs_diff_o": float((o_a.float() - o_b.float()).abs().max()),
               "max_abs_diff_lse": float((l_a - l_b).abs().max())}
        for name in pairs:
            us = times[(c, s, name)]
            rec[name] = {"us": round(statistics.median(us), 2), "us_reps": [round(x, 2) for x in us],
                         "first_call_ms": round(first_ms[(c, s, name)], 1)}
        rec["unspecialized_over_specialized"] = round(rec["unspecialized"]["us"] / rec["specialized"]["us"], 4)
        records.append(rec)
    return {"shape": shape.__dict__, "records": records, "device": device.type}


def parse_cases(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in text.split(","):
        c, _, s = part.strip().partition("x")
        if not (c.isdigit() and s.isdigit()) or int(c) < 1 or int(s) < 1:
            raise argparse.ArgumentTypeError(f"a case is CLASSESxSIZE, e.g. 16x16; got {part!r}")
        out.append((int(c), int(s)))
    return tuple(out)


def table(records: list[dict]) -> str:
    lines = ["| classes x size | TILES | splits | unspecialized us | specialized us | ratio "
             "| first call ms (unspec. / spec.) |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['classes']} x {r['class_size']} | {r['tiles']} | {r['max_splits']} | "
                     f"{r['unspecialized']['us']} | {r['specialized']['us']} | {r['unspecialized_over_specialized']} | "
                     f"{r['unspecialized']['first_call_ms']} / {r['specialized']['first_call_ms']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from harness.microbench._timing import write_result

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lp", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=3, help="interleaved rounds of every case on both copies")
    ap.add_argument("--rep-ms", type=int, default=60, help="do_bench's repeat time per measurement")
    ap.add_argument("--cases", type=parse_cases, default=CASES,
                    help="classes x requests per class, e.g. 1x256,16x16 (default: the serving cells' splits)")
    ap.add_argument("--out", default=None, help="default results/h200/microbench/specialize.json on a GPU; "
                                                "on the CPU nothing is written unless given")
    args = ap.parse_args(argv)
    res = run(args)
    print(table(res["records"]))
    out = args.out or ("results/h200/microbench/specialize.json" if res["device"] == "cuda" else None)
    if out:
        write_result(out, {"lp": res["shape"]["lp"], "reps": args.reps, "rep_ms": args.rep_ms,
                           "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"), "shape": res["shape"],
                           "argv": sys.argv[1:] if argv is None else argv}, res["records"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
