"""spark-submit entry point: replicate a Couchbase bucket into a Delta table.

    REPLICATOR_PASSWORD=... spark-submit \
        --jars "$(python -m replicator.runtime.jars locate | paste -sd, -)" \
        jobs/replicate.py --source couchbase://db1/travel --target s3a://lake/travel \
        --until-caught-up

Takes the flags of `replicator run` and exits with the CLI's codes: 0 done, 2 a one-line error
on stderr. The session keeps the master spark-submit set up (`--master spark://host:7077` runs
the MERGEs on the cluster's executors) and only adds UTC and Arrow if spark-submit did not set
them. On a cluster the target must be storage every executor reaches (s3a://, abfss://, or a
shared filesystem), and so must the spill directory, which executors read: by default
`<target>/_replicator/staging`, fine for a target on a shared mount. Spill files are written
through the driver's local file API, so with an object-store target pass `--staging-dir` on a
filesystem every executor mounts. Shards: one job per `--vbuckets 1/2`, `2/2`, ... into the
same target. The Delta jars must reach the
driver when spark-submit starts it (`--jars` or `--packages io.delta:delta-spark_2.13:4.0.1`):
a session created later cannot add them to the driver's classpath, and the job then stops with
a one-line error saying so.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

try:
    import replicator  # noqa: F401
except ImportError:
    # Run from a source checkout without the package installed: the repo root holds it.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replicator.cli.main import run_job


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job with `argv` (default: the command line); returns the exit code."""
    return run_job(argv, prog="replicate.py")


if __name__ == "__main__":
    raise SystemExit(main())
