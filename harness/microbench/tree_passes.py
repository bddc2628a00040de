"""Tree-pass sweep: the attention of one decode step over a tree of shared runs, per launch form
and tile config, for one Llama-3.1-8B layer (Hq = 32, Hkv = 8, d = 128, bf16).

    python -m harness.microbench.tree_passes                # GPU: results/h200/microbench/tree-passes.json
    python -m harness.microbench.tree_passes --smoke --out /tmp/tp.json   # CPU, interpreter: the script runs

B requests over the tree's leaves (request i on leaf i mod leaves), each with its own 16-512
token suffix in random 16-slot pages. The root run is a HOT slab; every deeper node's run is one
slot range read through a member's slot-table row (where the COLD pool puts a prompt prefilled
while it is unfragmented). Timed, each as one CUDA graph with L2 flushed per replay:
- `plain`: the paged decode of every request's whole context;
- `per_level`: the suffix decode, then per level a zero-filled output, the cascade kernel over
  that level's classes and an LSE merge (EngineConfig.flat_prefix=False);
- `flat`: the suffix decode, then one flattened launch over every level's classes and one merge
  (granikv/kernels/prefix_flat.py), deeper runs read through the slot table, at the engine's
  tile config; `flat_slab`: the same with every run read as a slab (what the engine does with
  a run that is one slot range), once per candidate tile config;
- `level`: one level's classes alone through the cascade kernel, per candidate config, its runs
  read through the slot table (`rows`), as contiguous slabs (`slab`), or as slabs through TMA
  (`tma`): which level and which load path the step's prefix time goes to.
Every form's output is checked against `plain` first. Shared-run FLOPs (4 · Hq · d per query
row and key) over the prefix part's time give the tensor-core rate each config reaches; the
floor is max(shared-run bytes / HBM, FLOPs / GEMM peak) plus the suffix's bytes.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import asdict

import torch

from granikv.kernels import PrefixClasses, PrefixConfig, decode_paged, merge_lse_, prefix_cascade
from granikv.kernels.prefix_flat import FLAT_CONFIG, FlatClass, FlatClasses, flat_lists, prefix_flat_
from harness.microbench._timing import bench, write_result

CANDIDATES = [FLAT_CONFIG] + [
    PrefixConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s, min_split_len=256, target_programs=tp)
    for bm, bn, w, s, tp in [
        (64, 64, 4, 3, 1), (64, 64, 4, 3, 2), (64, 64, 4, 2, 2), (64, 128, 4, 3, 2), (128, 64, 8, 3, 1),
        (128, 128, 8, 3, 1), (128, 128, 8, 3, 2), (128, 64, 8, 3, 2),
    ]
]


def build(levels: list[tuple[int, int]], b: int, hkv: int, d: int, g: int, dtype, dev, seed: int = 0):
    """K/V, q, slot table, per-request own lengths and the step's classes per level."""
    rng = random.Random(seed)
    counts, n = [], 1
    for fanout, _ in levels:
        n *= fanout
        counts.append(n)
    leaves = counts[-1]
    path = sum(length for _, length in levels)
    own = [rng.randint(16, 512) for _ in range(b)]
    tree_slots = sum(c * length for c, (_, length) in zip(counts, levels, strict=True))
    own_pages = sum(-(-x // 16) for x in own)
    num_slots = 1 + tree_slots + 16 * (own_pages * 2 + 8)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    k = torch.randn(num_slots, hkv, d, generator=gen).to(dtype).to(dev)
    v = torch.randn(num_slots, hkv, d, generator=gen).to(dtype).to(dev)
    q = torch.randn(b, hkv * g, d, generator=gen).to(dtype).to(dev)
    cursor, node_base = 1, []
    for c, (_, length) in zip(counts, levels, strict=True):
        node_base.append([cursor + j * length for j in range(c)])
        cursor += c * length
    pages = list(range(-(-cursor // 16), (num_slots - 16) // 16))
    rng.shuffle(pages)
    cols = path + max(own) + 1
    table = torch.zeros(b + 1, cols, dtype=torch.int32)
    node_of = []  # per request, its node index per level
    for i in range(b):
        leaf, below, nodes, row = i % leaves, leaves, [], []
        for lv, (fanout, length) in enumerate(levels):
            below //= fanout
            j = leaf // below
            nodes.append(j)
            row += range(node_base[lv][j], node_base[lv][j] + length)
        for _ in range(-(-own[i] // 16)):
            p = pages.pop()
            row += range(16 * p, 16 * p + 16)
        table[i, :path + own[i]] = torch.tensor(row[:path + own[i]], dtype=torch.int32)
        node_of.append(nodes)
    classes, start = [], 0
    for lv, (_, length) in enumerate(levels):
        members: dict[int, list[int]] = {}
        for i in range(b):
            members.setdefault(node_of[i][lv], []).append(i)
        for j, m in sorted(members.items()):
            if lv == 0:
                classes.append(FlatClass(m, length, node_base[0][j], False, 0))
            else:
                classes.append(FlatClass(m, length, m[0] * cols + start, True, lv))
        start += length
    return k, v, q, table.to(dev), own, path, classes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="1x4096,4x4096,4x2048", help="fanout x length per level, root first")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny shapes, float32, the interpreter")
    ap.add_argument("--out", default=None, help="default: results/h200/microbench/tree-passes.json on a GPU; "
                                                 "a smoke run writes only where --out says")
    ap.add_argument("--hbm-tbps", type=float, default=4.48)
    ap.add_argument("--peak-tflops", type=float, default=779.0)
    args = ap.parse_args(argv)
    levels = [tuple(int(x) for x in lv.split("x")) for lv in args.levels.split(",")]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu" and not args.smoke:
        print("tree_passes needs a CUDA GPU (or --smoke on a CPU host)", file=sys.stderr)
        return 2
    hkv, d, g = (2, 32, 4) if args.smoke else (8, 128, 4)
    if args.smoke:
        levels = [(1, 40), (2, 24), (2, 17)]
        args.batch = min(args.batch, 8)
    dtype = torch.float32 if args.smoke else torch.bfloat16
    b = args.batch
    k, v, q, table, own, path, classes = build(levels, b, hkv, d, g, dtype, dev)
    sm = d ** -0.5
    i32 = {"dtype": torch.int32, "device": dev}
    rows = torch.arange(b, **i32)
    full_len = torch.tensor([path + x for x in own], **i32)
    zero = torch.zeros(b, **i32)
    kv_start = torch.full((b,), path, **i32)
    own_len = torch.tensor(own, **i32)
    nlev = len(levels)
    per_level = []
    for lv in range(nlev):
        cs = [c for c in classes if c.level == lv]
        if lv == 0:
            per_level.append(PrefixClasses.from_lists([c.members for c in cs], [c.length for c in cs], dev,
                                                      slab_base=[c.where for c in cs]))
        else:
            per_level.append(PrefixClasses.from_lists([c.members for c in cs], [c.length for c in cs], dev,
                                                      page_rows=[c.where for c in cs],
                                                      slot_table=table.view(-1, 1)))

    def plain():
        return decode_paged(q, k, v, table, rows, zero, full_len, sm)

    def levels_fn():
        o, lse = decode_paged(q, k, v, table, rows, kv_start, own_len, sm)
        for pc in per_level:
            op, lp = torch.zeros_like(q), torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=dev)
            prefix_cascade(q, k, v, pc, sm, out=op, lse=lp)
            merge_lse_(o, lse, op, lp)
        return o, lse

    flat_t = table.reshape(-1).cpu()
    slab_classes = [FlatClass(c.members, c.length, int(flat_t[c.where]) if c.rows else c.where, False, c.level)
                    for c in classes]

    def flat_fn(cfg, cs=classes):
        flat = FlatClasses.from_lists(flat_lists(cs, b, nlev, g, cfg.block_m), table)

        def run():
            o, lse = decode_paged(q, k, v, table, rows, kv_start, own_len, sm)
            prefix_flat_(q, k, v, flat, sm, o, lse, cfg=cfg)
            return o, lse
        return run

    def suffix():
        return decode_paged(q, k, v, table, rows, kv_start, own_len, sm)

    ref_o, _ = plain()
    kv_tok = 2 * hkv * d * k.element_size()
    shared_bytes = sum(c.length for c in classes) * kv_tok
    flops = 4 * g * hkv * d * sum(len(c.members) * c.length for c in classes)
    own_bytes = sum(own) * kv_tok
    floor_us = (max(shared_bytes / (args.hbm_tbps * 1e12), flops / (args.peak_tflops * 1e12))
                + own_bytes / (args.hbm_tbps * 1e12)) * 1e6
    rep = 5 if args.smoke else 100
    records = []
    t_suffix = bench(suffix, rep_ms=rep).us

    def record(form, fn, cfg=None):
        o, _ = fn()
        err = ((o.float() - ref_o.float()).norm() / ref_o.float().norm()).item()
        if err > (1e-4 if args.smoke else 2e-2):
            raise AssertionError(f"{form} {cfg}: output differs from the plain decode (rel err {err:.3g})")
        t = bench(fn, rep_ms=rep)
        prefix_us = max(t.us - t_suffix, 1e-9)
        rec = {"form": form, "cfg": asdict(cfg) if cfg else None, "us": t.us, "p20_us": t.p20_us,
               "p80_us": t.p80_us, "prefix_us": prefix_us if form != "plain" else None,
               "prefix_tflops": flops / prefix_us / 1e6 if form != "plain" else None, "rel_err": err,
               "over_floor": t.us / floor_us}
        records.append(rec)
        label = f"{form:9s} " + (f"bm{cfg.block_m} bn{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} "
                                 f"tp{cfg.target_programs}" if cfg else "")
        print(f"{label:40s} {t.us:9.1f} us  x{rec['over_floor']:.2f} floor"
              + (f"  prefix {prefix_us:8.1f} us {rec['prefix_tflops']:6.1f} TFLOP/s" if form != "plain" else ""),
              flush=True)

    def level_fn(lv, form, cfg):
        cs = [c for c in classes if c.level == lv]
        if form == "rows" and lv > 0:
            pc = PrefixClasses.from_lists([c.members for c in cs], [c.length for c in cs], dev,
                                          page_rows=[c.where for c in cs], slot_table=table.view(-1, 1))
        else:  # the run's slots as a slab: a deeper node's run is one slot range here
            bases = [c.where if not c.rows else int(flat_t[c.where]) for c in cs]
            pc = PrefixClasses.from_lists([c.members for c in cs], [c.length for c in cs], dev, slab_base=bases)
        run_cfg = PrefixConfig(**{**asdict(cfg), "tma": form == "tma"})
        op, lp = torch.zeros_like(q), torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=dev)
        return lambda: prefix_cascade(q, k, v, pc, sm, out=op, lse=lp, cfg=run_cfg)

    record("plain", plain)
    record("per_level", levels_fn)
    cands = list(dict.fromkeys(CANDIDATES))[:2 if args.smoke else None]
    record("flat", flat_fn(FLAT_CONFIG), FLAT_CONFIG)
    for cfg in cands:
        record("flat_slab", flat_fn(cfg, slab_classes), cfg)
    for lv in range(nlev):
        cs = [c for c in classes if c.level == lv]
        lflops = 4 * g * hkv * d * sum(len(c.members) * c.length for c in cs)
        for form in ("rows", "slab", "tma") if lv else ("slab", "tma"):
            if form == "tma" and args.smoke:
                continue
            for cfg in cands:
                t = bench(level_fn(lv, form, cfg), rep_ms=rep)
                records.append({"form": "level", "level": lv, "load": form, "cfg": asdict(cfg), "us": t.us,
                                "tflops": lflops / t.us / 1e6,
                                "hbm_tbps": sum(c.length for c in cs) * kv_tok / t.us / 1e6})
                print(f"level {lv} {form:4s} bm{cfg.block_m} bn{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages} "
                      f"tp{cfg.target_programs}  {t.us:8.1f} us  {records[-1]['tflops']:6.1f} TFLOP/s  "
                      f"{records[-1]['hbm_tbps']:5.2f} TB/s", flush=True)
    if args.out is None and args.smoke:
        print("smoke run: numbers mean nothing; not written unless --out was given")
        return 0
    config = {"levels": levels, "batch": b, "hq": g * hkv, "hkv": hkv, "d": d, "dtype": str(dtype),
              "suffix": [16, 512], "hbm_tbps": args.hbm_tbps, "peak_tflops": args.peak_tflops}
    write_result(args.out or "results/h200/microbench/tree-passes.json", config, records, floor_us=floor_us,
                 suffix_us=t_suffix, shared_flops=flops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
