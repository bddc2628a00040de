"""The generated pages of docs/generated/: measured figures rendered from committed result files.

`render` is the command (`python -m harness.docs.render`) and the registry of generators; each
page's generator lives in the module of its kind (`kernels`, `engine`, `serving`, `prefix_rule`,
`reproduction`), and what they share (paths, the header, reading a point's reps, Markdown
tables) is `common`.
"""
