"""Probe: what a heartbeat commits, by Spark and by delta-rs, side by side.

A measurement behind the heartbeat's design (README, "Heartbeats without Spark"), not product
code. Every heartbeat renews the claim in the owners table and writes the checkpoint rows of the
data commits queued since the last one (1,024 rows each at 1024 vbuckets). On a new mirror with
two shards' claims, each round does both with Spark (MERGE, append) and then with delta-rs
(UPDATE, append); after the first three rounds (the JVM warming up), each one's median and
worst wall time.

    .venv/bin/python -m jobs.probes.heartbeat_commits WORK_DIR [ROUNDS [COMMITS_PER_FLUSH]]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path


def main(work: str, rounds: int = 20, commits_per_flush: int = 3) -> None:
    from replicator.delta.checkpoints import CheckpointsTable
    from replicator.delta.commit_metadata import CommitMetadata
    from replicator.delta.ownership import OwnersTable
    from replicator.delta.schema import MirrorConfig
    from replicator.delta.table import CommitRecord, open_or_create
    from replicator.model.positions import VbucketPosition
    from replicator.runtime.spark import build_session

    path = Path(work) / "heartbeats"
    shutil.rmtree(path, ignore_errors=True)
    spark = build_session("heartbeat-probe")
    mirror = open_or_create(spark, str(path), MirrorConfig("probe", num_vbuckets=1024))
    owners = {
        "spark": OwnersTable.of(mirror, spark_heartbeats=True),
        "delta-rs": OwnersTable.of(mirror),
    }
    checkpoints = {
        "spark": CheckpointsTable.of(mirror, spark_appends=True),
        "delta-rs": CheckpointsTable.of(mirror),
    }
    claim = owners["spark"].claim(range(512))
    owners["spark"].claim(range(512, 1024))  # a second shard's row, as in a sharded run
    batch = 0

    def flush(engine: str) -> None:
        nonlocal batch
        records = []
        for _ in range(commits_per_flush):
            batch += 1
            positions = {vb: VbucketPosition.at_boundary(vb, 1, batch) for vb in range(1024)}
            metadata = CommitMetadata("commit", batch, 0, f"probe-{engine}", "merge", positions)
            records.append(CommitRecord(batch, datetime.now(UTC), metadata))
        checkpoints[engine].record(records)

    steps: dict[str, Callable[[str], None]] = {
        "heartbeat": lambda engine: owners[engine].heartbeat(claim),
        "checkpoint rows": flush,
    }
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for engine in ("spark", "delta-rs"):
            for step, run in steps.items():
                started = time.perf_counter()
                run(engine)
                times.setdefault((step, engine), []).append(time.perf_counter() - started)
    for (step, engine), seconds in times.items():
        warm = seconds[3:]
        print(
            f"{step:15} {engine:9} median {statistics.median(warm):.3f} s, "
            f"worst {max(warm):.3f} s, first {seconds[0]:.3f} s ({len(warm)} warm rounds)"
        )
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:4]))
