"""harness.run.config: the composed Hydra config parsed once into a typed, frozen Cell, a bad value
refused there with the key it names (before any work), and the identity the result file records."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from harness.run.config import Cell, CellError, Identity
from harness.run.sweeps import cell_id

ROOT = Path(__file__).resolve().parents[3]


def _cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_every_part_is_typed_from_its_group():
    cell = Cell.from_config(_cfg("system=granikv", "model=tiny", "hardware=cpu", "workload=multiprefix", "batch=8",
                                 "rate=4", "client.api=completions", "+server.extra.min_prefix_for_hot=16"))
    ident = cell.identity
    assert (ident.system, ident.model, ident.tp, ident.batch) == ("granikv", "tiny", 1, 8)
    assert cell.identity.rate == 4.0 and cell.system.is_engine and cell.model.group_size == 4
    assert cell.hardware.device == "cpu" and dict(cell.hardware.env) == {"TRITON_INTERPRET": "1"}
    assert cell.workload.kind == "multiprefix" and cell.workload.vocab_size == 1024  # the model's ids
    assert cell.client.api == "completions" and dict(cell.server.extra) == {"min_prefix_for_hot": 16}
    assert cell.paths.sweep == "adhoc" and not cell.on_gpu
    assert cell.result_path == Path("results") / "cpu" / "adhoc" / f"{cell.cell_id}.json"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cell.identity.batch = 16  # type: ignore[misc]


def test_the_identity_names_the_cell_as_the_sweeps_do():
    """The identity is what the result file's config records and what the cell id is made of:
    the same keys, in the same id, as a sweep plans (harness.run.sweeps.cell_id)."""
    ident = Identity.from_config(_cfg("system=cascade", "workload=multiprefix", "tag=x"))
    d = ident.to_dict()
    assert list(d) == ["system", "model", "tp", "workload", "lp", "batch", "k", "rep", "hot_fraction",
                       "cold_page_size", "page_size", "m_sat", "rate", "tag", "share_depth"]
    assert d["rate"] == "inf" and d["m_sat"] is None and ident.cell_id == cell_id(d)
    assert ident.cell_id == "cascade-llama-3.1-8b-tp1-multiprefix-lp8192-b256-k4-r0-tagx"


@pytest.mark.parametrize("override, message", [
    ("tp=two", "tp must be an integer"),
    ("batch=2.5", "batch must be an integer"),
    ("hot_fraction=lots", "hot_fraction must be a number"),
    ("rate=0", "rate must be > 0 or inf"),
    ("flush_cache=sometimes", "flush_cache must be true or false"),
    ("client.progress=1", "client.progress must be true or false"),
    ("server.port=http", "server.port must be an integer"),
    ("~server.host", "server.host is missing"),
    ("system.kind=container", "system kind must be engine or external"),
    ("workload.suffix=poems", "invalid workload: suffix must be one of"),
])
def test_a_bad_value_is_refused_at_parse_time_naming_its_key(override, message):
    with pytest.raises(CellError, match=message):
        Cell.from_config(_cfg(override))
