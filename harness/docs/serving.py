"""The serving pages of docs/generated/: A/B serving cells against the Table 9 reps of their
point, the OpenAI completions API against /generate in one call, and the CUDA graphs the serving
cells captured.
"""

from __future__ import annotations

import statistics

from harness.docs.common import (
    H200,
    HEADER,
    MIXED_MARK,
    Sources,
    cite,
    fmt,
    git_short,
    md_table,
    mean_of,
    point_cells,
    tok_s,
)

AB_TAGS = {  # tags whose setting the committed defaults leave off, so table9 is the "off" side
    "egraphs": "extend CUDA graphs on (`extend_graph_tokens=[32,64,128,256,512]`)",
    "long-keys": "extend split rule `long-keys` instead of `fill`",
    "incremental": "incremental streaming chunks (`server.incremental_streaming_output=true`)",
}


def render_serving_ab(src: Sources) -> str:
    """A/B serving cells (sweep adhoc, one tagged rep) against the table9 reps of the same point."""
    adhoc, grid = src.cells("adhoc"), src.cells("table9")
    out = [HEADER, "", "Serving A/Bs: one tagged rep (`results/h200/adhoc/`) against the mean of the "
           "complete Table 9 reps of the same point (the setting's default). Start-up capture is "
           "`engine.startup.capture_s` where the cell records it.", ""]
    rows = []
    for tag, what in AB_TAGS.items():
        for _, d in adhoc:
            c = d["config"]
            if c.get("tag") != tag:
                continue
            base = point_cells(grid, lp=c["lp"], batch=c["batch"], workload=c["workload"], tp=c["tp"])[c["system"]]
            if not base:
                continue
            b_tok = mean_of(tok_s(x) for x in base)
            cap = (d["engine"].get("startup") or {}).get("capture_s")
            b_cap = mean_of((x["engine"].get("startup") or {}).get("capture_s") for x in base)
            rows.append((what, c["lp"], c["batch"], c["system"], f"{b_tok:.0f} ({len(base)})", f"{tok_s(d):.0f}",
                         f"{(tok_s(d) / b_tok - 1) * 100:+.1f}%",
                         f"{mean_of(x['engine']['extend_time_s'] for x in base):.1f} → "
                         f"{d['engine']['extend_time_s']:.1f}",
                         f"{fmt(b_cap, '.1f')} → {fmt(cap, '.1f')}",
                         f"{'/'.join(sorted({git_short(x) for x in base}))} / {git_short(d)}"))
    out += md_table(("setting", "Lp", "B", "system", "default tok/s (reps)", "setting tok/s", "change",
                   "extend_time_s", "capture_s", "git default / setting"), rows)
    pair = {}
    for path, d in adhoc:
        if d["config"].get("tag") in ("coldcache-before", "coldcache-after"):
            pair[d["config"]["tag"]] = (path, d)
    if pair:
        out += ["", "Table 20 k=16 granikv on an empty Triton cache, the prefix pass with int specialization "
                "(before) and without (after), back to back on one machine:", ""]
        rows = []
        for tag in ("coldcache-before", "coldcache-after"):
            _, d = pair[tag]
            top = d["engine"]["step_log"]["decode"].get("by_batch", {}).get("256")
            top_s = top[1] if isinstance(top, list) else (top or {}).get("total_s")
            rows.append((tag, git_short(d), f"{tok_s(d):.1f}", fmt(top_s, ".2f"),
                         fmt((d["engine"].get("startup") or {}).get("capture_s"), ".1f")))
        out += md_table(("cell", "git", "tok/s", "B=256 decode steps total s", "capture_s"), rows)
    out += ["", cite(f"{H200}/adhoc/*-tag{{{','.join(AB_TAGS)},coldcache-*}}.json", f"{H200}/table9/")]
    return "\n".join(out) + "\n"


API_CPU = "results/cpu/microbench/server-api.json"


_AB_CELL = f"{H200}/adhoc/granikv-llama-3.1-8b-tp1-sharegpt-lp16384-b256-k1-r{{rep}}-tagv1-{{api}}.json"


API_AB_REPS = (0, 1)


# (generate, completions) per rep, run alternately in one call: generate r0, completions r0, ...
API_AB = tuple((_AB_CELL.format(rep=r, api="generate"), _AB_CELL.format(rep=r, api="completions"))
               for r in API_AB_REPS)


API_AB_BAR = 0.98  # the completions API bar: within 2% of /generate's output throughput


API_AB_CMD = ("python -m harness.run.cell system=granikv model=llama-3.1-8b tp=1 workload=sharegpt lp=16384 "
              "batch=256 sweep=adhoc hardware=h200 client.api={api} tag=v1-{api} rep={rep}")


def render_api_ab(src: Sources) -> str:
    """The harness client on the OpenAI completions API against /generate, one point, one call.

    The two APIs are measured alternately (generate, completions, generate, completions), so a
    drift of the machine over the call lands on both sides. The API each cell drove is read from
    its recorded client config (`config.client.api`), not from its tag: the tag names what the
    call meant to measure, the config what the client did."""
    from harness.microbench.server import notes_table

    cpu = []
    if (src.root / API_CPU).exists():
        cpu = ["", "The server's own cost per API, on the CPU: a simulated engine (fixed 12 ms steps, one "
               "token per running request) behind the real server, the harness client driving each API in "
               "turn (`python -m harness.microbench.server --api generate completions ...`):", "",
               notes_table(str(src.root / API_CPU)), "", cite(API_CPU)]
    paths = [rel for pair in API_AB for rel in pair]
    if not all((src.root / rel).exists() for rel in paths):
        return "\n".join([HEADER, "", "The cells that drive `/generate` and `/v1/completions` at the headline point "
                          "(ShareGPT Lp=16K B=256, granikv) are not all measured; the completions API bar (≥ "
                          f"{API_AB_BAR} × `/generate`'s output throughput, measured in one call) is not judged. "
                          "Measured by running, alternately in one call, for rep in "
                          f"{', '.join(map(str, API_AB_REPS))} and api in generate, completions: `{API_AB_CMD}`.",
                          *cpu]) + "\n"

    def side(d: dict) -> tuple[float, float, float, float, int]:
        e, w = d["engine"], d.get("engine_after_warmup") or {}
        return (tok_s(d), d["metrics"]["median_ttft_ms"], d["metrics"]["median_tpot_ms"],
                e["server_cpu_s"] - w.get("server_cpu_s", 0.0),
                e["server_chunks_sent"] - w.get("server_chunks_sent", 0))

    rows, apis, tok = [], {"generate": [], "completions": []}, {"generate": [], "completions": []}
    calls = set()
    for rep, pair in zip(API_AB_REPS, API_AB, strict=True):
        for want, rel in zip(("generate", "completions"), pair, strict=True):
            d = src.json(rel)
            calls.add(d.get("env", {}).get("call_id") or rel)  # a file without a call id is a call of its own
            api = str(d["config"]["client"].get("api", "generate"))
            s = side(d)
            apis[want].append(api)
            tok[want].append(s[0])
            rows.append((f"v1-{want} r{rep}", api, git_short(d), f"{s[0]:.0f}", f"{s[1]:.0f}", f"{s[2]:.2f}",
                         f"{s[3]:.2f}", s[4]))
    out = [HEADER, "", "GraniKV, ShareGPT Lp=16K B=256, the harness client streaming token ids (with usage on "
           "`/v1/completions`), the two APIs alternated in one call. Server CPU s and chunks: the HTTP process "
           "over the measured run (`engine.server_cpu_s`, `engine.server_chunks_sent`, the warm-up snapshot "
           "subtracted).", ""]
    out += md_table(("cell", "client.api (recorded)", "git", "output tok/s", "TTFT p50 ms", "TPOT p50 ms",
                   "server CPU s", "server chunks"), rows)
    ratio = statistics.fmean(tok["completions"]) / statistics.fmean(tok["generate"])
    if len(calls) > 1:
        verdict = (f"not judged ({MIXED_MARK}): the four cells come from {len(calls)} calls (`env.call_id`), "
                   "so run-to-run spread enters the ratio")
    elif set(apis["completions"]) == {"completions"} and set(apis["generate"]) == {"generate"}:
        verdict = "met" if ratio >= API_AB_BAR else "not met"
    else:
        verdict = ("not judged: a cell tagged for one API recorded the other (`config.client.api`), so the "
                   "ratio does not compare the two APIs")
    out += ["", f"Mean `/v1/completions` / mean `/generate` output tok/s: {ratio:.3f}; the completions API bar ≥ "
            f"{API_AB_BAR}: {verdict}.", ""]
    out.append(cite(*paths))
    out += cpu
    return "\n".join(out) + "\n"


def render_graphs(src: Sources) -> str:
    """Whether any serving cell captured a CUDA graph (or compiled) inside its measured run."""
    rows = []
    sweeps = [p.name for p in (src.root / H200).iterdir() if p.is_dir() and p.name.removeprefix("table").isdigit()]
    for sweep in sorted(sweeps, key=lambda n: int(n.removeprefix("table"))):
        cells = [d for _, d in src.cells(sweep) if (d["engine"].get("graphs") or {}).get("captured_at_start")]
        if not cells:
            continue
        g = [d["engine"]["graphs"] for d in cells]
        extra = [x["captures"] - x["captured_at_start"] for x in g]
        cap = sorted(x["capture_at_start_s"] for x in g)
        rows.append((sweep, len(cells), sum(e == 0 for e in extra), max(extra),
                     f"{cap[0]:.1f}–{cap[-1]:.1f}"))
    out = [HEADER, "", "Serving cells that capture graphs at start (`engine.graphs`): how many captured "
           "nothing more inside the run, the most any one captured inside it, and the start-up capture "
           "time (which includes compiling the Triton variants the graphs use):", ""]
    out += md_table(("sweep", "cells", "no capture in the run", "most captures in the run", "capture at start s"),
                  rows)
    out += ["", cite(f"{H200}/table*/*.json")]
    return "\n".join(out) + "\n"
