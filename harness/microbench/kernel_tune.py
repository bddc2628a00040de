"""Launch-shape tuning of the attention kernels: the candidate configs and the pick at the headline shape.

Every candidate is timed and recorded (`Bench.tuning`), so the choice can be re-checked from the
result file; the winners feed the Table 5 analog and the sweep of `harness.microbench.kernels`.
"""

from __future__ import annotations

from dataclasses import asdict

from granikv.kernels import (
    DecodeConfig,
    ExtendConfig,
    PrefixConfig,
)
from harness.microbench.kernel_bench import Bench, extend_setup

DECODE_CANDIDATES = [
    DecodeConfig(block_n=bn, num_warps=w, num_stages=s)
    for bn, w, s in [(64, 4, 3), (64, 4, 4), (128, 8, 3), (32, 4, 4), (128, 4, 2)]
]
_DENSE = dict(min_split_len=1024, target_programs=1, max_splits_cap=8)
DENSE_CANDIDATES = [
    PrefixConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s, tma=tma, **_DENSE)
    for bm, bn, w, s, tma in [
        (128, 128, 8, 3, True),
        (128, 128, 8, 3, False),
        (128, 64, 8, 3, True),
        (64, 64, 4, 3, True),
        (64, 64, 4, 4, True),
        (64, 128, 4, 3, True),
        (64, 128, 4, 2, True),
        (64, 64, 4, 2, True),
    ]
]
CASCADE_CANDIDATES = [
    PrefixConfig(
        block_m=bm, block_n=bn, num_warps=w, num_stages=s, min_split_len=256, target_programs=tp, tma=tma
    )
    for bm, bn, w, s, tp, tma in [
        (64, 128, 4, 3, 1, False),
        (64, 128, 4, 3, 1, True),
        (64, 64, 4, 3, 2, False),
        (64, 64, 4, 3, 2, True),
        (64, 64, 4, 3, 1, True),
        (32, 64, 4, 3, 2, True),
        (64, 128, 4, 3, 2, True),
    ]
]
EXTEND_CANDIDATES = [
    ExtendConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s)
    for bm, bn, w, s in [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 4, 4), (128, 64, 4, 2), (128, 32, 4, 4)]
]


def _trial(bn: Bench, rows: list, label: str, fn, row: tuple) -> None:
    """Time one candidate; when it ran, keep (us, *row) — row is (cfg[, splits used, ...]) — and say so."""
    t = bn.time(fn)
    if t:
        rows.append((t.us, *row))
        splits = f" splits={row[1]}" if len(row) > 1 else ""
        print(f"  tune {label} {row[0]}{splits}: {t.us:.1f} us", flush=True)


def tune(bn: Bench) -> dict[str, object]:
    """Pick each kernel's launch shape at its headline shape; all candidates recorded."""
    p = bn.plan
    lim = None if p.tune else 1  # smoke: one candidate each, to exercise the code path
    best: dict[str, object] = {}
    b, length, g = p.headline_b, p.headline_lp, 4
    q = bn.q(b, g)
    table = bn.unique_table(b, length)
    rows = []
    for cfg in DECODE_CANDIDATES[:lim]:
        fn, used = bn.decode_fn(q, table, length, cfg, max_splits=1)
        _trial(bn, rows, "decode", fn, (cfg, used))
    rows.sort(key=lambda r: r[0])
    for _, cfg, _ in rows[:1]:  # does a second split help the best (tail of the last wave)?
        fn, used = bn.decode_fn(q, table, length, cfg, max_splits=2)
        _trial(bn, rows, "decode", fn, (cfg, used))
    rows.sort(key=lambda r: r[0])
    bn.tuning["decode"] = [{"us": round(u, 2), "cfg": asdict(c), "max_splits": s} for u, c, s in rows]
    best["decode"] = rows[0][1]
    best["decode_splits"] = rows[0][2]
    del table

    rows = []
    for cfg in DENSE_CANDIDATES[:lim]:
        for ms in ((1, 2) if cfg.block_m == 64 else (2,))[:lim]:
            fn, used = bn.prefix_fn("prefix_dense", q, length, cfg, max_splits=ms)
            _trial(bn, rows, "dense", fn, (cfg, used, ms))
    rows.sort(key=lambda r: r[0])
    bn.tuning["prefix_dense"] = [
        {"us": round(u, 2), "cfg": asdict(c), "max_splits": s} for u, c, s, _ in rows
    ]
    best["dense"] = rows[0][1]
    best["dense_splits"] = rows[0][3]

    rows = []
    qc = bn.q(p.cascade_b, g)
    for cfg in CASCADE_CANDIDATES[:lim]:
        fn, used = bn.prefix_fn("prefix_cascade", qc, length, cfg)
        _trial(bn, rows, "cascade", fn, (cfg, used))
    rows.sort(key=lambda r: r[0])
    bn.tuning["prefix_cascade"] = [{"us": round(u, 2), "cfg": asdict(c), "max_splits": s} for u, c, s in rows]
    best["cascade"] = rows[0][1]

    rows = []
    ext = extend_setup(bn)
    for cfg in EXTEND_CANDIDATES[:lim]:
        _trial(bn, rows, "extend", ext["make"](cfg), (cfg,))
    rows.sort(key=lambda r: r[0])
    bn.tuning["extend"] = [{"us": round(u, 2), "cfg": asdict(c)} for u, c in rows]
    best["extend"] = rows[0][1]
    return best


