"""The process measurement 6 runs in: `python -m replicator.bench.memory_probe ...`.

A fresh Python driver with a fresh JVM, so that their peak resident sets (VmHWM) belong to
this one replication and nothing else. Mirrors the source until caught up with the given
memory budget, then prints one JSON line: the peaks, rows committed and seconds. The password
comes from REPLICATOR_PASSWORD, never from the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

from replicator.bench.initial_load import bench_config
from replicator.bench.procfs import peak_rss_bytes, spark_jvm_pid
from replicator.pipeline.runner import run_replication


def main(argv: Sequence[str] | None = None) -> int:
    """Run one replication and print its memory peaks as JSON on stdout."""
    parser = argparse.ArgumentParser(prog="python -m replicator.bench.memory_probe")
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--staging-dir", required=True)
    parser.add_argument("--memory-budget-mb", type=int, required=True)
    args = parser.parse_args(argv)
    password = os.environ.get("REPLICATOR_PASSWORD")
    if not password:
        print("memory_probe: set REPLICATOR_PASSWORD", file=sys.stderr)
        return 2

    from replicator.runtime.spark import build_session

    spark = build_session("bench-memory-probe")
    config = bench_config(
        args.source,
        args.target,
        password,
        until_caught_up=True,
        memory_budget_mb=args.memory_budget_mb,
        staging_dir=args.staging_dir,
    )
    started = time.perf_counter()
    summary = run_replication(config, spark=spark)
    seconds = time.perf_counter() - started
    rows = spark.read.format("delta").load(args.target).count()
    jvm_peak = peak_rss_bytes(spark_jvm_pid(spark))
    python_peak = peak_rss_bytes()
    spark.stop()
    print(
        json.dumps(
            {
                "python_peak_rss_bytes": python_peak,
                "jvm_peak_rss_bytes": jvm_peak,
                "rows": rows,
                "seconds": seconds,
                "caught_up": summary.caught_up,
                "commits": summary.commits,
                "peak_staged_bytes": summary.peak_buffered_bytes,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
