"""`python -m harness.run.client --url URL --workload FILE [...]`: harness.run.client.cli."""

import sys

from harness.run.client.cli import main

sys.exit(main())
