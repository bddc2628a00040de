"""docs/generated/prefix-rule.md: the dispatcher's saved-bytes rule where it was measured.

Three views of one rule (granikv/attention/dispatch.py): the served Table 9 points at small B (one
class per step), the kernel sweep of many classes per launch (harness.microbench.prefix_rule, which
the H200 threshold is fitted from), and the multiprefix k=64 cells where most classes are COLD.
Rendered by `python -m harness.docs.render`.
"""

from __future__ import annotations

import yaml

from harness.docs.common import (
    H200,
    HARDWARE,
    HEADER,
    KIB_PER_TOKEN_LAYER,
    MIXED_MARK,
    MIXED_NOTE,
    Sources,
    cite,
    decode_ms,
    git_short,
    md_table,
    mean_of,
    one_call,
    point_reps,
    tok_s,
)


def render_prefix_rule(src: Sources) -> str:
    """The dispatcher's saved-bytes rule at the small-batch Table 9 points."""
    grid = src.cells("table9")
    hw = yaml.safe_load((src.root / HARDWARE).read_text())
    thr = hw["prefix_pass_min_saved_mib"]
    rows, any_mixed = [], False
    for lp, b in ((512, 8), (2048, 8), (512, 32), (8192, 8), (2048, 32), (16384, 8), (8192, 32), (16384, 32),
                  (512, 128)):
        pt, mixed = point_reps(grid, lp=lp, batch=b, workload="sharegpt", tp=1, model="llama-3.1-8b")
        if not all(pt.values()):
            continue
        saved = (b - 1) * lp * KIB_PER_TOKEN_LAYER / 1024
        g = pt["granikv"]
        pass_steps = sum(x["engine"]["cascade_steps"] + x["engine"]["dense_steps"] for x in g)
        plain = sum(x["engine"]["paged_steps"] for x in g)
        rows.append((lp, b, f"{saved:.0f}", "pass" if saved >= thr else "plain",
                     f"{pass_steps} / {plain}",
                     f"{mean_of(decode_ms(x) for x in pt['paged']):.2f}", f"{mean_of(decode_ms(x) for x in g):.2f}",
                     f"{mean_of(tok_s(x) for x in g) / mean_of(tok_s(x) for x in pt['paged']):.3f}"
                     + (MIXED_MARK if mixed else ""), len(g)))
        any_mixed |= mixed
    out = [HEADER, "", "The classes of one prefix pass launch take it when Σ (n − 1) · Lp · 4 KiB ≥ "
           f"`prefix_pass_min_saved_mib` = {thr} MiB per layer (`{HARDWARE}`); Table 9 ShareGPT points at "
           "small B, one whole-batch class n = B. Decode ms per step over the measured run "
           "(`engine.decode_time_s` / `decode_steps`, warm-up left out), means over the reps the tables read "
           "(complete, and of one call where there are any):", ""]
    out += md_table(("Lp", "B", "avoided MiB/layer at n = B", "rule", "granikv pass / plain steps (all reps)",
                   "paged decode ms/step", "granikv decode ms/step", "granikv / paged tok/s", "reps"), rows)
    if any_mixed:
        out += ["", MIXED_NOTE]
    out += ["", cite(f"{H200}/table9/*-b{{8,32,128}}-*.json", HARDWARE)]
    sweep = f"{H200}/microbench/prefix-rule.json"
    if (src.root / sweep).exists():
        from harness.microbench.prefix_rule_report import render as render_sweep

        out += ["", render_sweep(str(src.root / sweep)).rstrip(), "", cite(sweep)]
    out += render_cold_range(src)
    return "\n".join(out) + "\n"


COLD_RANGE = {tag: f"{H200}/adhoc/{sys}-llama-3.1-8b-tp1-multiprefix-lp8192-b256-k64-r0-tag{tag}.json"
              for sys, tag in (("paged", "hint"), ("granikv", "nohint-rows"), ("granikv", "nohint"))}


def render_cold_range(src: Sources) -> list[str]:
    """multiprefix k=64 with COLD classes read through a row (`cold_range_as_slab=false`) and as
    slabs when their run is one slot range (the default), beside paged (measured in one call —
    one `env.call_id` — or said not to be, the ratios then marked)."""
    if not all((src.root / rel).exists() for rel in COLD_RANGE.values()):
        return []
    docs = {tag: src.json(rel) for tag, rel in COLD_RANGE.items()}
    paged = tok_s(docs["hint"])
    mark = "" if one_call(docs.values()) else MIXED_MARK
    rows = []
    for tag, label in (("hint", "paged"), ("nohint-rows", "granikv, COLD classes through a row"),
                       ("nohint", "granikv, COLD ranges as slabs (default)")):
        d = docs[tag]
        e = d["engine"]
        rows.append((label, git_short(d), f"{tok_s(d):.0f}",
                     f"{tok_s(d) / paged:.3f}" + (mark if tag != "hint" else ""),
                     f"{decode_ms(d):.1f}",
                     e.get("contiguous_cold", "—"), (e.get("class_decisions") or {}).get("rows", "—")))
    calls = ("one call" if not mark else
             f"cells of different calls, or without a call id: the ratios, marked {MIXED_MARK}, are not "
             "back-to-back ones")
    out = ["", "## COLD classes in one slot range", "", f"Multiprefix k = 64, Lp = 8K, B = 256, no hint ({calls}). "
           "The HOT pool holds 20 of the 64 prefixes; the rest are COLD classes.", ""]
    out += md_table(("cell", "git", "output tok/s", "× paged", "decode ms/step", "COLD classes as slabs",
                   "rows class-steps"), rows)
    return out + ["", cite(*COLD_RANGE.values())]
