"""Probe: the owners table's heartbeat as Spark's MERGE against delta-rs's UPDATE, side by side.

A measurement behind the heartbeat's design (README, "Heartbeats without Spark"), not product
code. On a new mirror, two claims (two shards), then rounds that each renew one claim with
Spark's MERGE and then with delta-rs's UPDATE; after the first rounds (the JVM warming up),
each engine's median and worst wall time.

    .venv/bin/python -m jobs.probes.heartbeat_engines WORK_DIR [ROUNDS]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from pathlib import Path


def main(work: str, rounds: int = 20) -> None:
    from replicator.delta.ownership import OwnersTable
    from replicator.delta.schema import MirrorConfig
    from replicator.delta.table import open_or_create
    from replicator.runtime.spark import build_session

    path = Path(work) / "heartbeats"
    shutil.rmtree(path, ignore_errors=True)
    spark = build_session("heartbeat-probe")
    mirror = open_or_create(spark, str(path), MirrorConfig("probe", num_vbuckets=1024))
    by_spark = OwnersTable.of(mirror, spark_heartbeats=True)
    by_delta_rs = OwnersTable.of(mirror)
    claim = by_spark.claim(range(512))
    by_spark.claim(range(512, 1024))  # a second shard's row, as in a sharded run
    times: dict[str, list[float]] = {"spark": [], "delta-rs": []}
    for _ in range(rounds):
        for name, owners in (("spark", by_spark), ("delta-rs", by_delta_rs)):
            started = time.perf_counter()
            owners.heartbeat(claim)
            times[name].append(time.perf_counter() - started)
    for name, seconds in times.items():
        warm = seconds[3:]
        print(
            f"{name:9} median {statistics.median(warm):.3f} s, worst {max(warm):.3f} s, "
            f"first {seconds[0]:.3f} s ({len(warm)} warm rounds)"
        )
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
