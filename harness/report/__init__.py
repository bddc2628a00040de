"""Rendering what the cells measured: the paper's tables beside ours, plots, pages, the CI gate.

Everything here is a pure function of committed result files (read through harness.run.results)
and of the paper's numbers (`paper`, harness/data/paper_tables/): `tables` rebuilds Tables 3-24,
`plots` the figures, `repetitions` each point's spread and the A/B cells, `hint_free` and
`sweep_bar` the hint-free A/B page, `tree_table` the any-depth sharing page, `gate` the
throughput regression verdict. Nothing in harness.run imports this package.
"""
