"""Measuring cells: from a sweep's grid to result files (the first stage of the harness).

`sweeps` expands conf/sweep/*.yaml into cells for a pipeline profile, `point` groups them into
points (the cells a ratio compares, measured in one call) and runs them, `batch` runs a cell list
on a lent GPU host without Snakemake. One cell is `cell` (the Hydra app): its config parsed once
into a typed `config.Cell`, the system started (`launch`, `systems`), the load offered by
`client` from a `workloads` file, the engine's counters read (`counters`), the environment
recorded (`env`, `provenance`), the result written; `proc` runs a cell as a child process.
`results` reads and validates what cells wrote, `engine_changes` says which of them predate a
change that moves their numbers, `profile` captures steady decode beside a run. Rendering those
files is harness.report.repetitions's; nothing here imports it.
"""
