"""The fit and the Markdown section of the prefix-pass rule sweep (`harness.microbench.prefix_rule`).

`fit_rule(records)` (pure; tests/harness/microbench/test_prefix_rule_bench.py) reads wins (gain_us > 0)
against the saved MiB per layer. `render(path)` gives the fit (the total-saved-MiB threshold,
the lost/won bounds and the least-squares break-even per form, and how many points the
per-class and the total rule each misclassify at their best threshold) and, per form, a table
of t_pass / t_plain with rows Lp x n and columns C (below 1: the pass won).
"""

from __future__ import annotations

import json
from pathlib import Path


def _best_cut(points: list[tuple[float, bool]]) -> dict:
    """Threshold t (take the pass when x >= t) that misclassifies the fewest (x, won) points;
    the smallest such t on ties; t = None: never take it."""
    best_t, best_bad = None, sum(w for _, w in points)
    for t in sorted({x for x, _ in points}):
        bad = sum((x >= t) != w for x, w in points)
        if bad < best_bad:
            best_t, best_bad = t, bad
    return {"threshold_mib": best_t, "misclassified": best_bad}


def _lsq(xs: list[float], ys: list[float]) -> dict | None:
    """gain_us ~ a * saved_mib - b: a (us per MiB), b (us), break-even b / a (MiB), r2."""
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    b = a * mx - my
    syy = sum((y - my) ** 2 for y in ys)
    r2 = 1 - sum((y - (a * x - b)) ** 2 for x, y in zip(xs, ys)) / syy if syy else None
    return {"a_us_per_mib": a, "b_us": b, "break_even_mib": b / a if a > 0 else None, "r2": r2}


def _threshold(pairs: list[tuple[float, bool]]) -> float | None:
    """The smallest measured saving above which every point wins (None: none does)."""
    lost = max((x for x, w in pairs if not w), default=None)
    above = [x for x, w in pairs if w and (lost is None or x > lost)]
    return min(above) if above else None


def fit_rule(records: list[dict]) -> dict:
    """Wins (gain_us > 0) against saved MiB, per form and pooled. See the module docstring."""
    recs = [r for r in records if r.get("gain_us") is not None]
    out: dict = {"points": len(recs), "by_form": {},
                 "rule": "a pass kind takes the pass when the sum over its classes of saved MiB >= min_saved_mib"}
    for form in sorted({r["form"] for r in recs}):
        rs = [r for r in recs if r["form"] == form]
        pairs = [(r["saved_mib_total"], r["gain_us"] > 0) for r in rs]
        out["by_form"][form] = {
            "points": len(rs), "won": sum(w for _, w in pairs),
            "lost_max_mib": max((x for x, w in pairs if not w), default=None),
            "won_min_mib": min((x for x, w in pairs if w), default=None),
            "threshold_mib": _threshold(pairs),
            "lsq": _lsq([r["saved_mib_total"] for r in rs], [r["gain_us"] for r in rs]),
        }
    pairs = [(r["saved_mib_total"], r["gain_us"] > 0) for r in recs]
    out["lost_max_mib"] = max((x for x, w in pairs if not w), default=None)
    out["min_saved_mib"] = _threshold(pairs)
    sep = {}
    for scope in ["all", *out["by_form"]]:
        rs = [r for r in recs if scope == "all" or r["form"] == scope]
        sep[scope] = {rule: _best_cut([(r[f"saved_mib_{rule}"], r["gain_us"] > 0) for r in rs])
                      for rule in ("total", "per_class")}
    out["separation"] = sep
    t, pc = sep["all"]["total"]["misclassified"], sep["all"]["per_class"]["misclassified"]
    out["better_rule"] = "total" if t < pc else "per_class" if pc < t else "tie"
    return out


def overlap_lines(records: list[dict], fit: dict) -> list[str]:
    """Per form, the points between the smallest win and the largest loss, by total saving."""
    out = []
    for form, f in fit.get("by_form", {}).items():
        lo, hi = f["won_min_mib"], f["lost_max_mib"]
        if lo is None or hi is None or lo > hi:
            continue
        rs = sorted((r for r in records if r["form"] == form and r.get("gain_us") is not None
                     and lo <= r["saved_mib_total"] <= hi), key=lambda r: r["saved_mib_total"])
        out.append(f"{form}: wins and losses overlap in total saved MiB (MiB: C n Lp: gain us):")
        out.append("  " + "; ".join(f"{r['saved_mib_total']:.0f}: {r['C']} {r['n']} {r['Lp']}: {r['gain_us']:+.1f}"
                                    for r in rs))
    return out


def _f(x, spec: str = ".0f") -> str:
    return "—" if x is None else format(x, spec)


def _table(header, rows) -> list[str]:
    out = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def _fit_lines(fit: dict) -> list[str]:
    best = (fit.get("separation", {}).get("all") or {}).get("total") or {}
    out = [f"{fit.get('points', 0)} timed points. The total saved K/V reads per layer of one pass kind that best "
           f"separates wins from losses: **{_f(best.get('threshold_mib'))} MiB** ({best.get('misclassified', '—')} "
           "points misclassified; `conf/hardware/h200.yaml` takes this value). No threshold separates them all: "
           f"the smallest total above which every point of both forms won is {_f(fit.get('min_saved_mib'))} MiB, "
           f"the largest that lost {_f(fit.get('lost_max_mib'))} MiB.", ""]
    rows = []
    for form, f in fit.get("by_form", {}).items():
        ls = f.get("lsq") or {}
        rows.append((form, f"{f['won']} / {f['points']}", _f(f["lost_max_mib"]), _f(f["won_min_mib"]),
                     _f(f["threshold_mib"]), _f(ls.get("a_us_per_mib"), ".3f"), _f(ls.get("b_us"), ".1f"),
                     _f(ls.get("break_even_mib")), _f(ls.get("r2"), ".2f")))
    out += _table(("form", "won / points", "lost max MiB", "won min MiB", "threshold MiB",
                   "a µs/MiB", "b µs", "break-even b/a MiB", "r²"), rows)
    out += ["", "Least squares: gain_us = t_plain − t_pass ≈ a · saved_mib_total − b. Rules at their best "
            "threshold (take the pass when the saving ≥ it), misclassified points:", ""]
    rows = []
    for scope, s in fit.get("separation", {}).items():
        rows.append((scope, f"{s['total']['misclassified']} (≥ {_f(s['total']['threshold_mib'])} MiB)",
                     f"{s['per_class']['misclassified']} (≥ {_f(s['per_class']['threshold_mib'])} MiB)"))
    out += _table(("points", "total rule", "per-class rule"), rows)
    out += ["", f"Better separating rule: {fit.get('better_rule', '—')}."]
    return out


def _ratio_tables(records: list[dict]) -> list[str]:
    out: list[str] = []
    cs = sorted({r["C"] for r in records})
    for form in sorted({r["form"] for r in records}):
        rs = {(r["Lp"], r["n"], r["C"]): r for r in records if r["form"] == form}
        kinds = sorted({r["kind"] for r in rs.values()})
        out += ["", f"t_pass / t_plain, form `{form}` (pass kind: {', '.join(kinds)}):", ""]
        rows = []
        for lp, n in sorted({(k[0], k[1]) for k in rs}):
            cells = []
            for c in cs:
                r = rs.get((lp, n, c))
                ok = r is not None and r.get("t_pass_us") and r.get("t_plain_us")
                cells.append(f"{r['t_pass_us'] / r['t_plain_us']:.2f}" if ok else "—")
            rows.append((lp, n, *cells))
        out += _table(("Lp", "n", *(f"C={c}" for c in cs)), rows)
    return out


def render_doc(doc: dict) -> str:
    cfg, env, st = doc.get("config", {}), doc.get("env", {}), doc.get("status", {})
    recs = doc.get("records", [])
    out = ["## Prefix-pass rule: total saved bytes per launch", "",
           f"One layer, Hq = {cfg.get('hq')}, Hkv = {cfg.get('hkv')}, d = {cfg.get('d')}, {cfg.get('dtype')} on "
           f"{env.get('gpu', '?')} (git {str(env.get('git_sha') or '?')[:7]}); C classes of n requests sharing an "
           f"Lp-token prefix, each request with its own {cfg.get('s_lo')}–{cfg.get('s_hi')}-token suffix; plain "
           "decode against suffix decode + one prefix pass over all C classes + merge (one CUDA graph each, "
           f"L2 flushed per replay); saved MiB = C · (n − 1) · Lp · {cfg.get('kv_token_bytes')} B / 2²⁰; "
           f"m_sat = {cfg.get('m_sat')}.", ""]
    if st and not st.get("complete", True):
        out += [f"**Incomplete:** {st.get('measured')} of {st.get('points')} points measured.", ""]
    failed = [r for r in recs if not r.get("check", {}).get("ok", True)]
    if failed:
        out += [f"**{len(failed)} point(s) failed the pass-vs-plain check and were not timed.**", ""]
    if doc.get("fit"):
        out += _fit_lines(doc["fit"])
    out += _ratio_tables(recs)
    return "\n".join(out) + "\n"


def render(path: str | Path) -> str:
    return render_doc(json.loads(Path(path).read_text()))
