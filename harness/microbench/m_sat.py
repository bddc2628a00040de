"""The M_sat fit: per GQA ratio, the M_eff = B*g threshold at which the dispatcher turns dense.

Fitted from the kernels microbench's B x Lp sweep (`harness.microbench.kernels`) and written into
the end of the hardware yaml (`conf/hardware/<hw>.yaml`, after `M_SAT_BEGIN`); tests/kernels/test_bench_fit.py.
"""

from __future__ import annotations

import math
from pathlib import Path

M_SAT_BEGIN = "# --- m_sat: written by harness/microbench/kernels.py (do not edit by hand) ---"


def fit_m_sat(records: list[dict], gs, lps, batches) -> dict:
    """Per g, the dispatch threshold that serves the sweep best: for each candidate M_sat (every
    swept M_eff = B*g, or "never"), dispatch every (B, Lp) cell to dense when B*g >= M_sat and
    to cascade otherwise, and score the candidate by the mean over cells of the dispatched
    time / the faster pass's time (1.0 = always the right pass). The smallest candidate with
    the lowest score wins. Dense here is the faster of its fused and cuBLAS forms."""
    fit: dict = {"by_g": {}, "regret": {}, "rule": "min mean(t_dispatched / t_best) over the B x Lp sweep"}
    never = 2 * max(batches) * max(gs)

    for g in gs:

        def t(op, b, length, g=g):
            xs = [
                r["us"]
                for r in records
                if r.get("sweep") and r["op"] == op and r["g"] == g and r["Lp"] == length and r["B"] == b
            ]
            return min(xs) if xs else math.inf

        cells = [(b, length) for b in batches for length in lps]
        cascade = {c: t("prefix_cascade", *c) for c in cells}
        dense = {c: min(t("prefix_dense", *c), t("prefix_dense_cublas", *c)) for c in cells}
        scores = {}
        for m in sorted({b * g for b in batches}) + [never]:
            ratios = []
            for c in cells:
                best = min(cascade[c], dense[c])
                if math.isfinite(best):
                    ratios.append((dense[c] if c[0] * g >= m else cascade[c]) / best)
            scores[m] = sum(ratios) / max(1, len(ratios))
        best_m = min(scores, key=lambda m: (round(scores[m], 4), m))
        fit["by_g"][g] = best_m
        fit["regret"][g] = {str(m): round(v, 4) for m, v in scores.items()}
    return fit



def write_hardware_yaml(path: Path, fit: dict, source: str) -> str:
    """Replace the m_sat block at the end of the hardware yaml (everything after the marker)."""
    text = path.read_text() if path.exists() else ""
    text = text.split(M_SAT_BEGIN)[0].rstrip("\n") + "\n"
    by_g = fit["by_g"]
    lines = [
        M_SAT_BEGIN,
        f"# fitted from {source}: per GQA ratio g, the M_eff = B*g threshold (dense when",
        "# M_eff >= m_sat, else cascade) with the lowest mean dispatched/best time over the",
        "# B x Lp sweep; a value above every swept M_eff means dense never paid off there.",
        f"m_sat: {by_g.get(4, next(iter(by_g.values())))}  # g = 4 (Llama-3.1-8B), the engine default",
        "m_sat_by_g:",
    ]
    lines += [f"  {g}: {m}" for g, m in sorted(by_g.items())]
    text += "\n".join(lines) + "\n"
    return text


