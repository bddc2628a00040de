"""Every table of the paper (3-24) rebuilt from our result files, the paper's numbers beside ours.

A table goes through one module per step: `specs` (data: what each table reads and how each
column is derived) -> `extract` (one extractor per table, through the lookups of `queries`) ->
`compare` (`build_table`: paper, ours, ours/paper per cell) -> `render` (the cell texts as
Markdown, LaTeX and CSV); `write` writes the files and the index (`python -m
harness.report.tables`).
"""
