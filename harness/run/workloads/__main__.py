"""`python -m harness.run.workloads [--kind K --field value ...]`: harness.run.workloads.cli."""

import sys

from harness.run.workloads.cli import main

sys.exit(main())
