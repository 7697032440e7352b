"""`make bench`: the benchmark suite, side by side in one run.

    python jobs/bench.py [--preset default|quick|smoke] [--output DIR] [--work-dir DIR]
    python jobs/bench.py --two-shards [--preset ...]   # one vs two shards on a standalone cluster

Prints a table (and the goals with PASS/MISS) on stdout and writes DIR/bench-<timestamp>.json,
DIR/latest.json and DIR/latest.md (a markdown table for the README). Progress goes to stderr.
Exit code 0 when every measurement ran (goals may be missed), 1 when one failed, 2 on bad flags.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

try:
    import replicator  # noqa: F401
except ImportError:
    # Run from a source checkout without the package installed: the repo root holds it.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if TYPE_CHECKING:
    from replicator.bench.presets import BenchPreset


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite with `argv` (default: the command line); returns the exit code."""
    from replicator.bench.presets import PRESETS, preset_named
    from replicator.bench.report import render_markdown, render_table, write_report
    from replicator.bench.suite import run_suite

    parser = argparse.ArgumentParser(prog="bench.py", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--preset", default="default", choices=sorted(PRESETS))
    parser.add_argument("--output", default="bench-output", help="directory of the JSON reports")
    parser.add_argument("--work-dir", default=None, help="tables and logs (default: a temp dir)")
    parser.add_argument("--keep-work", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--two-shards", action="store_true",
        help="instead of the suite: the preset's initial load as one and as two shards on a "
        "Spark standalone cluster started on 127.0.0.1",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    preset = preset_named(args.preset)  # cannot fail: argparse's `choices` checked the name

    def announce(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.two_shards:
        return _two_shards(preset, args.work_dir, keep_work=args.keep_work)

    report = run_suite(preset, work_dir=args.work_dir, keep_work=args.keep_work, announce=announce)
    print(render_table(report))
    dated, latest = write_report(report, args.output)
    (Path(args.output) / "latest.md").write_text(render_markdown(report) + "\n")
    print(f"\nwrote {dated} and {latest}")
    return 1 if report.failures else 0


def _two_shards(preset: BenchPreset, work_dir: str | None, *, keep_work: bool) -> int:
    """Time the preset's initial load as one replicator and as two shards; print both.

    The work directory (two mirrors, the cluster's and producer's logs) goes afterwards, as
    the suite's does, unless `keep_work` or the measurement failed.
    """
    import shutil
    import tempfile

    from replicator.bench.sharding import ShardedLoadFailed, measure_two_shard_load

    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="replicator-shards-"))
    try:
        result = measure_two_shard_load(
            preset.docs, preset.doc_size, preset.vbuckets, work_dir=work
        )
    except ShardedLoadFailed as exc:
        print(f"bench.py: {exc}\nwork directory kept: {work}", file=sys.stderr)
        return 1
    if keep_work:
        print(f"work directory kept: {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    for run in (result.one_shard, result.two_shards):
        print(
            f"{run.shards} shard(s), {run.cores_per_shard} core(s) each: {run.seconds:.1f} s, "
            f"{run.docs_per_second:,.0f} docs/s"
        )
    print(f"speed-up of two shards: {result.speedup:.2f}x ({preset.docs:,} docs x "
          f"{preset.doc_size} B, {preset.vbuckets} vbuckets)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
