"""`python -m harness.report.tables --results results/<hw> --out tables/<hw> [...]`: its `write` module."""

import sys

from harness.report.tables.write import main

sys.exit(main())
