"""`python -m replicator.sim`: the same simulator as `replicator sim`."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from replicator.errors import ReplicatorError
from replicator.sim.cli import add_sim_arguments, run_sim

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the `sim` options and serve; a bad option ends with one line on stderr, exit 2."""
    parser = argparse.ArgumentParser(
        prog="python -m replicator.sim",
        description="Serve a simulated Couchbase bucket over DCP until SIGTERM or Ctrl-C.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_sim_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    try:
        return run_sim(args)
    except ReplicatorError as exc:
        print(f"replicator sim: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
