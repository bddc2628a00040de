"""Benchmarking and reproduction harness for GraniKV (imports granikv, never the reverse).

In stages: `run` measures cells into result files, `report` renders them (the paper's tables
beside ours, plots, pages, the CI gate), `docs` renders the measured figures of docs/generated/;
`microbench` and `diagnostics` hold the benchmarks and the one-off questions, `data` the paper's
tables and the list of engine changes. `report` and `docs` read what `run` writes, never the
reverse.
"""
