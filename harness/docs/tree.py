"""The tree page of docs/generated/: one layer's decode attention over a tree of shared runs per
launch form and tile config (harness.microbench.tree_passes), and whole decode steps of the tree
with the levels in one flattened launch or one launch per level (`engine_steps --trees --flat`).

Why a page of its own: it is what decides `EngineConfig.flat_prefix` and the flattened launch's
tiles (granikv/kernels/prefix_flat.py, FLAT_CONFIG). The files may come from any GPU the device
lent (results/<gpu>/...); every block names its GPU and source, and ratios compare only records
of one file (one process, one card).
"""

from __future__ import annotations

from harness.docs.common import HEADER, Sources, cite, git_short, md_table

PASSES = "microbench/tree-passes.json"
STEPS = "engine/tree-steps.json"


def _found(src: Sources, rel: str) -> list[str]:
    return sorted(str(p.relative_to(src.root)) for p in (src.root / "results").glob(f"*/{rel}"))


def _cfg(c: dict | None) -> str:
    if not c:
        return "—"
    return f"{c['block_m']}×{c['block_n']}, {c['num_warps']} warps, {c['num_stages']} stages, ×{c['target_programs']}"


def passes_block(src: Sources, rel: str) -> list[str]:
    doc = src.json(rel)
    cfg, env = doc["config"], doc["env"]
    levels = " ".join(f"{f}×{n}" for f, n in cfg["levels"])
    out = [f"### One layer, tree {levels}, B = {cfg['batch']} ({env.get('gpu')})", "",
           f"Hq = {cfg['hq']}, Hkv = {cfg['hkv']}, d = {cfg['d']}, {cfg['dtype']}; each request's own "
           f"suffix U[{cfg['suffix'][0]}, {cfg['suffix'][1]}] in random pages. Floor (on the ceilings the run was "
           f"given, the H200's by default) = max(shared-run bytes / "
           f"{cfg['hbm_tbps']} TB/s, shared FLOPs / {cfg['peak_tflops']} TFLOP/s) + own bytes / {cfg['hbm_tbps']} "
           f"TB/s = {doc['floor_us']:.1f} µs; the suffix decode alone takes {doc['suffix_us']:.1f} µs.", ""]
    steps = [r for r in doc["records"] if r["form"] != "level"]
    out += md_table(("form", "tiles", "µs", "× floor", "shared part µs", "shared TFLOP/s"),
                    [(r["form"], _cfg(r["cfg"]), f"{r['us']:.1f}", f"{r['over_floor']:.2f}",
                      "—" if r["prefix_us"] is None else f"{r['prefix_us']:.1f}",
                      "—" if r["prefix_tflops"] is None else f"{r['prefix_tflops']:.0f}") for r in steps])
    best: dict[tuple, dict] = {}
    for r in doc["records"]:
        if r["form"] == "level":
            key = (r["level"], r["load"])
            if key not in best or r["us"] < best[key]["us"]:
                best[key] = r
    if best:
        out += ["", "Each level alone through the cascade kernel, its best tiles per load path (slot-table rows, "
                "slab, slab through TMA):", ""]
        out += md_table(("level", "load", "best tiles", "µs", "TFLOP/s", "TB/s"),
                        [(lv, load, _cfg(r["cfg"]), f"{r['us']:.1f}", f"{r['tflops']:.0f}", f"{r['hbm_tbps']:.2f}")
                         for (lv, load), r in sorted(best.items())])
    out += ["", f"git {git_short(doc)}, torch {env.get('torch')}, triton {env.get('triton')}. " + cite(rel), ""]
    return out


def steps_block(src: Sources, rel: str) -> list[str]:
    doc = src.json(rel)
    env = doc["env"]
    recs = [r for r in doc["records"] if "tree" in r]
    out = [f"### Decode steps of the tree ({env.get('gpu')})", "",
           "`engine_steps --trees`: the median engine step (plan, graph replay, sample), GPU time per step in "
           "the prefix kernel and in the level merge, against the floor of the sharing each variant can have "
           "(floor constants of the H200).", ""]

    def kernel_ms(r: dict, *names: str) -> str:
        ms = sum(k["ms_per_step"] for k in r.get("kernels", []) if any(n in k["name"] for n in names))
        return f"{ms:.2f}"

    out += md_table(("system", "share_depth", "levels in", "flat tiles", "step ms", "prefix kernel ms",
                     "merges ms", "floor ms", "step / floor"),
                    [(r["system"], r["share_depth"] if r["system"] == "granikv" else "—",
                      ("one launch" if r.get("flat_prefix") else "a launch each") if r["system"] == "granikv"
                      else "—",
                      _cfg(r.get("flat_config")) if r["system"] == "granikv" and r.get("flat_prefix") else "—",
                      f"{r['step_ms']:.2f}", kernel_ms(r, "_prefix_kernel"),
                      kernel_ms(r, "_merge", "_combine"),
                      f"{r['floor_ms']:.2f}", f"{r['step_over_floor']:.2f}") for r in recs])
    out += ["", f"git {git_short(doc)}. " + cite(rel), ""]
    return out


def render_tree(src: Sources) -> str:
    out = [HEADER, "", "# A tree's decode attention: one launch per level or one flattened launch", ""]
    files = _found(src, PASSES) + _found(src, STEPS)
    if not files:
        return "\n".join(out + ["No tree-pass or tree-step result files yet.", ""])
    for rel in _found(src, PASSES):
        out += passes_block(src, rel)
    for rel in _found(src, STEPS):
        out += steps_block(src, rel)
    return "\n".join(out)


