"""The kernels microbench's report: the console table of a run, and the generated Markdown tables
of docs (`python -m harness.microbench.kernels --notes RESULT_JSON [--notes-into FILE]`).

The measured tables in the docs are rendered from result files here, never typed by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.microbench.kernel_bench import Bench


def print_table5(bn: Bench) -> None:
    print(f"\n== Table 5 analog (B={bn.plan.headline_b}, Lp={bn.plan.headline_lp}, g=4) ==")
    print(f"{'op':22s} {'layout':13s} {'splits':>6s} {'us':>9s} {'KV GB/s':>9s} {'TFLOP/s':>8s}")
    for r in bn.records:
        if (r.get("table5") or r.get("table5_split_variant")
                or (r["op"].startswith("sdpa") and r["B"] == bn.plan.headline_b)):
            print(
                f"{r['op']:22s} {r['layout']:13s} {r.get('max_splits', ''):>6} {r['us']:9.1f} "
                f"{r.get('kv_GBps', r['GBps']):9.0f} {r['TFLOPs']:8.1f}"
            )


def print_table(bn: Bench, summary: dict) -> None:
    print_table5(bn)
    print("\n== sweep (us per launch) ==")
    for g in bn.plan.gs:
        for length in bn.plan.lps:
            cells = []
            for b in bn.plan.batches:
                xs = {
                    r["op"]: r["us"]
                    for r in bn.records
                    if r.get("sweep") and r["g"] == g and r["Lp"] == length and r["B"] == b
                }
                cells.append(
                    f"B{b}:"
                    + "/".join(
                        f"{xs.get(o, float('nan')):.0f}"
                        for o in ("decode_paged", "prefix_cascade", "prefix_dense", "prefix_dense_cublas")
                    )
                )
            print(f"g={g} Lp={length:5d} decode/cascade/dense/cublas  " + "  ".join(cells))
    print("\n== checks ==")
    for c in bn.checks:
        print(f"{c['op']:34s} rel_err={c['rel_err']:.2e} {'ok' if c['ok'] else 'FAIL'}")
    print("\n== bars ==")
    for k, v in summary["bars"].items():
        print(f"{k}: {v}")
    print(f"m_sat: {summary['m_sat']['by_g']}  regret: {summary['m_sat']['regret']}")


# ---- docs/generated/kernels.md: the measured tables are rendered from result files, never typed ----------
NOTES_BEGIN = "<!-- kernels-microbench:begin (generated: python -m harness.microbench.kernels --notes) -->"
NOTES_END = "<!-- kernels-microbench:end -->"
# the ceilings of docs/design.md, "Numbers to design against"
HBM_READ = 4.48e12  # B/s: cuDNN decode reading contiguous KV on an H200, the read ceiling
GEMM_PEAK = 779e12  # FLOP/s: bf16 GEMM on an H200


def _floor_us(nbytes: float, flops: float) -> tuple[float, str]:
    tb, tf = nbytes / HBM_READ * 1e6, flops / GEMM_PEAK * 1e6
    return (tb, "bytes") if tb >= tf else (tf, "FLOPs")


def render_notes(result: dict) -> str:
    """Markdown tables of one result file for docs/generated/kernels.md."""
    env, ceil, summ, recs = result["env"], result["ceilings"], result["summary"], result["records"]
    bars_ = summ["bars"]
    out = [NOTES_BEGIN, ""]
    out.append(
        f"Run: {env.get('gpu')}, torch {env.get('torch')}, triton {env.get('triton')}, "
        f"git {str(env.get('git_sha'))[:7]}, {env.get('started_at')}; "
        f"file `results/h200/microbench/kernels.json`."
    )
    for st in result.get("stages", []):
        e = st.get("env", {})
        out.append(
            f"Its {st.get('records')} Table 5 records (those of the Table 5 analog below) are from a later "
            f"`--stage {st.get('stage')}` run merged in: {e.get('gpu')}, git {str(e.get('git_sha'))[:7]}, "
            f"{e.get('started_at')}, configs from `{st.get('configs_from')}`."
        )
    out += ["", "Ceilings measured in the same run:", "", "| ceiling | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in ceil.items()]
    cudnn = max((r.get("kv_GBps", 0) for r in recs if r["op"] == "sdpa_decode_cudnn"), default=0)
    out += [
        "",
        "| bar | target | measured | met |",
        "|---|---|---|---|",
        f"| decode_paged, unique layout, B=256 Lp=8K: K/V read | >= 4.0 TB/s and >= 90% of cuDNN "
        f"({cudnn / 1e3:.2f} TB/s here) | {bars_.get('decode_unique_TBps')} TB/s = "
        f"{bars_.get('decode_vs_cudnn')} x cuDNN | {bars_.get('bar_decode_4TBps')} |",
        f"| fastest prefix pass (shared) vs decode_paged (unique), B=256 Lp=8K | >= 25x | "
        f"{bars_.get('prefix_speedup_vs_unique')}x ({bars_.get('fastest_prefix_op')}) | "
        f"{bars_.get('bar_prefix_25x')} |",
        f"| prefix_cascade vs decode_paged (unique), B=32 Lp=8K | >= 4x | "
        f"{bars_.get('cascade_speedup_B32')}x | {bars_.get('bar_cascade_4x')} |",
        f"| extend, 64 x (16K cached + 256 new) | >= 40% of 779 TFLOP/s | {bars_.get('extend_TFLOPs')} "
        f"TFLOP/s = {bars_.get('extend_frac_of_779')} (of this run's GEMM: "
        f"{bars_.get('extend_frac_of_measured_gemm')}) | {bars_.get('bar_extend_40pct')} |",
    ]

    def pick(op, layout, b, lp, g=4, **kw):
        xs = [
            r
            for r in recs
            if r["op"] == op
            and r["layout"] == layout
            and r["B"] == b
            and r["Lp"] == lp
            and r["g"] == g
            and all(r.get(k) == v for k, v in kw.items())
        ]
        return min(xs, key=lambda r: r["us"]) if xs else None

    out += [
        "",
        "Floors (max of bytes / 4.48 TB/s and FLOPs / 779 TFLOP/s) and achieved fraction "
        "(floor / measured), g = 4:",
        "",
        "| op | layout | B | Lp | bytes (GB) | GFLOP | floor (us) | bound by | measured (us) | achieved |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [
        pick("decode_paged", "unique", 256, 8192, table5=True),
        pick("decode_paged", "paged-shared", 256, 8192, table5=True),
        pick("prefix_dense", "shared", 256, 8192, table5=True),
        pick("prefix_dense", "unique", 256, 8192, table5=True),
        pick("prefix_cascade", "shared", 256, 8192, table5=True),
        pick("prefix_cascade", "paged-shared", 256, 8192, table5=True),
        pick("prefix_dense_cublas", "shared", 256, 8192, table5=True),
        pick("sdpa_prefix_cudnn", "shared", 256, 8192),
        pick("decode_paged", "unique", 32, 8192, sweep=True),
        pick("prefix_cascade", "shared", 32, 8192, sweep=True),
        pick("prefix_cascade", "shared", 8, 16384, sweep=True),
        pick("decode_paged", "unique", 8, 2048, sweep=True),
        pick("extend", "unique", 64, 16384),
    ]
    for r in rows:
        if not r:
            continue
        nbytes = r["GBps"] * r["us"] * 1e3
        flops = r["TFLOPs"] * r["us"] * 1e6
        fl, bound = _floor_us(nbytes, flops)
        out.append(
            f"| {r['op']} | {r['layout']} | {r['B']} | {r['Lp']} | {nbytes / 1e9:.3f} | {flops / 1e9:.1f} | "
            f"{fl:.1f} | {bound} | {r['us']:.1f} | {fl / r['us']:.2f} |"
        )
    base = pick("decode_paged", "unique", 256, 8192, table5=True)
    dense_u = pick("prefix_dense", "unique", 256, 8192, table5=True)
    out += [
        "",
        "Table 5 analog (B=256, Lp=8K, Llama-3.1-8B head; KV GB/s = logical K/V bytes / time; the paper's "
        "pair is prefix_dense on shared and on unique, one config; splits = split-K count of the launch):",
        "",
        "| op | layout | splits | us | KV GB/s | TFLOP/s | speedup vs prefix_dense unique | "
        "speedup vs decode_paged unique |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in recs:
        if (
            r.get("table5")
            or r.get("table5_split_variant")
            or (r["op"].startswith("sdpa") and r["B"] == 256 and r["Lp"] == 8192)
        ):
            sp = f"{base['us'] / r['us']:.2f}" if base else ""
            spd = f"{dense_u['us'] / r['us']:.2f}" if dense_u else ""
            form = f" ({r['form']})" if r.get("form") else ""
            form += " (split variant, not table5)" if r.get("table5_split_variant") else ""
            out.append(
                f"| {r['op']}{form} | {r['layout']} | {r.get('max_splits', '')} | {r['us']:.1f} | "
                f"{r.get('kv_GBps', r['GBps']):.0f} | {r['TFLOPs']:.1f} | {spd} | {sp} |"
            )
    for g in sorted({r["g"] for r in recs if r.get("sweep")}):
        out += [
            "",
            f"Sweep, g = {g} (Hq = {8 * g}, Hkv = 8, d = 128): median us per launch "
            "(decode TB/s of K/V; dense TFLOP/s)",
            "",
            "| Lp | B | M_eff | decode_paged | prefix_cascade | prefix_dense | prefix_dense_cublas |",
            "|---|---|---|---|---|---|---|",
        ]
        for lp in sorted({r["Lp"] for r in recs if r.get("sweep")}):
            for b in sorted({r["B"] for r in recs if r.get("sweep")}):
                cell = {
                    r["op"]: r
                    for r in recs
                    if r.get("sweep") and r["g"] == g and r["Lp"] == lp and r["B"] == b
                }
                if not cell:
                    continue
                d = cell.get("decode_paged")
                c = cell.get("prefix_cascade")
                de = cell.get("prefix_dense")
                cu = cell.get("prefix_dense_cublas")
                out.append(
                    f"| {lp} | {b} | {b * g} | {d['us']:.0f} ({d['kv_GBps'] / 1e3:.2f}) | {c['us']:.0f} | "
                    f"{de['us']:.0f} ({de['TFLOPs']:.0f}) | {cu['us']:.0f} |"
                    if d and c and de and cu
                    else f"| {lp} | {b} | {b * g} | incomplete | | | |"
                )
    fit = summ["m_sat"]
    out += [
        "",
        f"M_sat fit ({fit.get('rule')}): m_sat by g = {fit['by_g']}",
        "",
        "| g | candidate M_sat: mean dispatched/best time |",
        "|---|---|",
    ]
    for g, sc in fit.get("regret", {}).items():
        out.append(f"| {g} | " + ", ".join(f"{m}: {v}" for m, v in sc.items()) + " |")
    out += [
        "",
        "Tuning at the headline shapes (best three of each):",
        "",
        "| kernel | us | config | splits |",
        "|---|---|---|---|",
    ]
    for k, rows_ in result.get("tuning", {}).items():
        for x in rows_[:3]:
            c = {
                kk: v
                for kk, v in x["cfg"].items()
                if kk in ("block_m", "block_n", "num_warps", "num_stages", "target_programs", "tma")
            }
            out.append(f"| {k} | {x['us']} | {c} | {x.get('max_splits', '')} |")
    out += ["", NOTES_END]
    return "\n".join(out)


def write_notes(result_path: str, notes_path: str | None) -> None:
    result = json.loads(Path(result_path).read_text())
    block = render_notes(result)
    if not notes_path:
        print(block)
        return
    path = Path(notes_path)
    text = path.read_text()
    if NOTES_BEGIN not in text or NOTES_END not in text:
        raise SystemExit(f"{notes_path} has no generated-block markers")
    head, rest = text.split(NOTES_BEGIN, 1)
    tail = rest.split(NOTES_END, 1)[1]
    path.write_text(head + block + tail)

