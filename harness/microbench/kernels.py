"""Attention-kernel microbenchmark: correctness at full size, tuning, Table 5 analog, the
B x Lp sweep, the M_sat fit, and the kernel bars (what the kernels must reach), in one run.

    python -m harness.microbench.kernels --out $OUT/kernels.json --hardware-yaml conf/hardware/h200.yaml
    TRITON_INTERPRET=1 python -m harness.microbench.kernels --smoke   # tiny shapes, CPU interpreter: the script runs
    python -m harness.microbench.kernels --notes RESULT_JSON [--notes-into docs/FILE.md]
    python -m harness.microbench.kernels --stage table5 --merge-into results/h200/microbench/kernels.json \
        [--out FILE]    # only the Table 5 records, with that run's configs, merged into it

The bench itself (shapes, byte and FLOP models, layouts) is `kernel_bench`; the tuning
`kernel_tune`; the M_sat fit `m_sat`; the console and Markdown report `kernel_report`. This
module holds the measured sections (ceilings, Table 5, the sweep, the bars) and the run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from granikv.kernels import (
    CASCADE_CONFIG,
    DENSE_CONFIG,
    DecodeConfig,
    ExtendConfig,
    PrefixConfig,
)
from harness.microbench._timing import bench, env_info
from harness.microbench.kernel_bench import FULL, SMOKE, Bench, KernelBenchPlan, extend_setup
from harness.microbench.kernel_report import print_table, print_table5, write_notes
from harness.microbench.kernel_tune import tune
from harness.microbench.m_sat import fit_m_sat, write_hardware_yaml


# ---- sections ---------------------------------------------------------------------------------
def ceilings(bn: Bench) -> dict:
    p = bn.plan
    src = torch.empty(p.copy_mib * 2**20 // 2, device=bn.dev, dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    t_copy = bench(lambda: dst.copy_(src), rep_ms=p.rep_ms)
    # a graph-captured copy_ may become a copy-engine memcpy node; also time it eagerly and
    # as an SM kernel (x * 1), the form a kernel's own reads and writes take
    t_copy_eager = bench(lambda: dst.copy_(src), rep_ms=p.rep_ms, graph=False)
    t_copy_sm = bench(lambda: torch.mul(src, 1.0, out=dst), rep_ms=p.rep_ms)
    a = torch.randn(p.gemm_n, p.gemm_n, device=bn.dev, dtype=bn.dtype)
    b = torch.randn(p.gemm_n, p.gemm_n, device=bn.dev, dtype=bn.dtype)
    c = torch.empty_like(a)
    t_gemm = bench(lambda: torch.matmul(a, b, out=c), rep_ms=p.rep_ms)
    out = {
        "copy_GBps_read_plus_write": round(2 * src.numel() * 2 / t_copy.us / 1e3, 1),
        "copy_eager_GBps_read_plus_write": round(2 * src.numel() * 2 / t_copy_eager.us / 1e3, 1),
        "sm_copy_GBps_read_plus_write": round(2 * src.numel() * 2 / t_copy_sm.us / 1e3, 1),
        "gemm_bf16_TFLOPs": round(2 * p.gemm_n**3 / t_gemm.us / 1e6, 1),
    }
    print(f"ceilings: {out}", flush=True)
    return out


def sdpa_refs(bn: Bench, g: int) -> dict[str, float]:
    """torch SDPA (cuDNN / flash / efficient) decoding the headline batch from contiguous
    per-request KV, and the dense prefix pass against the slab view; best TB/s per backend."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    p = bn.plan
    b, length = p.headline_b, p.headline_lp
    out: dict[str, float] = {}
    kc = torch.randn(b, p.hkv, length, p.d, device=bn.dev, dtype=bn.dtype, generator=bn.gen)
    vc = torch.randn_like(kc)
    q4 = torch.randn(b, p.hkv, g, p.d, device=bn.dev, dtype=bn.dtype, generator=bn.gen)
    q1 = q4.reshape(b, p.hkv * g, 1, p.d)
    kv_bytes = b * length * bn.kv_tok
    backends = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    for name, be in backends.items():
        for form, fn in (
            ("heads-as-queries", lambda be=be: _sdpa(F, sdpa_kernel, be, q4, kc, vc, bn.sm, False)),
            ("enable_gqa", lambda be=be: _sdpa(F, sdpa_kernel, be, q1, kc, vc, bn.sm, True)),
        ):
            t = bn.time(fn)
            if t:
                rec = bn.record(
                    f"sdpa_decode_{name}",
                    "contiguous",
                    b,
                    length,
                    g,
                    t,
                    kv_bytes + bn.io_bytes(b, g),
                    bn.attn_flops(b, g, length),
                    form=form,
                    kv_GBps=round(kv_bytes / t.us / 1e3, 1),
                )
                out[name] = max(out.get(name, 0.0), rec["kv_GBps"])
                print(f"  sdpa decode {name} ({form}): {t.us:.1f} us, {rec['kv_GBps']:.0f} GB/s", flush=True)
    # the dense prefix pass with off-the-shelf fused attention: [1, Hkv, B*g, d] against the slab
    qd = torch.randn(1, p.hkv, b * g, p.d, device=bn.dev, dtype=bn.dtype, generator=bn.gen)
    slab_k = bn.k[bn.slab_base : bn.slab_base + length].permute(1, 0, 2).unsqueeze(0)
    slab_v = bn.v[bn.slab_base : bn.slab_base + length].permute(1, 0, 2).unsqueeze(0)
    for name, be in backends.items():
        t = bn.time(lambda be=be: _sdpa(F, sdpa_kernel, be, qd, slab_k, slab_v, bn.sm, False))
        if t:
            bn.record(
                f"sdpa_prefix_{name}",
                "shared",
                b,
                length,
                g,
                t,
                length * bn.kv_tok + bn.io_bytes(b, g),
                bn.attn_flops(b, g, length),
            )
            print(f"  sdpa prefix {name}: {t.us:.1f} us", flush=True)
    return out


def _sdpa(F, sdpa_kernel, be, q, k, v, scale, gqa):
    with sdpa_kernel([be]):
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)


def _record_unique_decode(bn: Bench, b: int, length: int, g: int, t, io: int, fl: float, ms, **tag) -> None:
    """decode_paged over per-request pages: bytes = every request's K/V + q/o + its slot indices;
    kv_GBps counts the K/V alone (the Table 5 "unique (paged)" row and the sweep's)."""
    kv_all = b * length * bn.kv_tok
    bn.record("decode_paged", "unique", b, length, g, t, kv_all + io + b * length * 4, fl, **tag, max_splits=ms,
              kv_GBps=round(kv_all / t.us / 1e3, 1))


def table5(bn: Bench, best: dict) -> None:
    p = bn.plan
    b, length, g = p.headline_b, p.headline_lp, 4
    q = bn.q(b, g)
    kv_all = b * length * bn.kv_tok
    io = bn.io_bytes(b, g)
    fl = bn.attn_flops(b, g, length)
    tu = bn.unique_table(b, length)
    fn, ms = bn.decode_fn(q, tu, length, best["decode"], best.get("decode_splits"))
    o, lse = fn()
    bn.check_rows("decode_paged/unique", o, lse, q, lambda r: tu[r], [0, b // 2, b - 1])
    t = bn.time(fn)
    if t:
        _record_unique_decode(bn, b, length, g, t, io, fl, ms, table5=True)
    ts = bn.shared_table(b, length)
    fn, ms = bn.decode_fn(q, ts, length, best["decode"], best.get("decode_splits"))
    o, lse = fn()
    bn.check_rows("decode_paged/paged-shared", o, lse, q, lambda r: ts[r], [0, b - 1])
    t = bn.time(fn)
    if t:
        bn.record(
            "decode_paged",
            "paged-shared",
            b,
            length,
            g,
            t,
            length * bn.kv_tok + io + b * length * 4,
            fl,
            table5=True,
            max_splits=ms,
            kv_GBps=round(kv_all / t.us / 1e3, 1),
        )
    slab = lambda r: torch.arange(bn.slab_base, bn.slab_base + length, device=bn.dev)  # noqa: E731
    shared_splits = None
    for op, layout, cfg, table, ms in (
        ("prefix_dense", "shared", best["dense"], None, best.get("dense_splits")),
        ("prefix_dense_cublas", "shared", None, None, None),
        ("prefix_cascade", "shared", best["cascade"], None, None),
        ("prefix_cascade", "paged-shared", best["cascade"], ts, None),
    ):
        fn, used = bn.prefix_fn(op, q, length, cfg, table=table, max_splits=ms)
        if op == "prefix_dense":
            shared_splits = used
        o, lse = fn()
        bn.check_rows(
            f"{op}/{layout}", o, lse, q, (lambda r: ts[0]) if table is not None else slab, [0, b - 1]
        )
        t = bn.time(fn)
        if t:
            bn.record(
                op,
                layout,
                b,
                length,
                g,
                t,
                length * bn.kv_tok + io,
                fl,
                table5=True,
                max_splits=used,
                kv_GBps=round(kv_all / t.us / 1e3, 1),
            )
    dense_unique(bn, best, q, length, shared_splits)


def dense_unique(bn: Bench, best: dict, q, length: int, shared_splits: int | None) -> None:
    """The paper's Table 5 "unique (paged)" row: the dense prefix kernel with the shared record's
    config (tile shape) over B one-request classes, request r reading its own contiguous copy of
    the prefix (B slabs back to back: every K/V byte read once, B * Lp * kv_tok in all).

    Split-K: the config is the same, but the split count is the kernel's own rule
    (`prefix_max_splits`) for this class list, as the engine would launch it: B one-request
    classes give B x H_kv programs per split (2048 at the headline, one M tile per class, g of its
    BLOCK_M rows used), so the rule picks 1 where the shared launch (B*g/BLOCK_M = 8 M tiles x
    H_kv = 64 programs per split) is tuned to 2. When the two differ the record
    says so, and the launch at the shared record's split count is timed beside it (its record is
    not flagged table5)."""
    b, _, _ = q.shape
    g = q.shape[1] // bn.plan.hkv
    bases = bn.unique_slab_bases(b, length)
    kv_all = b * length * bn.kv_tok
    io = bn.io_bytes(b, g)
    fl = bn.attn_flops(b, g, length)
    own = lambda r: torch.arange(bases[r], bases[r] + length, device=bn.dev)  # noqa: E731
    fn, used = bn.prefix_fn("prefix_dense", q, length, best["dense"], slab_bases=bases)
    o, lse = fn()
    bn.check_rows("prefix_dense/unique", o, lse, q, own, sorted({0, b // 2, b - 1}))
    note = (
        f"same config (tile shape) as prefix_dense/shared; split count from prefix_max_splits for {b} "
        f"one-request classes: {used}"
        + (f" (the shared record's class of {b} requests runs {shared_splits})" if used != shared_splits else "")
    )
    t = bn.time(fn)
    if t:
        bn.record("prefix_dense", "unique", b, length, g, t, kv_all + io, fl, table5=True, max_splits=used,
                  shared_max_splits=shared_splits, split_note=note, kv_GBps=round(kv_all / t.us / 1e3, 1))
    if shared_splits and shared_splits != used:
        fn, used2 = bn.prefix_fn("prefix_dense", q, length, best["dense"], slab_bases=bases, max_splits=shared_splits)
        o, lse = fn()
        bn.check_rows(f"prefix_dense/unique splits={used2}", o, lse, q, own, [0, b - 1])
        t = bn.time(fn)
        if t:
            bn.record("prefix_dense", "unique", b, length, g, t, kv_all + io, fl, table5_split_variant=True,
                      max_splits=used2, shared_max_splits=shared_splits,
                      split_note="the shared record's split count forced on the unique class list",
                      kv_GBps=round(kv_all / t.us / 1e3, 1))


def sweep(bn: Bench, best: dict) -> None:
    p = bn.plan
    for g in p.gs:
        for length in p.lps:
            for b in p.batches:
                q = bn.q(b, g)
                io = bn.io_bytes(b, g)
                fl = bn.attn_flops(b, g, length)
                tu = bn.unique_table(b, length)
                fn, ms = bn.decode_fn(q, tu, length, best["decode"])
                t = bn.time(fn)
                if t:
                    _record_unique_decode(bn, b, length, g, t, io, fl, ms, sweep=True)
                del tu, fn
                for op, cfg in (
                    ("prefix_cascade", best["cascade"]),
                    ("prefix_dense", best["dense"]),
                    ("prefix_dense_cublas", None),
                ):
                    fn, ms = bn.prefix_fn(op, q, length, cfg)
                    t = bn.time(fn)
                    if t:
                        bn.record(
                            op,
                            "shared",
                            b,
                            length,
                            g,
                            t,
                            length * bn.kv_tok + io,
                            fl,
                            sweep=True,
                            max_splits=ms,
                        )
                    del fn
                line = " ".join(f"{r['op']}={r['us']:.0f}" for r in bn.records[-4:])
                print(f"  g={g} Lp={length} B={b}: {line}", flush=True)


def bars(recs: list[dict], p: KernelBenchPlan, sdpa: dict, ceil: dict) -> dict:
    """The kernel bars from a run's records (`sdpa`: best K/V GB/s per SDPA backend)."""

    def find(op, layout, b, length, g=4, **kw):
        xs = [
            r
            for r in recs
            if r["op"] == op
            and r["layout"] == layout
            and r["B"] == b
            and r["Lp"] == length
            and r["g"] == g
            and all(r.get(k) == v for k, v in kw.items())
        ]
        return min(xs, key=lambda r: r["us"]) if xs else None

    hb, hl = p.headline_b, p.headline_lp
    out: dict = {}
    du = find("decode_paged", "unique", hb, hl, table5=True)
    if du:
        out["decode_unique_TBps"] = round(du["kv_GBps"] / 1e3, 3)
        out["cudnn_decode_TBps"] = round(sdpa.get("cudnn", 0.0) / 1e3, 3)
        if sdpa.get("cudnn"):
            out["decode_vs_cudnn"] = round(du["kv_GBps"] / sdpa["cudnn"], 3)
        out["bar_decode_4TBps"] = du["kv_GBps"] >= 4000 and out.get("decode_vs_cudnn", 0) >= 0.9
        prefix = [
            find(op, "shared", hb, hl, table5=True)
            for op in ("prefix_dense", "prefix_dense_cublas", "prefix_cascade")
        ]
        fastest = min((r for r in prefix if r), key=lambda r: r["us"])
        out["fastest_prefix_op"] = fastest["op"]
        out["prefix_speedup_vs_unique"] = round(du["us"] / fastest["us"], 2)
        out["bar_prefix_25x"] = out["prefix_speedup_vs_unique"] >= 25
    cu = find("decode_paged", "unique", p.cascade_b, hl, sweep=True)
    cc = find("prefix_cascade", "shared", p.cascade_b, hl, sweep=True)
    if cu and cc:
        out["cascade_speedup_B32"] = round(cu["us"] / cc["us"], 2)
        out["bar_cascade_4x"] = out["cascade_speedup_B32"] >= 4
    ex = [r for r in recs if r["op"] == "extend"]
    if ex:
        e = min(ex, key=lambda r: r["us"])
        out["extend_TFLOPs"] = e["TFLOPs"]
        out["extend_frac_of_779"] = round(e["TFLOPs"] / 779, 3)
        if ceil["gemm_bf16_TFLOPs"] > 0:
            out["extend_frac_of_measured_gemm"] = round(e["TFLOPs"] / ceil["gemm_bf16_TFLOPs"], 3)
        out["bar_extend_40pct"] = e["TFLOPs"] >= 0.4 * 779
    return out



# ---- the table5 stage: Table 5's records alone, merged into a whole-run result ------------------
def configs_of(result: dict) -> dict:
    """The launch configs (`best` of `tune`) a result file ran with: its summary.best_configs."""
    bc = result.get("summary", {}).get("best_configs")
    if not bc:
        raise ValueError("the result has no summary.best_configs (not a whole run)")
    best: dict = {"decode": DecodeConfig(**bc["decode"]), "dense": PrefixConfig(**bc["dense"]),
                  "cascade": PrefixConfig(**bc["cascade"])}
    if "extend" in bc:
        best["extend"] = ExtendConfig(**bc["extend"])
    for k in ("decode_splits", "dense_splits"):
        if bc.get(k) is not None:
            best[k] = bc[k]
    return best


def is_table5_record(r: dict) -> bool:
    """A record `table5()` writes (the Table 5 set, and the split variant of prefix_dense/unique)."""
    return bool(r.get("table5") or r.get("table5_split_variant"))


def merge_table5(result: dict, records: list[dict], checks: list[dict], env: dict, configs_from: str,
                 plan: KernelBenchPlan) -> dict:
    """`result` (a whole run) with its Table 5 records replaced by `records` (one `table5()` run, so
    every ratio between them is within one run), each carrying that run's `env` (which
    harness.run.results prefers to the file's); the checks of the same ops replaced; the bars
    recomputed from the merged records; the run listed under `stages`. Other records untouched."""
    out = dict(result)
    old = [r for r in result["records"] if is_table5_record(r)]
    out["records"] = [r for r in result["records"] if not is_table5_record(r)] + [{**r, "env": env} for r in records]
    names = {c["op"] for c in checks}
    out["checks"] = [c for c in result.get("checks", []) if c["op"] not in names] + [
        {**c, "stage": "table5"} for c in checks
    ]
    out["stages"] = [*result.get("stages", []), {"stage": "table5", "env": env, "configs_from": configs_from,
                                                 "records": len(records), "replaced": len(old)}]
    if "summary" in result:
        sdpa: dict[str, float] = {}
        for r in out["records"]:
            if r["op"].startswith("sdpa_decode_") and r.get("kv_GBps"):
                name = r["op"].removeprefix("sdpa_decode_")
                sdpa[name] = max(sdpa.get(name, 0.0), r["kv_GBps"])
        out["summary"] = {**result["summary"], "bars": bars(out["records"], plan, sdpa, result["ceilings"])}
    return out


def table5_stage(plan: KernelBenchPlan, smoke: bool, out: str | None, configs_from: str | None,
                 merge_into: str | None) -> int:
    """Measure `table5()` alone: with the configs of `configs_from` (or `merge_into`), else tuned
    here; written into `merge_into` (see `merge_table5`) at `out`, or as a file of its own."""
    t0 = time.time()
    target = json.loads(Path(merge_into).read_text()) if merge_into else None
    source = configs_from or merge_into
    bn = Bench(plan, smoke)
    env = env_info()
    if source:
        best = configs_of(target if source == merge_into else json.loads(Path(source).read_text()))
    else:
        best = tune(bn)
        source = "tuned in this run"
    configs = {k: (asdict(v) if hasattr(v, "__dataclass_fields__") else v) for k, v in best.items()}
    print(f"configs ({source}): {configs}")
    table5(bn, best)
    if target is not None:
        doc = merge_table5(target, bn.records, bn.checks, env, source, plan)
    else:
        doc = {"env": env, "stage": "table5", "configs_from": source, "best_configs": configs, "checks": bn.checks,
               "tuning": bn.tuning, "records": bn.records}
    out_path = Path(out or merge_into or ("/tmp/kernels-table5-smoke.json" if smoke else "/tmp/kernels-table5.json"))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=1) + "\n")
    print_table5(bn)
    for c in bn.checks:
        print(f"{c['op']:34s} rel_err={c['rel_err']:.2e} {'ok' if c['ok'] else 'FAIL'}")
    merged = f" (merged into {merge_into})" if merge_into else ""
    print(f"\nwrote {out_path}{merged}: {len(bn.records)} Table 5 records in {time.time() - t0:.0f} s")
    return 0 if all(c["ok"] for c in bn.checks) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="result JSON (default results/h200/microbench/kernels.json)")
    ap.add_argument("--hardware-yaml", default=None, help="hardware yaml whose m_sat block to rewrite")
    ap.add_argument("--yaml-out", default=None, help="write the updated yaml here instead of in place")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; runs on CPU under the interpreter")
    ap.add_argument(
        "--notes", default=None, metavar="RESULT_JSON", help="render the Markdown tables of a result "
        "(docs/generated/kernels.md)"
    )
    ap.add_argument("--notes-into", default=None, help="replace the generated block of this markdown file")
    ap.add_argument(
        "--stage", choices=("all", "table5"), default="all", help="all: the whole run; table5: only the "
        "Table 5 records (no ceilings, SDPA, extend, sweep or M_sat fit)"
    )
    ap.add_argument(
        "--configs-from", default=None, metavar="RESULT_JSON", help="(--stage table5) launch configs from "
        "this result's summary.best_configs instead of tuning (default: the --merge-into file's)"
    )
    ap.add_argument(
        "--merge-into", default=None, metavar="RESULT_JSON", help="(--stage table5) a whole-run result: "
        "replace its Table 5 records and their checks with this run's, keep every other record, recompute "
        "its bars, and write it to --out (default: in place)"
    )
    args = ap.parse_args(argv)
    if args.notes:
        write_notes(args.notes, args.notes_into)
        return 0
    smoke = args.smoke or not torch.cuda.is_available()
    if smoke and not args.smoke:
        print("no CUDA device: running the smoke plan (numbers are not measurements)")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        # Triton reads the variable when it is imported (above): without it there is no backend
        print("error: no CUDA device; run the smoke plan under Triton's CPU interpreter: "
              "TRITON_INTERPRET=1 python -m harness.microbench.kernels --smoke", file=sys.stderr)
        return 2
    plan = SMOKE if smoke else FULL
    if args.stage == "table5":
        return table5_stage(plan, smoke, args.out, args.configs_from, args.merge_into)
    if args.configs_from or args.merge_into:
        ap.error("--configs-from and --merge-into go with --stage table5")
    out_path = Path(
        args.out or ("/tmp/kernels-smoke.json" if smoke else "results/h200/microbench/kernels.json")
    )
    t0 = time.time()
    bn = Bench(plan, smoke)
    env = env_info()
    ceil = ceilings(bn)
    best = tune(bn)
    print(f"best: { {k: (asdict(v) if hasattr(v, '__dataclass_fields__') else v) for k, v in best.items()} }")
    partial = {"env": env, "ceilings": ceil, "records": bn.records, "checks": bn.checks, "tuning": bn.tuning}

    def save(stage: str) -> None:  # keep what is measured if the run is cut short
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps({**partial, "stage": stage}, indent=1) + "\n")

    save("tuned")
    sdpa = sdpa_refs(bn, 4)
    table5(bn, best)
    ext = extend_setup(bn)
    fn = ext["make"](best["extend"])
    fn()
    bn.check_extend(ext["out"], ext["q"], ext["table"], ext["indptr"], plan.ext_prefix, [0, plan.ext_n - 1])
    t = bn.time(fn)
    if t:
        rec = bn.record(
            "extend",
            "unique",
            plan.ext_n,
            plan.ext_prefix,
            4,
            t,
            ext["nbytes"],
            ext["flops"],
            new_tokens=plan.ext_new,
            cfg=asdict(best["extend"]),
        )
        print(f"extend: {t.us:.0f} us, {rec['TFLOPs']:.0f} TFLOP/s", flush=True)
    del ext, fn
    save("table5")
    sweep(bn, best)
    fit = fit_m_sat(bn.records, plan.gs, plan.lps, plan.batches)
    summary = {
        "bars": bars(bn.records, plan, sdpa, ceil),
        "m_sat": fit,
        "best_configs": {
            k: (asdict(v) if hasattr(v, "__dataclass_fields__") else v) for k, v in best.items()
        },
        "default_configs": {
            "decode": asdict(DecodeConfig()),
            "cascade": asdict(CASCADE_CONFIG),
            "dense": asdict(DENSE_CONFIG),
            "extend": asdict(ExtendConfig()),
        },
        "wall_s": round(time.time() - t0, 1),
    }
    result = {
        "env": env,
        "ceilings": ceil,
        "summary": summary,
        "checks": bn.checks,
        "tuning": bn.tuning,
        "records": bn.records,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    if args.hardware_yaml:
        src = Path(args.hardware_yaml)
        text = write_hardware_yaml(src, fit, "results/h200/microbench/kernels.json")
        Path(args.yaml_out or src).write_text(text)
    print_table(bn, summary)
    print(f"\nwrote {out_path} ({len(bn.records)} records) in {time.time() - t0:.0f} s")
    return 0 if all(c["ok"] for c in bn.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
