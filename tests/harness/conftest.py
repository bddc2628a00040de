"""tests/harness: the harness's tests, one folder per package (run/, report/, docs/, microbench/,
diagnostics/), and what they share here: the fakes (`fake_cell`, `fake_engine`, `fake_server`,
`proc_testutil`) and `fixtures/` (a fake result set, ncu captures).

Test modules import the fakes by name (`from fake_server import FakeServer`), as they did while
they sat beside them; putting this folder on sys.path keeps that one plain form for every test
folder below, so no test computes a path to reach them. `fake_engine` also runs as a server
process, `python -m tests.harness.fake_engine`, from the repository root.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
