"""Loading and validating result files: the contract tables, plots and the gate read
(docs/design.md, "Result files").

Layout under one hardware directory `results/<hardware>/`:

- `<sweep>/<cell-id>.json`: one serving cell, `{"config", "metrics", "engine", "env"}` and an
  optional `"profile"` section (`{category: ms}`, see `harness.report.tables` for the categories).
  `env.call_id` names the call the cell was measured in (the cells of one point share it,
  `harness.run.point`); files written before cells recorded it have none. `load_cells`' frame always
  has the column (`CALL_ID`): NaN or None for a file without a call id, so the tables can tell
  which ratios set cells of one call side by side (`harness.report.tables.queries.ratio_reps`).
- `microbench/<name>.json`: `{"env": {...}, "records": [{...}, ...]}` (kernel microbenchmarks,
  ncu counters, dispatch-overhead captures; the record fields each consumer expects are listed
  in `harness.report.tables`).

Validation is strict on the keys every consumer relies on and says which file and which key is
wrong, because a silently half-read result set would produce a table with quietly missing
cells. Everything else in a file is carried through untouched as flattened columns
(`config.lp`, `metrics.output_throughput`, `engine.dense_steps`, `env.gpu`, `profile.*`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import numbers
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

SECTIONS = ("config", "metrics", "engine", "env")
REQUIRED_KEYS: Mapping[str, tuple[str, ...]] = {
    "config": ("system", "model", "tp", "workload", "lp", "batch"),
    "metrics": ("output_throughput", "median_ttft_ms", "median_tpot_ms", "completed", "failed"),
    "engine": ("decode_steps",),
    "env": ("gpu", "git_sha"),
}
NUMERIC_KEYS: Mapping[str, tuple[str, ...]] = {
    "config": ("tp", "lp", "batch"),
    "metrics": ("output_throughput", "median_ttft_ms", "median_tpot_ms", "completed", "failed"),
    "engine": ("decode_steps",),
}
MICROBENCH_DIR = "microbench"
# directories under results/<hardware>/ that hold no serving cells: benchmarks with their own
# schemas (engine decode steps) and the gate's baselines (a superseded cell is in git's history)
NON_CELL_DIRS = frozenset({"engine", "baselines"})

# A GraniKV run whose dispatcher can never choose the dense pass (m_sat at or above this) is
# "SGLang-Cascade on GraniKV storage" (the SGL-C/GKV column of Tables 13-14), not GraniKV.
CASCADE_ONLY_M_SAT = 2**30
VARIANTS = ("paged", "cascade", "granikv", "granikv_cascade")
# the frame's column naming the call a cell was measured in; NaN/None for a file without one
CALL_ID = "env.call_id"


class ResultFileError(ValueError):
    """A result file breaks the contract; the message names the file and the key."""


def _flatten(prefix: str, obj: Any, out: dict[str, Any]) -> None:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(obj, list):
        out[prefix] = _frozen(obj)  # hashable, so cells can be grouped on it
    else:
        out[prefix] = obj


def _frozen(obj: list) -> tuple:
    return tuple(_frozen(v) if isinstance(v, list) else v for v in obj)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def validate_cell(doc: Any, path: Path | str = "<memory>") -> None:
    """Raise ResultFileError unless `doc` carries every section and key of the contract."""
    if not isinstance(doc, Mapping):
        raise ResultFileError(f"{path}: top level must be a JSON object, got {type(doc).__name__}")
    for section in SECTIONS:
        if section not in doc:
            raise ResultFileError(f"{path}: missing section {section!r} (need {list(SECTIONS)})")
        if not isinstance(doc[section], Mapping):
            raise ResultFileError(f"{path}: section {section!r} must be an object")
        missing = [k for k in REQUIRED_KEYS[section] if k not in doc[section]]
        if missing:
            raise ResultFileError(f"{path}: {section} lacks required key(s) {missing}")
        for k in NUMERIC_KEYS.get(section, ()):
            v = doc[section][k]
            if not _is_number(v) or (isinstance(v, float) and math.isnan(v)):
                raise ResultFileError(f"{path}: {section}.{k} must be a number, got {v!r}")
    call_id = doc["env"].get("call_id")  # optional: files measured before cells recorded their call have none
    if call_id is not None and not (isinstance(call_id, str) and call_id):
        raise ResultFileError(f"{path}: env.call_id must be a non-empty string, got {call_id!r}")
    if "profile" in doc and not isinstance(doc["profile"], Mapping):
        raise ResultFileError(f"{path}: optional section 'profile' must be an object of category -> ms")


def variant_of(config: Mapping[str, Any]) -> str:
    """The system a cell measures, telling forced-cascade GraniKV runs apart from GraniKV."""
    system = str(config["system"])
    try:
        m_sat = float(config.get("m_sat"))  # a number, "inf" or None
    except (TypeError, ValueError):
        m_sat = float("nan")
    if system == "granikv" and m_sat >= CASCADE_ONLY_M_SAT:
        return "granikv_cascade"
    return system


def cell_row(doc: Mapping[str, Any], *, hardware: str, sweep: str, cell_id: str, path: str) -> dict[str, Any]:
    """One validated cell as a flat dict (the DataFrame row)."""
    row: dict[str, Any] = {"hardware": hardware, "sweep": sweep, "cell_id": cell_id, "path": path,
                           "variant": variant_of(doc["config"])}
    for section, body in doc.items():
        if isinstance(body, Mapping):
            _flatten(section, body, row)
    return row


def _read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ResultFileError(f"{path}: not valid JSON ({e})") from e


def load_cells(results_dir: Path | str, sweeps: Iterable[str] | None = None) -> pd.DataFrame:
    """All serving cells under `results/<hardware>/` as one flat DataFrame.

    `sweeps` restricts the scan to those sweep directories. An empty DataFrame (with the
    bookkeeping columns) comes back when there is nothing; a malformed file raises.
    """
    root = Path(results_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"results directory {root} does not exist")
    wanted = set(sweeps) if sweeps is not None else None
    rows = []
    for sweep_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        if sweep_dir.name == MICROBENCH_DIR or sweep_dir.name in NON_CELL_DIRS or sweep_dir.name.startswith("."):
            continue
        if wanted is not None and sweep_dir.name not in wanted:
            continue
        for path in sorted(sweep_dir.glob("*.json")):
            doc = _read_json(path)
            validate_cell(doc, path)
            rows.append(cell_row(doc, hardware=root.name, sweep=sweep_dir.name, cell_id=path.stem,
                                 path=str(path)))
    if not rows:
        return pd.DataFrame(columns=["hardware", "sweep", "cell_id", "path", "variant", CALL_ID])
    frame = pd.DataFrame(rows)
    if CALL_ID not in frame.columns:  # no file recorded its call: the column is there, all None
        frame[CALL_ID] = None
    return frame


def validate_microbench(doc: Any, path: Path | str = "<memory>") -> None:
    if not isinstance(doc, Mapping):
        raise ResultFileError(f"{path}: top level must be a JSON object")
    if "records" not in doc or not isinstance(doc["records"], list):
        raise ResultFileError(f"{path}: microbench file needs a 'records' list")
    if "env" not in doc or not isinstance(doc["env"], Mapping):
        raise ResultFileError(f"{path}: microbench file needs an 'env' object")
    for i, rec in enumerate(doc["records"]):
        if not isinstance(rec, Mapping):
            raise ResultFileError(f"{path}: records[{i}] must be an object")


def load_microbench(results_dir: Path | str, name: str) -> pd.DataFrame | None:
    """Records of `results/<hardware>/microbench/<name>.json`, or None when the file is absent.

    The file's env is flattened into `env.*` columns of every record; a record with an `env` of its
    own (re-measured by a later run merged into the file, e.g. the kernels microbench's
    `--stage table5 --merge-into`) keeps its own.
    """
    path = Path(results_dir) / MICROBENCH_DIR / f"{name}.json"
    if not path.exists():
        return None
    doc = _read_json(path)
    validate_microbench(doc, path)
    rows = []
    for rec in doc["records"]:
        row: dict[str, Any] = {}
        _flatten("env", doc["env"], row)
        own_env = rec.get("env")
        if own_env is not None and isinstance(own_env, Mapping):
            row = {k: v for k, v in row.items() if not k.startswith("env.")}
        _flatten("", rec, row)
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class ResultSet:
    """Everything one hardware directory holds: cells and microbench records by file name."""

    hardware: str
    cells: pd.DataFrame
    microbench: Mapping[str, pd.DataFrame] = field(default_factory=dict)
    # the cell paths read inside each open `recording()` (innermost last): which cells are behind
    # a table row, so a row built from a stale cell can be marked (harness.report.tables, engine_changes)
    _recordings: list[set[str]] = field(default_factory=list, compare=False, repr=False)

    @contextlib.contextmanager
    def recording(self) -> Iterator[set[str]]:
        """Collect the paths of the cells `note_used` sees until the block ends."""
        paths: set[str] = set()
        self._recordings.append(paths)
        try:
            yield paths
        finally:
            self._recordings.pop()

    def note_used(self, cells: pd.DataFrame) -> None:
        if self._recordings and "path" in cells.columns:
            for paths in self._recordings:
                paths.update(str(p) for p in cells["path"])

    @functools.cached_property
    def _by_sweep(self) -> dict[str, pd.DataFrame]:
        if not len(self.cells):
            return {}
        return {str(s): g for s, g in self.cells.groupby("sweep", sort=False)}

    def sweep_cells(self, sweep: str) -> pd.DataFrame:
        """The cells of one sweep (split once: tables look sweeps up hundreds of times)."""
        return self._by_sweep.get(sweep, self.cells.iloc[0:0])

    @property
    def gpu(self) -> str | None:
        """The GPU the cells were measured on, as the env recorded it (None if unknown)."""
        for frame in (self.cells, *self.microbench.values()):
            if "env.gpu" in frame.columns and len(frame):
                values = sorted({str(v) for v in frame["env.gpu"].dropna()})
                if values:
                    return ", ".join(values)
        return None


def load_results(results_dir: Path | str) -> ResultSet:
    """Load cells and every microbench file of `results/<hardware>/`."""
    root = Path(results_dir)
    cells = load_cells(root)
    if "config.tag" in cells.columns:  # tagged A/B cells are compared by harness.report.repetitions, not tabled
        cells = cells[cells["config.tag"].isna()].reset_index(drop=True)
    micro: dict[str, pd.DataFrame] = {}
    mdir = root / MICROBENCH_DIR
    if mdir.is_dir():
        for path in sorted(mdir.glob("*.json")):
            frame = load_microbench(root, path.stem)
            if frame is not None:
                micro[path.stem] = frame
    return ResultSet(hardware=root.name, cells=cells, microbench=micro)
