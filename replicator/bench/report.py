"""A benchmark run's report: one frozen record, a table for people, JSON for machines (pure
formatting: nothing here measures)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replicator.bench.catch_up import CatchUpResult
from replicator.bench.drain import DrainResult
from replicator.bench.goals import GoalCheck
from replicator.bench.initial_load import InitialLoadResult
from replicator.bench.machine import MachineDescription
from replicator.bench.memory import MemoryResult
from replicator.bench.plain_append import PlainAppendResult
from replicator.bench.read_side import ReadSideResult
from replicator.bench.rollback import RollbackResult
from replicator.bench.serve import ServeResult
from replicator.bench.steady_state import SteadyStateResult
from replicator.bench.transactions import TransactionSourceResult

SECTIONS = (
    "serve", "drain", "initial_load", "plain_append", "steady_state", "memory", "rollback",
    "catch_up", "read_side", "transactions",
)  # fmt: skip
"""The measurements of a run, in the order they run and print."""


@dataclass(frozen=True, slots=True)
class BenchReport:
    """Everything one `jobs/bench.py` run measured. A section is None when it failed; the
    reason is in `failures` under the section's name. `section_seconds` is each section's
    wall time, setup included."""

    preset: str
    started_at: str
    docs: int
    doc_size: int
    vbuckets: int
    machine: MachineDescription
    serve: ServeResult | None
    drain: DrainResult | None
    initial_load: InitialLoadResult | None
    plain_append: PlainAppendResult | None
    load_ratio: float | None
    steady_state: tuple[SteadyStateResult, ...]
    memory: MemoryResult | None
    rollback: RollbackResult | None
    goals: tuple[GoalCheck, ...]
    load_average_at_end: tuple[float, float, float]
    seconds: float
    failures: Mapping[str, str] = field(default_factory=dict)
    section_seconds: Mapping[str, float] = field(default_factory=dict)
    catch_up: CatchUpResult | None = None
    read_side: ReadSideResult | None = None
    transactions: TransactionSourceResult | None = None


def load_ratio(initial: InitialLoadResult | None, plain: PlainAppendResult | None) -> float | None:
    """Initial load rows/s divided by plain-append rows/s (None unless both ran)."""
    if initial is None or plain is None or not plain.rows_per_second:
        return None
    return initial.rows_per_second / plain.rows_per_second


def report_json(report: BenchReport) -> dict[str, Any]:
    """The report as a JSON-ready dict (goal verdicts included)."""
    document = dataclasses.asdict(report)
    document["goals"] = [
        {**dataclasses.asdict(goal), "verdict": goal.verdict} for goal in report.goals
    ]
    document["failures"] = dict(report.failures)
    document["section_seconds"] = dict(report.section_seconds)
    return document


def write_report(report: BenchReport, output_dir: str | Path) -> tuple[Path, Path]:
    """Write bench-<timestamp>.json and latest.json into `output_dir`; return both paths."""
    directory = Path(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report_json(report), indent=2, sort_keys=False) + "\n"
    stamp = report.started_at.replace(":", "").replace("-", "").split(".")[0]
    dated = directory / f"bench-{stamp}.json"
    latest = directory / "latest.json"
    dated.write_text(text)
    latest.write_text(text)
    return dated, latest


def _rate(value: float) -> str:
    return f"{value:,.0f}"


def lag_text(st: SteadyStateResult) -> str:
    """The steady state's lag, drain and warm-up, as the report's detail column says them."""
    if st.lag.rows == 0:
        lag = "lag not measured: no change of the window was committed"
    else:
        lag = (
            f"lag p50 {st.lag.p50_ms / 1000:.2f} s, p99 {st.lag.p99_ms / 1000:.2f} s, "
            f"max {st.lag.max_ms / 1000:.2f} s ({st.lag.rows:,} rows); p50 first/last quarter "
            f"{st.lag_first_quarter.p50_ms / 1000:.2f}/{st.lag_last_quarter.p50_ms / 1000:.2f} s"
        )
    drained = (
        "not drained within the catch-up timeout"
        if st.drained_after_s is None
        else f"drained {st.drained_after_s:.1f} s after the window"
    )
    warm = "" if st.warmed_up else "; never caught up before the window"
    loading = ""
    if st.vbuckets_loading_at_start and st.lag_loaded_vbuckets is not None:
        rest = st.lag_loaded_vbuckets
        loading = (
            f"; {st.vbuckets_loading_at_start} vbuckets still in their first load when the "
            f"window opened; the others' rows: lag p50 {rest.p50_ms / 1000:.2f} s, "
            f"p99 {rest.p99_ms / 1000:.2f} s ({rest.rows:,} rows)"
        )
    delivered = ""
    if st.received_short:
        delivered = (
            f"; received {st.delivered_rate or 0:,.0f}/s of the {st.applied_rate:,.0f}/s written "
            f"({st.undelivered_at_end or 0:,} written but not yet received at the end)"
        )
    return f"{lag}; {drained}{warm}{loading}{delivered}"


def measurement_rows(report: BenchReport) -> list[tuple[str, str, str]]:
    """(measurement, result, detail) rows, in the order the measurements ran."""
    rows: list[tuple[str, str, str]] = []
    size = f"{report.docs:,} x {report.doc_size} B docs, {report.vbuckets} vbuckets"
    if report.serve is not None:
        s = report.serve
        rows.append((
            "1. producer serve rate (counting client)",
            f"{_rate(s.messages_per_second)} msgs/s",
            f"{s.megabytes_per_second:.1f} MB/s; {s.messages:,} msgs in {s.seconds:.1f} s; {size}",
        ))
    if report.drain is not None:
        d = report.drain
        served = ""
        if report.serve is not None:
            served = f"; {d.messages_per_second / report.serve.messages_per_second:.2f} of serve"
        rows.append((
            "2. protocol-layer drain (DcpClient, decode)",
            f"{_rate(d.messages_per_second)} msgs/s",
            f"{d.megabytes_per_second:.1f} MB/s{served}; {d.messages / d.cpu_seconds:,.0f} msgs "
            f"per consumer CPU s; {d.rounds} rounds; codec alone "
            f"{_rate(d.codec_messages_per_cpu_second)} msgs/CPU s",
        ))
        ref = d.reference
        rows.append((
            "2. reference: Java DCP client, same producer",
            "-" if ref is None else f"{_rate(ref.documents_per_second)} docs/s",
            (d.reference_unavailable or "-") if ref is None else (
                f"{ref.client}, {d.rounds} rounds alternating with DcpClient; "
                f"{_rate(ref.documents_per_cpu_second)} docs per JVM CPU s; DcpClient "
                f"{_rate(d.documents_per_second)} docs/s, "
                f"{_rate(d.documents_per_cpu_second)} per CPU s"
            ),
        ))
    if report.initial_load is not None:
        i = report.initial_load
        rows.append((
            "3. initial load, end to end",
            f"{_rate(i.rows_per_second)} rows/s",
            f"{i.rows_in_mirror:,} rows in {i.seconds:.1f} s, {i.commits} commits, "
            f"{i.spark_jobs} Spark jobs, "
            f"complete={i.complete}; CPU: Python {i.python_cpu_seconds:.0f} s, "
            f"JVM {i.jvm_cpu_seconds:.0f} s"
            + (f"; after an untimed JVM warm-up of {i.jvm_warmup_seconds:.0f} s"
               if i.jvm_warmup_seconds else ""),
        ))
    if report.plain_append is not None:
        p = report.plain_append
        rows.append((
            "4. plain Arrow append, same rows",
            f"{_rate(p.rows_per_second)} rows/s",
            f"{p.rows:,} rows ({p.arrow_bytes / 1e6:,.0f} MB Arrow) in {p.seconds:.1f} s, "
            f"{p.appends} appends; CPU: Python {p.python_cpu_seconds:.0f} s, "
            f"JVM {p.jvm_cpu_seconds:.0f} s",
        ))
    if report.load_ratio is not None:
        rows.append(("   initial load / plain append", f"{report.load_ratio:.2f}", ""))
    for st in report.steady_state:
        rows.append((
            f"5. steady state, offered {_rate(st.offered_rate)}/s",
            f"{_rate(st.committed_rate)}/s committed",
            f"applied {_rate(st.applied_rate)}/s over {st.window_seconds:.0f} s; {lag_text(st)}; "
            f"keeps up: {'yes' if st.keeps_up else 'NO'}; files {st.data_files:,} "
            f"({st.files_after_optimize:,} after a full OPTIMIZE)",
        ))
    if report.memory is not None:
        m = report.memory
        rows.append((
            "6. peak RSS, 1 vbucket, snapshot "
            f"{m.snapshot_megabytes / m.memory_budget_mb:.0f} x budget",
            f"Python {m.python_peak_rss_mib:,.0f} MiB / JVM {m.jvm_peak_rss_mib:,.0f} MiB",
            f"budget {m.memory_budget_mb} MB, snapshot {m.snapshot_megabytes:,.0f} MB "
            f"({m.snapshot_docs:,} docs) in {m.seconds:.1f} s; staged in memory at most "
            f"{m.peak_staged_mib:.1f} MiB; "
            f"complete={m.complete}",
        ))
    if report.rollback is not None:
        r = report.rollback
        rows.append((
            "7. one-vbucket rollback",
            f"{r.seconds:.1f} s",
            f"vbucket {r.vbucket} ({r.vbucket_rows:,} rows) seqno {r.from_seqno} -> {r.to_seqno}"
            f" on {r.table_rows:,} rows / {r.table_files:,} files; files +{r.files_added} "
            f"-{r.files_removed} cdc {r.change_data_files}; only files holding it: "
            f"{r.files_only_holding_vbucket}; rows copied {r.rows_copied:,}; "
            f"rows restored: {r.rows_restored}",
        ))
    if report.catch_up is not None:
        c = report.catch_up
        rows.append((
            f"8. until-caught-up run, {c.changes:,} changes pending",
            f"{c.seconds:.1f} s",
            f"{c.items_committed:,} changes committed over {c.vbuckets} vbuckets on a mirror of "
            f"{c.docs:,} docs; {c.table_versions} table versions, {c.spark_jobs} Spark jobs; "
            f"caught up: {c.caught_up}",
        ))
    if report.read_side is not None:
        rows.extend(_read_side_rows(report.read_side))
    if report.transactions is not None:
        t = report.transactions
        runs = [t.log] if t.queue is None else [t.log, t.queue]
        for run in runs:
            rows.append((
                f"10. Drizzle transactions from the {run.source}",
                f"{run.transactions_per_second:,.0f} tx/s",
                f"{run.rows_per_second:,.0f} row changes/s; {run.transactions:,} transactions "
                f"({run.rows:,} row changes) of {t.produced:,} produced in {run.seconds:.1f} s, "
                f"{run.groups} groups, {run.table_commits} table commits",
            ))
        if t.queue_skipped:
            rows.append(("10. Drizzle transactions from the queue", "skipped", t.queue_skipped))
    return rows


def _read_side_rows(result: ReadSideResult) -> list[tuple[str, str, str]]:
    mirror = (
        f"{result.rows:,} rows, {result.vbuckets} vbuckets, {result.versions} versions, "
        f"{result.checkpoint_rows:,} checkpoint rows, {result.rollbacks} rollbacks "
        f"(history grown in {result.build_s:.0f} s)"
    )
    rows = []
    for timing in result.timings:
        runs = ", ".join(f"{s:.2f}" for s in timing.seconds)
        said = "quiet" if timing.quiet else f"stderr: {timing.stderr.strip().splitlines()[0][:80]}"
        rows.append((
            f"9. `{timing.command}` ({timing.engine})",
            f"{timing.median_s:.2f} s",
            f"runs {runs} s; exit {timing.exit_code}; {said}; on {mirror}",
        ))
    return rows


def render_table(report: BenchReport) -> str:
    """The report as aligned text: machine, measurements, goals, failures."""
    lines = [
        f"replicator benchmark, preset {report.preset}, started {report.started_at} "
        f"({report.seconds:.0f} s)",
        f"machine: {report.machine.one_line()}",
        "load average at start / end: "
        + " ".join(f"{v:.2f}" for v in report.machine.load_average_at_start)
        + " / "
        + " ".join(f"{v:.2f}" for v in report.load_average_at_end),
        "",
    ]
    rows = measurement_rows(report)
    if rows:
        name_width = max(len(r[0]) for r in rows)
        value_width = max(len(r[1]) for r in rows)
        for name, value, detail in rows:
            lines.append(f"{name:<{name_width}}  {value:>{value_width}}  {detail}".rstrip())
    lines.append("")
    goal_width = max((len(g.goal) for g in report.goals), default=0)
    for goal in report.goals:
        lines.append(f"[{goal.verdict:>7}] {goal.goal:<{goal_width}}  {goal.measured}")
    if report.section_seconds:
        lines.append(
            "section wall times: "
            + ", ".join(f"{name} {secs:.0f} s" for name, secs in report.section_seconds.items())
        )
    for section, reason in report.failures.items():
        lines.append(f"FAILED {section}: {reason}")
    return "\n".join(lines)


def render_markdown(report: BenchReport) -> str:
    """A markdown table for the README's Performance section."""
    lines = [
        f"Machine: {report.machine.one_line()}. Load average during the run: "
        f"{report.machine.load_average_at_start[0]:.1f} at start, "
        f"{report.load_average_at_end[0]:.1f} at end. Preset `{report.preset}`.",
        "",
        "| Measurement | Result | Detail |",
        "|---|---|---|",
    ]
    for name, value, detail in measurement_rows(report):
        lines.append(f"| {name.strip()} | {value} | {detail} |")
    lines += ["", "| Goal | Measured | Verdict |", "|---|---|---|"]
    for goal in report.goals:
        lines.append(f"| {goal.goal} | {goal.measured} | {goal.verdict} |")
    return "\n".join(lines)
