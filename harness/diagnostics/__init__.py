"""One-off diagnostics: each answers one question about where time or memory went, and its result
file under results/<hw>/microbench/ backs a finding in the docs. Not part of the reproduction
pipeline (harness/microbench/ holds the benchmarks the tables and profiles run)."""
