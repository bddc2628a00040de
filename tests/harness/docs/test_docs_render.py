"""docs/generated/ is rendered from committed result files: re-rendering gives the committed text.

Why: docs/performance.md and docs/reproduction.md explain decisions with measured numbers; those
numbers live only in the generated blocks, so a result file re-measured without re-rendering (or a
generated file edited by hand) would make the docs say something the results no longer do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.docs import common, render

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ROOT / "docs" / "generated"
RERENDER = "re-render: python -m harness.docs.render --root . --out docs/generated"


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    if not (ROOT / common.H200).is_dir():
        pytest.skip("no committed H200 results")
    return render.render_all(ROOT)


def test_every_generated_file_is_current(rendered):
    for name, text in rendered.items():
        committed = GENERATED / name
        assert committed.is_file(), f"docs/generated/{name} is missing; {RERENDER}"
        assert committed.read_text() == text, f"docs/generated/{name} differs from its results; {RERENDER}"


def test_no_generated_file_without_a_generator(rendered):
    assert sorted(p.name for p in GENERATED.glob("*.md")) == sorted(rendered)


def test_cli_writes_the_same_files(tmp_path, rendered):
    render.main(["--root", str(ROOT), "--out", str(tmp_path), "--only", "kernels", "specialize"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels.md", "specialize.md"]
    assert (tmp_path / "kernels.md").read_text() == rendered["kernels.md"]


def test_every_block_names_its_sources(rendered):
    for name, text in rendered.items():
        assert text.startswith(common.HEADER), name
        assert "Source: `" in text, name


def test_relative_links_in_docs_resolve():
    """Every Markdown link from the docs (and README) to a repository file points at one that exists,
    so a renamed or deleted doc cannot leave a dangling reference behind."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, missing
