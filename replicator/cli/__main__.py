"""`python -m replicator.cli`: the `replicator` command without its console script."""

import sys

from replicator.cli.main import main

sys.exit(main())
