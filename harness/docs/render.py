"""Render the measured figures of docs/performance.md and docs/reproduction.md into docs/generated/.

Why a generator: the docs explain decisions with measurements, and a number typed into prose
drifts from the result file it came from. Every table here is computed from committed result
files (each block names its sources), one Markdown file per generator, and
tests/harness/docs/test_docs_render.py re-renders them and compares with the committed copies.

    python -m harness.docs.render --root . --out docs/generated       # all generators
    python -m harness.docs.render --only kernels storage              # some of them

Paths are fixed relative to the repository root (`results/h200`, `results/cpu`,
`conf/hardware/h200.yaml`) so the output does not depend on where it is run from. The H200 docs
are rendered from H200 results only; the CPU smoke pipeline does not render them. This module is
the registry: a page's generator lives in the module of its kind (kernels, engine, serving,
prefix_rule, reproduction, tree), each importing only harness.docs.common.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from harness.docs.common import Sources
from harness.docs.engine import (
    render_decode_step,
    render_host,
    render_replay,
    render_sampling_ab,
    render_storage,
    render_tp2,
)
from harness.docs.kernels import render_ceilings, render_extend, render_kernels, render_specialize
from harness.docs.prefix_rule import render_prefix_rule
from harness.docs.reproduction import render_reproduction
from harness.docs.serving import render_api_ab, render_graphs, render_serving_ab
from harness.docs.tree import render_tree

GENERATORS: dict[str, Callable[[Sources], str]] = {
    "ceilings": render_ceilings,
    "kernels": render_kernels,
    "decode-step": render_decode_step,
    "storage": render_storage,
    "extend": render_extend,
    "serving-ab": render_serving_ab,
    "api-ab": render_api_ab,
    "sampling-ab": render_sampling_ab,
    "prefix-rule": render_prefix_rule,
    "graphs": render_graphs,
    "specialize": render_specialize,
    "host": render_host,
    "tp2": render_tp2,
    "replay": render_replay,
    "reproduction": render_reproduction,
    "tree": render_tree,
}


def render_all(root: Path, names: Iterable[str] | None = None) -> dict[str, str]:
    """File name -> Markdown for each generator (all by default)."""
    src = Sources(root)
    return {f"{n}.md": GENERATORS[n](src) for n in (names or GENERATORS)}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.docs.render", description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".", help="repository root (results/, conf/ are read under it)")
    ap.add_argument("--out", default="docs/generated", help="folder for the generated Markdown files")
    ap.add_argument("--only", nargs="*", choices=sorted(GENERATORS), help="render only these")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render_all(Path(args.root), args.only).items():
        (out / name).write_text(text)
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
