"""Result files (harness.run.results): a malformed file is refused naming the file and the key,
variants are told apart, and the loader flattens cells into the frame the tables read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.run.results import (
    ResultFileError,
    load_cells,
    load_microbench,
    validate_cell,
    variant_of,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "results" / "fixture-hw"


def _good_doc():
    return json.loads(next((FIXTURE / "table3").glob("*.json")).read_text())


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("engine"), "missing section 'engine'"),
    (lambda d: d["config"].pop("lp"), "config lacks required key(s) ['lp']"),
    (lambda d: d["metrics"].update(output_throughput="fast"), "metrics.output_throughput must be a number"),
    (lambda d: d.update(profile=[1, 2]), "'profile' must be an object"),
])
def test_validation_names_file_and_key(tmp_path, mutate, message):
    doc = _good_doc()
    mutate(doc)
    path = tmp_path / "hw" / "table3" / "bad.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultFileError) as e:
        load_cells(tmp_path / "hw")
    assert message in str(e.value) and "bad.json" in str(e.value)


@pytest.mark.parametrize("system, m_sat, variant", [
    ("granikv", None, "granikv"), ("granikv", 1024, "granikv"), ("granikv", 2**30, "granikv_cascade"),
    ("granikv", "inf", "granikv_cascade"), ("granikv", float("inf"), "granikv_cascade"),
    ("cascade", 2**31, "cascade"), ("sglang", None, "sglang"),
])
def test_variant_tells_forced_cascade_granikv_apart(system, m_sat, variant):
    assert variant_of({"system": system, "m_sat": m_sat}) == variant


def test_loader_flattens_and_handles_absent_things(tmp_path):
    validate_cell(_good_doc())
    cells = load_cells(FIXTURE, sweeps=["table13"])
    assert {"config.system", "metrics.output_throughput", "engine.decode_steps", "env.gpu",
            "profile.prefix_attention_ms", "variant", "sweep"} <= set(cells.columns)
    assert set(cells["variant"]) == {"paged", "cascade", "granikv", "granikv_cascade"}
    assert load_microbench(FIXTURE, "absent") is None
    (tmp_path / "hw").mkdir()
    assert len(load_cells(tmp_path / "hw")) == 0
    (tmp_path / "hw" / "s").mkdir()
    (tmp_path / "hw" / "s" / "x.json").write_text("{not json")
    with pytest.raises(ResultFileError, match="not valid JSON"):
        load_cells(tmp_path / "hw")
