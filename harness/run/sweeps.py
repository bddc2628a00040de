"""Sweeps -> cells: the grid of every paper table, expanded for one pipeline profile.

A sweep is `conf/sweep/<name>.yaml`; its cells land in `results/<hardware>/<name>/`, the
directory `harness.report.tables` reads for that table. Snakemake (the `Snakefile`) owns the sweeps:
it asks `plan(...)` for the cells of a profile, groups them into points (`harness.run.point`) and
runs `python -m harness.run.point run <sweep> <point-id>` — each cell's `python -m harness.run.cell
<overrides>`, back to back in one call — once per point with a result file missing. No Hydra
multirun.

Sweep file::

    tables: [6, 15, 16]          # paper tables that read these cells
    description: ...
    fixed: {model: llama-3.1-8b, tp: 1, workload: burst, num_prompts: "${batch}"}
    grids:                       # per grid level, a list of cartesian blocks (their union)
      paper:   [{system: [paged, cascade, granikv], lp: [512, 8192], batch: [8, 256]}]
      reduced: [...]             # the `h200` profile
      smoke:   [...]             # the `cpu-smoke` profile (still in paper units, see stand-in)
    reads:                       # cells of other sweeps this sweep's tables also read
      - {sweep: table9, where: {batch: 256, lp: [4096, 8192, 16384]}}
    microbench: kernels          # (microbench sweeps) results/<hw>/microbench/<name>.json

Values are always the paper's (model names, Lp, B). `"${batch}"`-style strings refer to other
keys of the same cell. A grid level a sweep lacks falls back: smoke -> reduced -> paper.

Pipeline profile (`profiles/<name>/pipeline.yaml`): which hardware, which grid level, how many
reps, which sweeps, and optionally a *stand-in*: a scaled-down mapping (the `cpu-smoke` tiny
model on CPU) applied to each paper-unit cell. A stand-in cell runs the scaled values and
records the paper values it stands in for under `config.stands_for`; `paper_view()` then
presents such results in paper units so `harness.report.tables` can place them in the paper's rows.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = ROOT / "conf"
SWEEP_DIR = CONF_DIR / "sweep"
GRID_LEVELS = ("paper", "reduced", "smoke")
_FALLBACK = {"smoke": ("smoke", "reduced", "paper"), "reduced": ("reduced", "paper"), "paper": ("paper",)}

# The cell id: identity keys always, then these when they differ from conf/config.yaml.
ID_EXTRAS = ("hot_fraction", "cold_page_size", "page_size", "m_sat", "share_depth", "rate", "tag")
CELL_DEFAULTS: Mapping[str, Any] = {"hot_fraction": 0.2, "cold_page_size": 1, "page_size": 16, "m_sat": None,
                                    "share_depth": None, "rate": "inf", "k": 1, "rep": 0, "tp": 1, "tag": None}
# Keys a sweep may set on a cell (top-level keys of conf/config.yaml, group names included).
CELL_KEYS = ("system", "model", "tp", "workload", "lp", "batch", "k", "rate", "num_prompts", "output_len",
             "hot_fraction", "page_size", "cold_page_size", "m_sat", "rep", "tag", "warmup", "flush_cache",
             "profile", "hardware", "stands_for", "workload.lps", "workload.max_turn_tokens",
             "workload.suffix_len", "server.max_context", "share_depth", "workload.levels", "workload.jitter",
             "workload.rounds", "workload.la")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        return repr(v).rstrip("0").rstrip(".") if "." in repr(v) else repr(v)
    return str(v)


def cell_id(values: Mapping[str, Any]) -> str:
    """`{system}-{model}-tp{tp}-{workload}-lp{lp}-b{batch}-k{k}-r{rep}[-{extra}{value}...]`.

    `values` are the cell's top-level values (names, not config groups). Extras
    (ID_EXTRAS) appear only when they differ from the conf/config.yaml defaults, so the id of
    an ordinary cell is short and two cells of one sweep never share an id.
    """
    v = {**CELL_DEFAULTS, **{k: x for k, x in values.items() if x is not None or k == "m_sat"}}
    parts = [str(v["system"]), str(v["model"]), f"tp{v['tp']}", str(v["workload"]), f"lp{v['lp']}",
             f"b{v['batch']}", f"k{v['k']}", f"r{v['rep']}"]
    for key in ID_EXTRAS:
        val = v.get(key)
        if _fmt(val) != _fmt(CELL_DEFAULTS[key]):
            parts.append(f"{key}{_fmt(val)}")
    text = "-".join(parts)
    if not re.fullmatch(r"[A-Za-z0-9._\-]+", text):
        raise ValueError(f"cell id {text!r} has characters that do not belong in a file name")
    return text


# --------------------------------------------------------------------------- sweep files


@dataclass(frozen=True)
class Read:
    """Cells of another sweep that a table also reads (tables.py falls back to them)."""

    sweep: str
    where: Mapping[str, Any] = field(default_factory=dict)

    def matches(self, paper_values: Mapping[str, Any]) -> bool:
        for key, want in self.where.items():
            have = paper_values.get(key)
            wants = want if isinstance(want, list | tuple) else [want]
            if not any(_fmt(have) == _fmt(w) for w in wants):
                return False
        return True


@dataclass(frozen=True)
class Sweep:
    name: str
    tables: tuple[int, ...]
    description: str = ""
    fixed: Mapping[str, Any] = field(default_factory=dict)
    grids: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)
    reads: tuple[Read, ...] = ()
    microbench: str | None = None

    def blocks(self, level: str) -> tuple[Mapping[str, Any], ...]:
        for lvl in _FALLBACK[level]:
            if lvl in self.grids:
                return self.grids[lvl]
        return ()

    def points(self, level: str) -> list[dict[str, Any]]:
        """Paper-unit cells (fixed + grid point, references resolved) at a grid level."""
        out: list[dict[str, Any]] = []
        for block in self.blocks(level):
            keys = list(block)
            axes = [v if isinstance(v, list | tuple) else [v] for v in block.values()]
            for combo in itertools.product(*axes):
                point = {**self.fixed, **dict(zip(keys, combo, strict=True))}
                out.append(_resolve_refs(point))
        return out


_REF = re.compile(r"^\$\{(\w+)\}$")


def _resolve_refs(point: dict[str, Any]) -> dict[str, Any]:
    out = dict(point)
    for key, value in point.items():
        if isinstance(value, str):
            m = _REF.match(value)
            if m:
                if m.group(1) not in point:
                    raise ValueError(f"{key}={value}: no key {m.group(1)!r} in the cell {point}")
                out[key] = point[m.group(1)]
    return out


def load_sweep(name: str, sweep_dir: Path = SWEEP_DIR) -> Sweep:
    path = Path(sweep_dir) / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in Path(sweep_dir).glob("*.yaml"))
        raise FileNotFoundError(f"no sweep {name!r} ({path}); known: {known}")
    doc = yaml.safe_load(path.read_text()) or {}
    unknown = set(doc) - {"name", "tables", "description", "fixed", "grids", "reads", "microbench"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)}")
    if doc.get("name") != name:
        raise ValueError(f"{path}: name must be {name!r} (the file name), got {doc.get('name')!r}")
    grids = {}
    for level, blocks in (doc.get("grids") or {}).items():
        if level not in GRID_LEVELS:
            raise ValueError(f"{path}: grid level {level!r} is not one of {GRID_LEVELS}")
        blocks = [blocks] if isinstance(blocks, Mapping) else list(blocks or [])
        for b in blocks:
            bad = [k for k in b if k not in CELL_KEYS]
            if bad:
                raise ValueError(f"{path}: grid keys {bad} are not cell keys {CELL_KEYS}")
        grids[level] = tuple(blocks)
    bad = [k for k in (doc.get("fixed") or {}) if k not in CELL_KEYS]
    if bad:
        raise ValueError(f"{path}: fixed keys {bad} are not cell keys")
    return Sweep(name=name, tables=tuple(doc.get("tables") or ()), description=doc.get("description", ""),
                 fixed=dict(doc.get("fixed") or {}), grids=grids,
                 reads=tuple(Read(sweep=r["sweep"], where=dict(r.get("where") or {})) for r in doc.get("reads") or ()),
                 microbench=doc.get("microbench"))


# Sweeps no table plans: hand-run cells, and the CI gate's (the Snakefile's `gate` target runs them)
UNPLANNED_SWEEPS = ("adhoc", "gate")


def all_sweeps(sweep_dir: Path = SWEEP_DIR) -> dict[str, Sweep]:
    return {p.stem: load_sweep(p.stem, sweep_dir) for p in sorted(Path(sweep_dir).glob("*.yaml"))
            if p.stem not in UNPLANNED_SWEEPS}


# --------------------------------------------------------------------------- profiles and stand-ins


@dataclass(frozen=True)
class StandIn:
    """Scale a paper-unit cell down to something a small host can run (cpu-smoke).

    lp and the hetero ladder are divided by `lp_div`; batch by `batch_div` (at least 1);
    `num_prompts` becomes `batch * prompts_per_slot` capped at `max_prompts`; the model is
    mapped by architecture family; tp becomes `tp`; everything in `set` is set as is.
    """

    models: Mapping[str, str]
    tp: int = 1
    lp_div: int = 64
    batch_div: int = 32
    prompts_per_slot: int = 2
    max_prompts: int = 16
    set: Mapping[str, Any] = field(default_factory=dict)

    def apply(self, paper: Mapping[str, Any]) -> dict[str, Any]:
        cell = dict(paper)
        model = str(paper["model"])
        if model not in self.models:
            raise ValueError(f"stand-in has no model for {model!r} (models: {dict(self.models)})")
        cell["model"] = self.models[model]
        cell["tp"] = self.tp
        cell["lp"] = max(1, int(paper["lp"]) // self.lp_div)
        cell["batch"] = max(1, int(paper["batch"]) // self.batch_div)
        cell["num_prompts"] = min(self.max_prompts, cell["batch"] * self.prompts_per_slot)
        if paper.get("workload") == "hetero":
            from harness.run.workloads.config import HETERO_LADDERS

            cell["workload.lps"] = [max(1, x // self.lp_div) for x in HETERO_LADDERS[int(paper.get("k", 4))]]
        cell.update(self.set)
        cell["stands_for"] = {k: paper[k] for k in ("model", "tp", "lp", "batch", "num_prompts") if k in paper}
        return cell


@dataclass(frozen=True)
class PipelineProfile:
    """What a Snakemake profile asks of the pipeline (profiles/<name>/pipeline.yaml)."""

    name: str
    hardware: str
    grid: str = "paper"
    reps: int = 1
    gpus: int = 1
    sweeps: tuple[str, ...] = ()          # empty: every sweep
    microbench: Mapping[str, str] = field(default_factory=dict)  # name -> command template
    cells_after: tuple[str, ...] = ()     # microbench files every cell waits for (e.g. the m_sat fit)
    stand_in: StandIn | None = None
    cell_overrides: tuple[str, ...] = ()  # extra Hydra overrides for every cell
    results_dir: str = "results"
    tables_dir: str = "tables"
    plots_dir: str = "plots"

    @property
    def results(self) -> str:
        return f"{self.results_dir}/{self.hardware}"

    @property
    def view(self) -> str:
        """The results directory tables and plots read (the paper-unit view for stand-ins)."""
        return f"{self.results_dir}/{self.hardware}-standin" if self.stand_in else self.results

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PipelineProfile:
        d = dict(d)
        si = d.pop("stand_in", None)
        stand_in = StandIn(**si) if si else None
        if d.get("grid", "paper") not in GRID_LEVELS:
            raise ValueError(f"grid must be one of {GRID_LEVELS}")
        return cls(stand_in=stand_in, sweeps=tuple(d.pop("sweeps", None) or ()),
                   cell_overrides=tuple(d.pop("cell_overrides", None) or ()),
                   cells_after=tuple(d.pop("cells_after", None) or ()),
                   microbench=dict(d.pop("microbench", None) or {}), **d)


def load_profile(path: Path | str) -> PipelineProfile:
    """A pipeline profile from its file, or from a profile's name (`h200` reads
    profiles/h200/pipeline.yaml), the way Snakemake's `--profile` takes either."""
    p = Path(path)
    if not p.exists() and not p.suffix:
        named = ROOT / "profiles" / str(path) / "pipeline.yaml"
        if named.exists():
            p = named
        else:
            raise FileNotFoundError(f"no pipeline profile {path!r}: neither a file nor profiles/{path}/pipeline.yaml")
    return PipelineProfile.from_dict(yaml.safe_load(p.read_text()))


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Cell:
    """One result file to produce and the command line that produces it."""

    sweep: str
    cell_id: str
    values: Mapping[str, Any]       # top-level values that run (after any stand-in)
    paper: Mapping[str, Any]        # the paper-unit values
    gpus: int

    def path(self, profile: PipelineProfile) -> str:
        return f"{profile.results}/{self.sweep}/{self.cell_id}.json"

    def overrides(self, profile: PipelineProfile) -> list[str]:
        out = []
        for key, value in self.values.items():
            out.append(f"{key}={_override_value(value)}")
        out += [f"sweep={self.sweep}", f"hardware={profile.hardware}", f"results_dir={profile.results_dir}"]
        out += list(profile.cell_overrides)
        return out

    def command(self, profile: PipelineProfile, python: str = "python") -> str:
        return shlex.join([python, "-m", "harness.run.cell", *self.overrides(profile)])


def _override_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_override_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return str(value)


def _identity(values: Mapping[str, Any]) -> dict[str, Any]:
    v = {k: x for k, x in values.items() if "." not in k}
    v.setdefault("workload", "sharegpt")
    return v


def sweep_cells(sweep: Sweep, profile: PipelineProfile) -> list[Cell]:
    """The cells of one sweep under a profile (reps expanded, stand-in applied, tp filtered)."""
    cells: dict[str, Cell] = {}
    for paper in sweep.points(profile.grid):
        for rep in range(profile.reps):
            p = {**paper, "rep": rep}
            values = profile.stand_in.apply(p) if profile.stand_in else p
            tp = int(values.get("tp", 1))
            if profile.gpus and tp > profile.gpus:
                continue  # this host cannot run it; `explain` lists what was left out
            cid = cell_id(_identity(values))
            if cid in cells and cells[cid].paper != p:
                raise ValueError(f"sweep {sweep.name}: two cells map to {cid}: {cells[cid].paper} and {p} "
                                 "(a stand-in scaled them onto the same run; drop one from the grid)")
            cells[cid] = Cell(sweep=sweep.name, cell_id=cid, values=values, paper=p, gpus=max(tp, 1))
    return list(cells.values())


def left_out(sweep: Sweep, profile: PipelineProfile) -> int:
    """Cells of the sweep's grid this profile cannot run (tp larger than its GPU count)."""
    if not profile.gpus:
        return 0
    n = 0
    for paper in sweep.points(profile.grid):
        values = profile.stand_in.apply(paper) if profile.stand_in else paper
        n += int(values.get("tp", 1)) > profile.gpus
    return n * profile.reps


@dataclass(frozen=True)
class Plan:
    profile: PipelineProfile
    sweeps: Mapping[str, Sweep]
    cells: Mapping[str, tuple[Cell, ...]]  # own cells per sweep

    def table_sweeps(self) -> dict[int, list[str]]:
        """Table number -> sweeps that hold its cells (own sweep first)."""
        out: dict[int, list[str]] = {}
        for name, sw in self.sweeps.items():
            for t in sw.tables:
                out.setdefault(int(t), []).append(name)
        return out

    def inputs_of(self, sweep_name: str) -> list[Cell]:
        """Cells a sweep's tables need: its own and the matching cells of the sweeps it reads."""
        sw = self.sweeps[sweep_name]
        out = list(self.cells.get(sweep_name, ()))
        for r in sw.reads:
            out += [c for c in self.cells.get(r.sweep, ()) if r.matches(c.paper)]
        return out

    def all_cells(self) -> list[Cell]:
        return [c for cells in self.cells.values() for c in cells]

    def microbench_sweeps(self) -> dict[str, str]:
        """Sweep name -> microbench file name, for the ones this profile can run."""
        return {n: s.microbench for n, s in self.sweeps.items()
                if s.microbench and s.microbench in self.profile.microbench}


def plan(profile: PipelineProfile, sweep_dir: Path = SWEEP_DIR) -> Plan:
    sweeps = all_sweeps(sweep_dir)
    chosen = profile.sweeps or tuple(sweeps)
    missing = [s for s in chosen if s not in sweeps]
    if missing:
        raise ValueError(f"profile {profile.name}: unknown sweeps {missing}")
    chosen_sweeps = {n: sweeps[n] for n in chosen}
    for sw in chosen_sweeps.values():  # a read sweep must be planned too, or its table has no cells
        for r in sw.reads:
            if r.sweep not in chosen_sweeps:
                chosen_sweeps[r.sweep] = sweeps[r.sweep]
    cells = {n: tuple(sweep_cells(sw, profile)) for n, sw in chosen_sweeps.items()}
    return Plan(profile=profile, sweeps=chosen_sweeps, cells=cells)


# --------------------------------------------------------------------------- paper-unit view (adapter)

# THIN ADAPTER (pipeline side): harness.report.tables matches cells on config.model/tp/lp/batch in
# paper units. A stand-in cell (tiny model, scaled Lp/B) records the paper cell it stands in for
# under config.stands_for; this view copies each result with those keys put in paper units and
# the values that really ran kept under config.ran, so the paper's rows fill from scaled runs.
# The copies live in results/<hw>-standin/ (never mixed with real paper-scale results), and
# env.gpu says "stand-in". Drop this once harness.report.tables reads config.stands_for itself.


def paper_view(results: Path | str, out: Path | str) -> int:
    """Write the paper-unit view of `results` (one hardware dir) to `out`; return cells copied."""
    src, dst = Path(results), Path(out)
    if dst.exists():
        shutil.rmtree(dst)
    n = 0
    for path in sorted(src.glob("*/*.json")):
        doc = json.loads(path.read_text())
        target = dst / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.parent.name != "microbench" and isinstance(doc.get("config"), dict):
            cfg = doc["config"]
            stands = cfg.get("stands_for") or {}
            if stands:
                cfg["ran"] = {k: cfg.get(k) for k in stands}
                cfg.update(stands)
                env = doc.setdefault("env", {})
                env["gpu"] = f"stand-in: {env.get('gpu', '?')} ran {cfg['ran'].get('model')}"
            n += 1
        target.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "README.md").write_text(
        f"Paper-unit view of `{src}` written by `python -m harness.run.sweeps view`: each cell is a scaled-down\n"
        "stand-in run (see `config.ran` for what really ran and `config.stands_for`). Not paper-scale results.\n")
    return n


# --------------------------------------------------------------------------- CLI


def explain(p: Plan) -> str:
    lines = [f"profile {p.profile.name}: hardware {p.profile.hardware}, grid {p.profile.grid}, "
             f"reps {p.profile.reps}, gpus {p.profile.gpus}; results in {p.profile.results}"]
    for name, sw in sorted(p.sweeps.items(), key=lambda kv: (len(kv[0]), kv[0])):
        own = p.cells.get(name, ())
        reads = ", ".join(r.sweep for r in sw.reads) or "-"
        line = f"  {name}: tables {list(sw.tables)}, {len(own)} cells, reads {reads}"
        dropped = left_out(sw, p.profile)
        if dropped:
            line += f"; {dropped} cells left out (tp > {p.profile.gpus} GPUs)"
        if sw.microbench:
            ran = "runs" if sw.microbench in p.profile.microbench else "not run by this profile (marked missing)"
            line += f", microbench {sw.microbench}.json ({ran})"
        lines.append(line)
    lines.append(f"  total: {len(p.all_cells())} cells")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.run.sweeps", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("plan", help="list the cells of a profile (and their commands with --commands)")
    s.add_argument("profile", help="profiles/<name>/pipeline.yaml or a profile name")
    s.add_argument("--sweep", action="append", help="only this sweep (repeatable)")
    s.add_argument("--commands", action="store_true")
    v = sub.add_parser("view", help="write the paper-unit view of stand-in results")
    v.add_argument("--results", required=True)
    v.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "view":
        n = paper_view(args.results, args.out)
        print(f"wrote the paper-unit view of {n} cells to {args.out}")
        return 0
    path = Path(args.profile)
    if not path.is_file():
        path = ROOT / "profiles" / args.profile / "pipeline.yaml"
    p = plan(load_profile(path))
    print(explain(p))
    if args.commands:
        for c in p.all_cells():
            if not args.sweep or c.sweep in args.sweep:
                print(c.command(p.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
