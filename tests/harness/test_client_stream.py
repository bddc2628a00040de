"""The client-side microbenchmark: the client's stream reader over the server's exact chunks."""

from __future__ import annotations

import json

from harness.microbench import client_stream


def test_client_stream_bench_reads_every_chunk(tmp_path):
    assert client_stream.main(["--batch", "3", "--output-len", "5", "--reps", "1",
                               "--out", str(tmp_path / "cs.json")]) == 0
    doc = json.loads((tmp_path / "cs.json").read_text())
    assert [r["streaming"] for r in doc["records"]] == ["cumulative", "incremental"]
    assert all(r["us_per_chunk"] > 0 and r["output_len"] == 5 for r in doc["records"])
