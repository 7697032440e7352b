"""The performance goals (2 cores) and their PASS/MISS verdicts, from measured results (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from replicator.bench.catch_up import CatchUpResult
from replicator.bench.drain import DrainResult
from replicator.bench.memory import MemoryResult
from replicator.bench.read_side import COMMANDS as READ_SIDE_COMMANDS
from replicator.bench.read_side import ReadSideResult
from replicator.bench.rollback import RollbackResult
from replicator.bench.steady_state import SteadyStateResult

DECODE_GOAL_MSGS_PER_S = 200_000
DRAIN_GOAL_RATIO = 1.0
DRAIN_CPU_GOAL_RATIO = 2.0
LOAD_RATIO_GOAL = 0.8
STEADY_GOAL_RATE = 20_000
STEADY_GOAL_P99_MS = 5_000.0
PEAK_RSS_GOAL_MIB = 2048.0
CATCH_UP_GOAL_S = 10.0
FILES_GOAL_RATIO = 4.0
FILES_GOAL_WINDOW_S = 1800.0
READ_SIDE_GOAL_S = 2.0


@dataclass(frozen=True, slots=True)
class GoalCheck:
    """One goal: what it asks, what was measured, and whether it was met.

    `passed` is None when the measurement it needs did not run (reported as NOT RUN).
    """

    goal: str
    measured: str
    passed: bool | None

    @property
    def verdict(self) -> str:
        """PASS, MISS, or NOT RUN."""
        return "NOT RUN" if self.passed is None else "PASS" if self.passed else "MISS"


def evaluate_goals(
    *,
    drain: DrainResult | None,
    load_ratio: float | None,
    steady: Sequence[SteadyStateResult],
    memory: MemoryResult | None,
    rollback: RollbackResult | None,
    catch_up: CatchUpResult | None = None,
    read_side: ReadSideResult | None = None,
) -> tuple[GoalCheck, ...]:
    """Judge every goal against the results (None / empty: that measurement did not run)."""
    return (
        _codec(drain),
        _drain(drain),
        _drain_cpu(drain),
        _load(load_ratio),
        _steady(steady),
        _files(steady),
        _memory(memory),
        _rollback(rollback),
        _catch_up(catch_up),
        *(_read_side(read_side, " ".join(command)) for command in READ_SIDE_COMMANDS),
    )


def _read_side(result: ReadSideResult | None, command: str) -> GoalCheck:
    goal = (
        f"`replicator {command}` answers in <= {READ_SIDE_GOAL_S:g} s wall clock, nothing on "
        "stderr (1M rows, 1024 vbuckets, 500 versions)"
    )
    timing = result.timing(command, "delta-rs") if result is not None else None
    if result is None or timing is None:
        return GoalCheck(goal, "-", None)
    spark = result.timing(command, "spark")
    measured = (
        f"median {timing.median_s:.2f} s of {len(timing.seconds)} runs on {result.rows:,} rows, "
        f"{result.vbuckets} vbuckets, {result.versions} versions; "
        + ("quiet" if timing.quiet else "printed to stderr")
        + (f"; Spark engine {spark.median_s:.1f} s" if spark is not None else "")
    )
    passed = timing.answered and timing.quiet and timing.median_s <= READ_SIDE_GOAL_S
    return GoalCheck(goal, measured, passed)


def _catch_up(result: CatchUpResult | None) -> GoalCheck:
    goal = f"until-caught-up run with changes pending commits and exits in <= {CATCH_UP_GOAL_S:g} s"
    if result is None:
        return GoalCheck(goal, "-", None)
    measured = (
        f"{result.seconds:.1f} s for {result.changes:,} changes over {result.vbuckets} vbuckets "
        f"({result.table_versions} table versions, {result.spark_jobs} Spark jobs)"
    )
    return GoalCheck(goal, measured, result.caught_up and result.seconds <= CATCH_UP_GOAL_S)


def _codec(drain: DrainResult | None) -> GoalCheck:
    return _decode_rate(
        f"codec decodes >= {DECODE_GOAL_MSGS_PER_S:,} msgs/s (1 KiB docs, per CPU second)",
        None if drain is None else drain.codec_messages_per_cpu_second,
    )


def _drain(drain: DrainResult | None) -> GoalCheck:
    goal = (
        f"protocol layer drains >= {DRAIN_GOAL_RATIO:g}x the Java DCP client's documents/s "
        "(wall clock, same producer)"
    )
    if drain is None:
        return GoalCheck(goal, "-", None)
    if drain.reference is None:
        return GoalCheck(goal, f"no reference ({drain.reference_unavailable})", None)
    ratio = drain.documents_per_second / drain.reference.documents_per_second
    measured = (
        f"{ratio:.2f}x: {drain.documents_per_second:,.0f} against "
        f"{drain.reference.documents_per_second:,.0f} documents/s"
    )
    return GoalCheck(goal, measured, ratio >= DRAIN_GOAL_RATIO)


def _drain_cpu(drain: DrainResult | None) -> GoalCheck:
    goal = f"consumer CPU per document <= {DRAIN_CPU_GOAL_RATIO:g}x the Java DCP client's"
    if drain is None:
        return GoalCheck(goal, "-", None)
    if drain.reference is None:
        return GoalCheck(goal, f"no reference ({drain.reference_unavailable})", None)
    ours = 1e6 / drain.documents_per_cpu_second
    theirs = 1e6 / drain.reference.documents_per_cpu_second
    measured = f"{ours / theirs:.2f}x: {ours:.1f} against {theirs:.1f} CPU us per document"
    return GoalCheck(goal, measured, ours / theirs <= DRAIN_CPU_GOAL_RATIO)


def _decode_rate(goal: str, rate: float | None) -> GoalCheck:
    if rate is None:
        return GoalCheck(goal, "-", None)
    return GoalCheck(goal, f"{rate:,.0f} msgs/s", rate >= DECODE_GOAL_MSGS_PER_S)


def _load(ratio: float | None) -> GoalCheck:
    goal = f"initial load >= {LOAD_RATIO_GOAL} x plain Arrow append"
    if ratio is None:
        return GoalCheck(goal, "-", None)
    return GoalCheck(goal, f"{ratio:.2f} x", ratio >= LOAD_RATIO_GOAL)


def _steady(results: Sequence[SteadyStateResult]) -> GoalCheck:
    lag_goal = f"p99 lag <= {STEADY_GOAL_P99_MS / 1000:g} s"
    if not results:
        return GoalCheck(f"{STEADY_GOAL_RATE:,} mutations/s sustained, {lag_goal}", "-", None)
    top = max(results, key=lambda r: r.offered_rate)
    scaled = "" if top.offered_rate >= STEADY_GOAL_RATE else " (highest rate of this preset)"
    goal = f"{top.offered_rate:,.0f} mutations/s sustained, {lag_goal}{scaled}"
    p99 = f"p99 {top.lag.p99_ms / 1000:.2f} s" if top.lag.rows else "lag not measured"
    measured = f"applied {top.applied_rate:,.0f}/s, committed {top.committed_rate:,.0f}/s, {p99}"
    if not top.producer_kept_pace:
        measured += " (producer fell short of the offered rate)"
    if top.received_short:
        measured += f" (received {top.delivered_rate or 0:,.0f}/s: a backlog before staging)"
    passed = (
        top.producer_kept_pace
        and top.keeps_up
        and top.lag.rows > 0
        and top.lag.p99_ms <= STEADY_GOAL_P99_MS
    )
    return GoalCheck(goal, measured, passed)


def _files(results: Sequence[SteadyStateResult]) -> GoalCheck:
    goal = f"data files <= {FILES_GOAL_RATIO:g}x a full OPTIMIZE's after a steady run"
    measured_runs = [r for r in results if r.files_ratio is not None]
    if not measured_runs:
        return GoalCheck(goal, "-", None)
    longest = max(measured_runs, key=lambda r: r.window_seconds)
    if longest.window_seconds < FILES_GOAL_WINDOW_S:
        goal += (
            f" (window {longest.window_seconds:.0f} s, not {FILES_GOAL_WINDOW_S / 60:.0f} min)"
        )
    ratio = longest.files_ratio
    assert ratio is not None
    measured = (
        f"{longest.data_files:,} files, {longest.files_after_optimize:,} after OPTIMIZE "
        f"({ratio:.1f}x) at {longest.offered_rate:,.0f}/s"
    )
    return GoalCheck(goal, measured, ratio <= FILES_GOAL_RATIO)


def _memory(memory: MemoryResult | None) -> GoalCheck:
    goal = f"peak RSS <= {PEAK_RSS_GOAL_MIB / 1024:.0f} GiB (Python driver and JVM, each)"
    if memory is None:
        return GoalCheck(goal, "-", None)
    measured = (
        f"Python {memory.python_peak_rss_mib:,.0f} MiB, JVM {memory.jvm_peak_rss_mib:,.0f} MiB"
    )
    passed = (
        memory.complete
        and memory.python_peak_rss_mib <= PEAK_RSS_GOAL_MIB
        and memory.jvm_peak_rss_mib <= PEAK_RSS_GOAL_MIB
    )
    return GoalCheck(goal, measured, passed)


ROLLBACK_GOAL_S = 5.0


def _rollback(rollback: RollbackResult | None) -> GoalCheck:
    goal = (
        f"one-vbucket rollback <= {ROLLBACK_GOAL_S:g} s, touching only files that hold its rows"
    )
    if rollback is None:
        return GoalCheck(goal, "-", None)
    measured = (
        f"{rollback.seconds:.1f} s on {rollback.table_rows:,} rows; "
        f"{rollback.files_added} added, {rollback.files_removed} removed, "
        f"{rollback.change_data_files} cdc, {rollback.rows_copied:,} rows copied; "
        f"{'only' if rollback.files_only_holding_vbucket else 'NOT only'} files holding "
        f"vbucket {rollback.vbucket}"
    )
    return GoalCheck(
        goal,
        measured,
        rollback.files_only_holding_vbucket
        and rollback.rows_restored
        and rollback.seconds <= ROLLBACK_GOAL_S,
    )
