"""The kernel pages of docs/generated/: the ceilings every floor uses, the kernels microbench,
the extend kernel's key splits, and the prefix pass with and without Triton's int specialization.
"""

from __future__ import annotations

import yaml

from harness.docs.common import H200, HARDWARE, HEADER, Sources, cite, fmt, git_short, md_table


def render_ceilings(src: Sources) -> str:
    """The ceilings every floor uses (the hardware conf) beside the ones the kernel run measured."""
    hw = yaml.safe_load((src.root / HARDWARE).read_text())
    kern = src.json(f"{H200}/microbench/kernels.json")
    cudnn = kern["summary"]["bars"]["cudnn_decode_TBps"]
    out = [HEADER, "", "Ceilings the floors are computed against (`conf/hardware/h200.yaml`):", ""]
    out += md_table(("ceiling", "value"), [
        ("copy, read + write (TB/s)", hw["copy_tbps"]),
        ("read-mostly stream: cuDNN fused attention decoding contiguous K/V (TB/s)", hw["hbm_read_tbps"]),
        ("bf16 GEMM (TFLOP/s)", hw["peak_bf16_tflops"]),
        ("SMs", hw["sms"]),
        ("L2 (MB)", hw["l2_mb"]),
    ])
    out += ["", f"Measured in the kernel run (git {git_short(kern)}; L2 flushed before each timed replay, "
            "so graph-replayed GEMMs on random data read below the conf's GEMM figure):", ""]
    rows = [(k, v) for k, v in kern["ceilings"].items()] + [("cudnn_decode_TBps", cudnn)]
    out += md_table(("ceiling", "value"), rows)
    out += ["", cite(HARDWARE, f"{H200}/microbench/kernels.json")]
    return "\n".join(out) + "\n"


def render_kernels(src: Sources) -> str:
    """Floors, achieved fractions, the Table 5 analog, the B x Lp sweep and the m_sat fit."""
    from harness.microbench.kernel_report import render_notes

    block = render_notes(src.json(f"{H200}/microbench/kernels.json"))
    return f"{HEADER}\n\n{block}\n\n{cite(f'{H200}/microbench/kernels.json')}\n"


def render_extend(src: Sources) -> str:
    """Key splits of the extend kernel, and whole extend steps eager against CUDA graphs."""
    kern_rel, eng_rel = f"{H200}/microbench/extend-steps.json", f"{H200}/microbench/extend-steps-engine.json"
    kern, eng = src.json(kern_rel), src.json(eng_rel)
    cases: dict[tuple[int, int, int], list[dict]] = {}
    for r in kern["records"]:
        cases.setdefault((r["Lp"], r["n"], r["new"]), []).append(r)
    rows = []
    for (lp, n, new), rs in sorted(cases.items()):
        one = next((r for r in rs if r["splits"] == 1), None)
        auto = next((r for r in rs if r["splits"] == r["auto_splits"]), None)
        best = min(rs, key=lambda r: r["us"])
        rows.append((lp, f"{n} × {new}", fmt(one and one["us"], ".1f"),
                     f"{fmt(auto and auto['us'], '.1f')} ({rs[0]['auto_splits']})",
                     f"{best['us']:.1f} ({best['splits']})", f"{rs[0]['floor_us']:.1f}",
                     fmt(auto and rs[0]["floor_us"] / auto["us"])))
    out = [HEADER, "", f"Extend kernel per layer (µs), n requests × new tokens behind an Lp-token prefix, "
           f"the fill policy's split count (auto) against one split and the best swept count "
           f"(git {git_short(kern)}):", ""]
    out += md_table(("Lp", "n × new", "1 split", "auto (splits)", "best (splits)", "floor", "auto: floor / time"),
                  rows)
    steps: dict[tuple[int, int, int], dict[str, dict]] = {}
    for r in eng["records"]:
        steps.setdefault((r["Lp"], r["n"], r["new"]), {})[r["variant"]] = r
    out += ["", f"Whole engine extend steps (ms of wall time, GPU busy in parentheses; git {git_short(eng)}):", ""]
    out += md_table(("Lp", "n × new", "no split", "split", "split + extend graphs"),
                  [(lp, f"{n} × {new}",
                    *(f"{v[k]['step_ms']:.1f} ({v[k]['gpu_busy_ms']:.1f})" if k in v else "—"
                      for k in ("no-split", "split", "split+graphs")))
                   for (lp, n, new), v in sorted(steps.items())])
    out += ["", cite(kern_rel, eng_rel)]
    return "\n".join(out) + "\n"


def render_specialize(src: Sources) -> str:
    """The prefix pass with and without Triton's int specialization, per launch and first call."""
    rel = f"{H200}/microbench/specialize.json"
    doc = src.json(rel)
    rows = [(r["classes"], r["class_size"], r["tiles"], f"{r['unspecialized']['us']:.2f}",
             f"{r['specialized']['us']:.2f}", f"{r['unspecialized_over_specialized']:.4f}",
             f"{r['unspecialized']['first_call_ms']:.1f}", f"{r['specialized']['first_call_ms']:.1f}")
            for r in doc["records"]]
    out = [HEADER, "", f"Prefix pass (Lp = {doc['config'].get('lp', 8192)}, 32/8 heads, bf16), one launch per "
           f"case, in the order run on an empty Triton cache (git {git_short(doc)}); first call = the case's first "
           "launch, a compile when its int arguments form a new specialization:", ""]
    out += md_table(("classes", "class size", "TILES", "unspecialized µs", "specialized µs", "ratio",
                   "first call ms (unspec.)", "first call ms (spec.)"), rows)
    out += ["", cite(rel)]
    return "\n".join(out) + "\n"
