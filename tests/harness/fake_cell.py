"""A harness.run.cell stand-in for the point runners (harness.run.point, harness.run.batch run): it runs in a
child process as harness.run.cell would, with the environment the runner gives it, writes its line's
result file with the call id and commit it ran under, and journals what it ran."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from harness.run import point

# argv: the result path per `<system>@<rep>` (JSON), the journal, the system that fails, then the
# cell's overrides; `fail=<system>` makes that system's cell exit 1 without a result
_FAKE_CELL = r"""
import json, os, sys
paths, journal, fail = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
ov = dict(o.lstrip("+").split("=", 1) for o in sys.argv[4:])
with open(journal, "a") as f:
    f.write(json.dumps({"system": ov["system"], "rep": ov.get("rep", "0"), "overwrite": ov.get("overwrite"),
                        "call": os.environ.get("GRANIKV_CALL_ID")}) + "\n")
if ov["system"] == fail:
    sys.exit(1)
key = ov["system"] + "@" + ov.get("rep", "0")
os.makedirs(os.path.dirname(paths[key]), exist_ok=True)
with open(paths[key], "w") as f:
    json.dump({"env": {"git_sha": os.environ.get("GIT_SHA"), "call_id": os.environ["GRANIKV_CALL_ID"]}}, f)
"""


def fake_cells(monkeypatch, tmp_path: Path, paths: dict[str, Path], fail: str = "-") -> Callable[[], list[dict]]:
    """Make harness.run.point.run_cell (the runner of both) start _FAKE_CELL instead of harness.run.cell;
    return a reader of the journal: one {system, rep, overwrite, call} per cell started."""
    journal = tmp_path / "journal.jsonl"
    spec = json.dumps({k: str(v) for k, v in paths.items()})

    def command(ov, python=None):
        return [sys.executable, "-c", _FAKE_CELL, spec, str(journal), fail, *ov]

    monkeypatch.setattr(point, "cell_command", command)

    def read() -> list[dict]:
        return [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []

    return read


def write_result(path: Path, sha: str, call: str | None) -> None:
    """A minimal result file: the commit and (unless None) the call id."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"env": {"git_sha": sha, **({"call_id": call} if call else {})}}))
