"""The layout comparison's command line: `python -m replicator.bench.layouts` (see the
package's docstring)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from replicator.bench.layouts.report import (
    CandidateResult,
    LayoutsReport,
    ScalingResult,
    render_candidate,
    render_scaling,
    render_summary,
    write_json,
)
from replicator.bench.layouts.runs import measure_candidate, measure_doc_bytes, measure_scaling
from replicator.bench.layouts.workload import LAYOUTS, SCALING_LAYOUTS, Layout


def _sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of sizes, got {text!r}")
    return sizes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m replicator.bench.layouts",
        description="Measure candidate Delta layouts of the mirror table side by side.",
    )
    parser.add_argument("--docs", type=int, default=200_000, help="rows of each candidate table")
    parser.add_argument("--changes", type=int, default=20_000, help="source rows of a MERGE batch")
    parser.add_argument("--batches", type=int, default=3, help="MERGE batches per candidate")
    parser.add_argument("--work-dir", type=Path, required=True, help="where tables are made")
    parser.add_argument("--output", type=Path, required=True, help="JSON file of all figures")
    parser.add_argument(
        "--layouts", default=",".join(LAYOUTS),
        help=f"candidates to run, in order (of {', '.join(LAYOUTS)}; empty: none)",
    )
    parser.add_argument(
        "--scaling", type=_sizes, default=(200_000, 1_000_000, 5_000_000),
        help="table sizes of the scaling run (groups16 and unpartitioned)",
    )
    parser.add_argument(
        "--scaling-layouts", default=",".join(SCALING_LAYOUTS),
        help="layouts of the scaling run, in the order they run at each size",
    )
    parser.add_argument("--skip-scaling", action="store_true", help="no scaling run")
    parser.add_argument("--driver-memory", default="4g", help="the local Spark driver's heap")
    parser.add_argument(
        "--no-change-data-feed", action="store_true",
        help="create every table without the change data feed (the mirror has it on)",
    )
    args = parser.parse_args(argv)
    args.layouts = _names(parser, args.layouts)
    args.scaling_layouts = _names(parser, args.scaling_layouts)
    return args


def _names(parser: argparse.ArgumentParser, text: str) -> tuple[str, ...]:
    """Layout names from a comma-separated list; an empty list runs none of them."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in LAYOUTS]
    if unknown:
        parser.error(f"unknown layouts {unknown}; known: {', '.join(LAYOUTS)}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    from replicator.runtime.spark import build_session

    args = parse_args(argv)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    load_start = os.getloadavg()

    def progress(message: str) -> None:
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        print(f"[{stamp} load {os.getloadavg()[0]:.2f}] {message}", file=sys.stdout, flush=True)

    work_dir: Path = args.work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    spark = build_session("layouts", driver_memory=args.driver_memory)
    shown_conf = {
        key: str(spark.conf.get(key, None) or "(unset)")
        for key in (
            "spark.master",
            "spark.sql.shuffle.partitions",
            "spark.databricks.delta.merge.repartitionBeforeWrite.enabled",
            "spark.databricks.delta.optimize.maxFileSize",
            "spark.databricks.delta.optimize.maxDeletedRowsRatio",
        )
    }
    doc_bytes = measure_doc_bytes(spark)
    progress(f"documents average {doc_bytes:.0f} bytes of JSON text")

    candidates: list[CandidateResult] = []
    scaling: list[ScalingResult] = []

    def report() -> LayoutsReport:
        return LayoutsReport(
            started_at=started_at,
            finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
            docs=args.docs,
            changes=args.changes,
            batches=args.batches,
            doc_bytes=doc_bytes,
            cpu_count=os.cpu_count(),
            driver_memory=args.driver_memory,
            spark_conf=shown_conf,
            load_start=load_start,
            load_end=os.getloadavg(),
            candidates=tuple(candidates),
            scaling=tuple(scaling),
        )

    def chosen(name: str) -> Layout:
        return replace(LAYOUTS[name], change_data_feed=not args.no_change_data_feed)

    for name in args.layouts:
        layout = chosen(name)
        result = measure_candidate(
            spark,
            layout,
            str(work_dir / name),
            docs=args.docs,
            changes=args.changes,
            batches=args.batches,
            progress=progress,
        )
        candidates.append(result)
        print(render_candidate(result), flush=True)
        write_json(report(), args.output)

    if not args.skip_scaling:
        for docs in args.scaling:
            for name in args.scaling_layouts:
                scaled = measure_scaling(
                    spark,
                    chosen(name),
                    str(work_dir / f"scaling-{name}-{docs}"),
                    docs=docs,
                    changes=args.changes,
                    progress=progress,
                )
                scaling.append(scaled)
                print(render_scaling([scaled]), flush=True)
                write_json(report(), args.output)

    final = report()
    write_json(final, args.output)
    print("\n== summary ==")
    print(render_summary(final.candidates))
    for candidate in final.candidates:
        print()
        print(render_candidate(candidate))
    if final.scaling:
        print("\n== scaling: one MERGE of the same mix, twice, per table size ==")
        print(render_scaling(final.scaling))
    print(
        f"\nload average at start {final.load_start}, at end {final.load_end}; "
        f"JSON written to {args.output}",
        flush=True,
    )
    spark.stop()
    failed = [c.layout for c in final.candidates if c.error] + [
        f"{s.layout}@{s.docs}" for s in final.scaling if s.error
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
