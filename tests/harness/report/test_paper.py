"""The paper's published numbers as data (harness.report.paper, harness/data/paper_tables/): every
table is there, one file per group of tables, and it is the shared extraction's copy."""

from __future__ import annotations

import pytest

from harness.report.paper import load_paper_tables, paper_table


def test_paper_data_holds_every_table():
    data = load_paper_tables()
    for n in range(1, 25):
        t = data[f"table{n}"]
        assert t.rows and t.columns and t.caption
        assert t.number == n
    assert len(paper_table(3).rows) == 9
    assert paper_table(3).find_rows(config="Llama-3.1-8B / TP=1", Lp=16384)[0]["x_SGL"] == 2.16


def test_paper_data_is_one_file_per_group_of_tables_and_a_key_lives_in_one(tmp_path):
    from harness.report.paper import PAPER_TABLES_PATH

    files = sorted(PAPER_TABLES_PATH.glob("*.yaml"))
    assert len(files) > 1 and all(len(f.read_text().splitlines()) <= 600 for f in files)
    one = tmp_path / "one.yaml"
    one.write_text("".join(f.read_text() for f in files))  # the same tables as one file: the shared form
    assert load_paper_tables(one) == load_paper_tables()
    (tmp_path / "split").mkdir()
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / "split" / name).write_text(files[0].read_text())
    with pytest.raises(ValueError, match="defined in another file"):
        load_paper_tables(tmp_path / "split")
