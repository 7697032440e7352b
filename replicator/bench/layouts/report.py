"""What the layout comparison measured: one result type per step and run, their printed
tables, and the whole run's JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

LoadAvg = tuple[float, float, float]

MERGE_METRICS = (
    "numTargetFilesAdded",
    "numTargetFilesRemoved",
    "numTargetRowsCopied",
    "numTargetDeletionVectorsAdded",
    "numTargetChangeFilesAdded",
    "executionTimeMs",
    "scanTimeMs",
    "rewriteTimeMs",
)
"""The MERGE operationMetrics the printed tables show (the JSON keeps all of them)."""


@dataclass(frozen=True, slots=True)
class Clock:
    """The wall clock of one measurement and the load average at its start and end."""

    seconds: float
    load_start: LoadAvg
    load_end: LoadAvg


@dataclass(frozen=True, slots=True)
class TableFiles:
    """What `DeltaTable.detail()` says of a table at one moment."""

    files: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class BuildResult:
    """A table created and filled with `rows` rows in `appends` appends."""

    rows: int
    appends: int
    clock: Clock
    table: TableFiles


@dataclass(frozen=True, slots=True)
class ChangeMix:
    """The source rows of one MERGE, by what they do to the table."""

    updates: int
    inserts: int
    deletes: int

    @property
    def rows(self) -> int:
        return self.updates + self.inserts + self.deletes


@dataclass(frozen=True, slots=True)
class MergeResult:
    """One MERGE: its source, clock, operationMetrics and the table's files after it."""

    label: str
    mix: ChangeMix
    vbuckets: int
    condition_head: str
    clock: Clock
    metrics: Mapping[str, int]
    table: TableFiles


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """One OPTIMIZE; `min_file_size` None means Delta's default (or clustering)."""

    label: str
    min_file_size: int | None
    committed: bool
    clock: Clock
    before: TableFiles
    after: TableFiles
    metrics: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class RowCheck:
    """Live rows counted against the rows the changes should have left."""

    stage: str
    expected_rows: int
    rows: int


@dataclass(frozen=True, slots=True)
class GeneratedCheck:
    """Rows of `groups16` whose `vbucket_group` Delta left null or wrong (both should be 0)."""

    stage: str
    rows: int
    merge_inserted_rows: int
    null_groups: int
    wrong_groups: int


@dataclass(frozen=True, slots=True)
class CandidateResult:
    """Everything measured on one layout; `error` set when a step failed (the rest is partial)."""

    layout: str
    build: BuildResult | None = None
    merges: tuple[MergeResult, ...] = ()
    compactions: tuple[CompactionResult, ...] = ()
    rollback: MergeResult | None = None
    restore_seconds: float | None = None
    row_checks: tuple[RowCheck, ...] = ()
    generated_checks: tuple[GeneratedCheck, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ScalingResult:
    """One layout at one size: the build and two MERGE batches of the same mix."""

    layout: str
    docs: int
    build: BuildResult | None = None
    merges: tuple[MergeResult, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class LayoutsReport:
    """A whole run, as written to JSON."""

    started_at: str
    finished_at: str
    docs: int
    changes: int
    batches: int
    doc_bytes: float
    cpu_count: int | None
    driver_memory: str
    spark_conf: Mapping[str, str]
    load_start: LoadAvg
    load_end: LoadAvg
    candidates: tuple[CandidateResult, ...]
    scaling: tuple[ScalingResult, ...] = field(default_factory=tuple)


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _load(clock: Clock) -> str:
    return f"{clock.load_start[0]:.2f}->{clock.load_end[0]:.2f}"


MERGE_HEADER = (
    f"{'':24} {'secs':>7} {'+files':>7} {'-files':>7} {'copied':>7} {'DVs':>5} {'cdc':>5} "
    f"{'execMs':>7} {'scanMs':>7} {'rwMs':>7} {'files':>6} {'load1':>11}"
)


def _merge_line(merge: MergeResult) -> str:
    m = merge.metrics

    def g(key: str) -> str:
        return str(m[key]) if key in m else "-"

    return (
        f"{merge.label:24} {merge.clock.seconds:7.1f} {g('numTargetFilesAdded'):>7} "
        f"{g('numTargetFilesRemoved'):>7} {g('numTargetRowsCopied'):>7} "
        f"{g('numTargetDeletionVectorsAdded'):>5} {g('numTargetChangeFilesAdded'):>5} "
        f"{g('executionTimeMs'):>7} {g('scanTimeMs'):>7} {g('rewriteTimeMs'):>7} "
        f"{merge.table.files:>6} {_load(merge.clock):>11}"
    )


def _compaction_line(c: CompactionResult) -> str:
    added = c.metrics.get("numAddedFiles", c.metrics.get("numFilesAdded", 0))
    removed = c.metrics.get("numRemovedFiles", c.metrics.get("numFilesRemoved", 0))
    dvs = c.metrics.get("numDeletionVectorsRemoved")
    return (
        f"{c.label:28} {c.clock.seconds:7.1f} s  files {c.before.files} -> {c.after.files} "
        f"(+{added} -{removed}{'' if dvs is None else f', DVs removed {dvs}'})  "
        f"{_mb(c.before.size_bytes)} -> {_mb(c.after.size_bytes)}"
        f"{'' if c.committed else '  (no commit)'}  load {_load(c.clock)}"
    )


def render_candidate(result: CandidateResult) -> str:
    lines = [f"== {result.layout} =="]
    if result.build is not None:
        b = result.build
        lines.append(
            f"build: {b.rows} rows in {b.appends} appends: {b.clock.seconds:.1f} s, "
            f"{b.table.files} files, {_mb(b.table.size_bytes)}  load {_load(b.clock)}"
        )
    if result.merges or result.rollback is not None:
        lines.append(MERGE_HEADER)
        for merge in result.merges:
            lines.append(_merge_line(merge))
        if result.rollback is not None:
            lines.append(_merge_line(result.rollback))
            mix = result.rollback.mix
            lines.append(
                f"{'':24} rollback source: {mix.updates} updates, {mix.deletes} deletes, "
                f"{mix.inserts} inserts; condition {result.rollback.condition_head}"
            )
    for compaction in result.compactions:
        lines.append(_compaction_line(compaction))
    if result.restore_seconds is not None:
        lines.append(f"(restore before the default compaction: {result.restore_seconds:.1f} s)")
    for check in result.row_checks:
        verdict = "ok" if check.rows == check.expected_rows else "MISMATCH"
        lines.append(f"rows {check.stage}: {check.rows} (expected {check.expected_rows}) {verdict}")
    for g in result.generated_checks:
        lines.append(
            f"vbucket_group {g.stage}: {g.rows} rows ({g.merge_inserted_rows} MERGE-inserted), "
            f"null {g.null_groups}, wrong {g.wrong_groups}"
        )
    if result.error:
        lines.append(f"ERROR: {result.error}")
    return "\n".join(lines)


def render_summary(candidates: Sequence[CandidateResult]) -> str:
    lines = [
        f"{'layout':14} {'build s':>8} {'files':>6} {'merge1 s':>9} {'merge2 s':>9} "
        f"{'merge3 s':>9} {'files':>6} {'compact s':>10} {'files':>12} {'rollbk s':>9} "
        f"{'+/-files':>9}"
    ]
    for c in candidates:
        build = (
            f"{c.build.clock.seconds:8.1f} {c.build.table.files:>6}" if c.build else f"{'-':>15}"
        )
        merges = [f"{m.clock.seconds:9.1f}" for m in c.merges] + [f"{'-':>9}"] * 3
        files = f"{c.merges[-1].table.files:>6}" if c.merges else f"{'-':>6}"
        if c.compactions:
            first = c.compactions[0]
            compacted = (
                f"{first.clock.seconds:10.1f} {f'{first.before.files}->{first.after.files}':>12}"
            )
        else:
            compacted = f"{'-':>10} {'-':>12}"
        if c.rollback is not None:
            m = c.rollback.metrics
            touched = f"+{m.get('numTargetFilesAdded', 0)}/-{m.get('numTargetFilesRemoved', 0)}"
            rollback = f"{c.rollback.clock.seconds:9.1f} {touched:>9}"
        else:
            rollback = f"{'-':>9} {'-':>9}"
        lines.append(f"{c.layout:14} {build} {' '.join(merges[:3])} {files} {compacted} {rollback}")
    return "\n".join(lines)


def render_scaling(results: Sequence[ScalingResult]) -> str:
    lines = [
        f"{'layout':14} {'docs':>9} {'build s':>8} {'files':>6} {'size':>10}  " + MERGE_HEADER
    ]
    for r in results:
        head = f"{r.layout:14} {r.docs:>9} "
        if r.build is not None:
            head += (
                f"{r.build.clock.seconds:8.1f} {r.build.table.files:>6} "
                f"{_mb(r.build.table.size_bytes):>10}"
            )
        else:
            head += f"{'-':>26}"
        if not r.merges:
            lines.append(head + ("  ERROR: " + r.error if r.error else ""))
        for index, merge in enumerate(r.merges):
            prefix = head if index == 0 else " " * len(head)
            lines.append(f"{prefix}  {_merge_line(merge)}")
        if r.merges and r.error:
            lines.append(f"{' ' * len(head)}  ERROR: {r.error}")
    return "\n".join(lines)


def write_json(report: LayoutsReport, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_suffix(output.suffix + ".tmp")
    temporary.write_text(json.dumps(asdict(report), indent=2) + "\n")
    temporary.replace(output)
