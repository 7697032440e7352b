"""The benchmark suite still works: the smoke preset end to end, and the verdict logic.

Speeds are never asserted here (benchmarks are not timed tests): only that every measurement
ran, that the JSON report parses with every section present, and that its numbers are sane.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replicator.bench.drain import DrainResult
from replicator.bench.goals import GoalCheck, evaluate_goals
from replicator.bench.memory import MemoryResult
from replicator.bench.presets import PRESETS
from replicator.bench.report import (
    SECTIONS,
    BenchReport,
    lag_text,
    render_markdown,
    render_table,
)
from replicator.bench.report import write_report as write_bench_report
from replicator.bench.rollback import RollbackResult, commit_file_actions
from replicator.bench.steady_state import LagPercentiles, SteadyStateResult, committed_rate_over
from replicator.bench.suite import run_suite
from replicator.bench.transactions import WORKLOAD
from replicator.drizzle.workload import Workload


@pytest.fixture(scope="module")
def smoke_run(
    spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BenchReport, dict[str, Any], Path]]:
    """One run of the smoke preset on the shared session, its JSON read back from disk."""
    output = tmp_path_factory.mktemp("bench-output")
    report = run_suite(
        PRESETS["smoke"],
        spark=spark,
        work_dir=str(tmp_path_factory.mktemp("bench-work")),
        announce=lambda _message: None,
    )
    dated, latest = write_bench_report(report, output)
    yield report, json.loads(latest.read_text()), dated


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_smoke_run_measures_every_section(
    smoke_run: tuple[BenchReport, dict[str, Any], Path],
) -> None:
    _, document, dated = smoke_run
    assert document["failures"] == {}
    for section in SECTIONS:
        assert document[section], f"section {section} is missing"
    assert json.loads(dated.read_text()) == document
    assert document["preset"] == "smoke"
    assert document["machine"]["cores"] > 0 and document["machine"]["spark"].startswith("4.")
    assert [goal["verdict"] for goal in document["goals"]] != []
    assert {goal["verdict"] for goal in document["goals"]} <= {"PASS", "MISS"}


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_smoke_numbers_are_sane(smoke_run: tuple[BenchReport, dict[str, Any], Path]) -> None:
    _, document, _ = smoke_run
    preset = PRESETS["smoke"]
    assert document["serve"]["messages"] >= preset.docs
    assert document["serve"]["messages_per_second"] > 0
    assert document["drain"]["documents"] == preset.docs
    assert document["drain"]["messages_per_second"] > 0
    assert document["drain"]["codec_messages_per_cpu_second"] > 0
    load = document["initial_load"]
    assert load["complete"] and load["rows_in_mirror"] == preset.docs
    assert load["rows_per_second"] > 0
    assert load["jvm_warmup_seconds"] > 0  # the warm-up ran, into a mirror of its own
    assert document["plain_append"]["rows"] == preset.docs
    assert document["plain_append"]["rows_per_second"] > 0
    assert 0 < document["load_ratio"] < 10
    (steady,) = document["steady_state"]
    assert steady["applied_rate"] > 0 and steady["committed_rate"] > 0
    assert steady["lag"]["rows"] > 0
    assert 0 <= steady["lag"]["p50_ms"] <= steady["lag"]["p99_ms"] <= steady["lag"]["max_ms"]
    # The rows of vbuckets loaded before the window are some of the window's rows, all of them
    # when no vbucket was still in its first load.
    loading, loaded = steady["vbuckets_loading_at_start"], steady["lag_loaded_vbuckets"]
    assert 0 <= loading < preset.vbuckets
    assert 0 < loaded["rows"] <= steady["lag"]["rows"]
    if loading == 0:
        assert loaded == steady["lag"]
    # What the replicator received over the window, sampled on its thread; never more than
    # the producer had written by the window's end.
    assert steady["delivered_rate"] > 0
    assert steady["undelivered_at_end"] >= 0
    transactions = document["transactions"]
    committed = sum(
        1 for t in Workload(WORKLOAD).transactions(preset.drizzle_transactions) if t.committed
    )
    assert transactions["log"]["transactions"] == committed
    assert transactions["queue"]["transactions"] == committed
    assert transactions["log"]["rows"] == transactions["queue"]["rows"] > 0
    memory = document["memory"]
    assert memory["complete"] and memory["rows"] == preset.memory_docs
    assert memory["python_peak_rss_mib"] > 0 and memory["jvm_peak_rss_mib"] > 0
    assert memory["snapshot_megabytes"] >= preset.memory_snapshot_factor * preset.memory_budget_mb
    rollback = document["rollback"]
    assert rollback["files_only_holding_vbucket"] is True
    assert rollback["rows_copied"] == 0
    assert rollback["rows_restored"] is True
    assert rollback["files_added"] + rollback["files_removed"] > 0
    assert rollback["to_seqno"] < rollback["from_seqno"]
    read_side = document["read_side"]
    assert read_side["versions"] == preset.read_side_versions
    assert read_side["rows"] == preset.docs and read_side["vbuckets"] == preset.vbuckets
    assert read_side["checkpoint_rows"] >= preset.vbuckets * 2
    commands = {(t["command"], t["engine"]) for t in read_side["timings"]}
    assert commands == {
        ("status", "delta-rs"), ("audit rollbacks", "delta-rs"),
        ("audit as-of --version 1", "delta-rs"),
    }
    for timing in read_side["timings"]:
        # The answer and nothing else: no JVM, log4j or Python warning on stderr.
        assert timing["exit_code"] == 0 and timing["stderr"] == "", timing


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_smoke_report_renders_every_measurement(
    smoke_run: tuple[BenchReport, dict[str, Any], Path],
) -> None:
    report, _, _ = smoke_run
    table = render_table(report)
    markdown = render_markdown(report)
    for number in range(1, 10):
        assert f"\n{number}. " in table, f"measurement {number} missing from the table"
    assert report.machine.cpu_model in table and report.machine.cpu_model in markdown
    assert markdown.count("| PASS |") + markdown.count("| MISS |") == len(report.goals)


def test_committed_rate_spans_the_commits_bracketing_the_window() -> None:
    seconds = 1_000_000_000
    commits = [(0, 0), (10 * seconds, 1_000), (20 * seconds, 1_500), (30 * seconds, 2_000)]
    # Window 12..18 s: bracketed by the commits at 10 s and 20 s.
    assert committed_rate_over(commits, 12 * seconds, 18 * seconds) == 50.0
    assert committed_rate_over(commits, 0, 30 * seconds) == pytest.approx(2_000 / 30)
    assert committed_rate_over(commits[:1], 0, seconds) == 0.0


def test_a_rollback_that_removes_files_not_holding_the_vbucket_fails_the_check() -> None:
    entry = "\n".join(
        json.dumps(action)
        for action in (
            {"commitInfo": {"operation": "MERGE",
                            "operationMetrics": {"numTargetRowsCopied": "0"}}},
            {"add": {"path": "vbucket_group=5/part-0001.parquet"}},
            {"remove": {"path": "vbucket_group%3D5/part-0000.parquet"}},
            {"cdc": {"path": "_change_data/vbucket_group=5/cdc-0000.parquet"}},
        )
    )  # fmt: skip
    actions = commit_file_actions(entry)
    assert actions.removed == ("vbucket_group=5/part-0000.parquet",)
    assert actions.rows_copied() == 0
    holding = ["file:/t/vbucket_group=5/part-0000.parquet", "file:/t/vbucket_group=5/x.parquet"]
    assert actions.removed_only_from(holding)
    assert not actions.removed_only_from(["file:/t/vbucket_group=5/x.parquet"])
    stray = commit_file_actions(entry + '\n{"remove": {"path": "vbucket_group=6/p-9.parquet"}}')
    assert not stray.removed_only_from(holding)
    assert not commit_file_actions("").removed_only_from(holding)


def _steady(**overrides: Any) -> SteadyStateResult:
    lag = LagPercentiles(rows=100, p50_ms=800.0, p99_ms=2_000.0, max_ms=2_500.0)
    values: dict[str, Any] = {
        "offered_rate": 20_000.0, "applied_rate": 19_900.0, "committed_rate": 19_800.0,
        "warmed_up": True, "window_seconds": 30.0, "commits_in_window": 12, "lag": lag,
        "lag_first_quarter": lag, "lag_last_quarter": lag, "drained_after_s": 2.0,
        "producer_kept_pace": True, "lag_bounded": True, "keeps_up": True,
    }  # fmt: skip
    values.update(overrides)
    return SteadyStateResult(**values)


def test_the_lag_text_says_how_many_vbuckets_were_still_loading_and_the_others_lag() -> None:
    others = LagPercentiles(rows=90, p50_ms=1_500.0, p99_ms=4_250.0, max_ms=5_000.0)
    text = lag_text(_steady(vbuckets_loading_at_start=425, lag_loaded_vbuckets=others))
    assert "425 vbuckets still in their first load when the window opened" in text
    assert "the others' rows: lag p50 1.50 s, p99 4.25 s (90 rows)" in text
    assert "first load" not in lag_text(_steady(lag_loaded_vbuckets=others))


def test_the_lag_text_and_goal_say_when_the_replicator_received_less_than_was_written() -> None:
    short = _steady(delivered_rate=8_000.0, undelivered_at_end=350_000)
    assert "received 8,000/s of the 19,900/s written (350,000 written but not yet received" in (
        lag_text(short)
    )
    goals = evaluate_goals(drain=None, load_ratio=None, steady=[short], memory=None, rollback=None)
    (steady_goal,) = [g for g in goals if "mutations/s sustained" in g.goal]
    assert "received 8,000/s: a backlog before staging" in steady_goal.measured
    assert "received" not in lag_text(_steady(delivered_rate=19_500.0, undelivered_at_end=100))


def test_file_goal_judges_the_longest_steady_window() -> None:
    def files_goal(*steady: SteadyStateResult) -> tuple[str, str, str]:
        goals = evaluate_goals(
            drain=None, load_ratio=None, steady=steady, memory=None, rollback=None
        )
        (goal,) = [g for g in goals if "OPTIMIZE" in g.goal]
        return goal.verdict, goal.goal, goal.measured

    assert files_goal(_steady())[0] == "NOT RUN"  # no file count measured
    healthy = _steady(window_seconds=1800.0, data_files=60, files_after_optimize=16)
    crowded = _steady(window_seconds=300.0, data_files=900, files_after_optimize=16)
    verdict, goal, measured = files_goal(crowded, healthy)
    assert verdict == "PASS" and "window" not in goal and "60 files" in measured
    verdict, goal, _ = files_goal(crowded)
    assert verdict == "MISS" and "window 300 s, not 30 min" in goal
    assert files_goal(_steady(window_seconds=1800.0, data_files=65, files_after_optimize=16))[
        0
    ] == "MISS"


def test_steady_goal_needs_the_producer_to_offer_the_rate() -> None:
    def verdict(*steady: SteadyStateResult) -> str:
        goals = evaluate_goals(
            drain=None, load_ratio=0.9, steady=steady, memory=None, rollback=None
        )
        (goal,) = [g for g in goals if "sustained" in g.goal]
        return goal.verdict

    assert verdict(_steady()) == "PASS"
    assert verdict(_steady(applied_rate=12_000.0, producer_kept_pace=False)) == "MISS"
    assert verdict(_steady(keeps_up=False)) == "MISS"
    unmeasured = LagPercentiles(rows=0, p50_ms=0.0, p99_ms=0.0, max_ms=0.0)
    assert verdict(_steady(lag=unmeasured)) == "MISS"
    slow = LagPercentiles(rows=100, p50_ms=3_000.0, p99_ms=6_000.0, max_ms=7_000.0)
    assert verdict(_steady(lag=slow)) == "MISS"
    # The highest offered rate decides, whatever the order.
    assert verdict(_steady(), _steady(offered_rate=5_000.0, keeps_up=False)) == "PASS"
    assert verdict() == "NOT RUN"


def _goal(goals: tuple[GoalCheck, ...], words: str) -> GoalCheck:
    (goal,) = [g for g in goals if words in g.goal]
    return goal


def test_the_codec_goal_is_judged_per_cpu_second() -> None:
    drain = DrainResult(
        messages=1_000_000, documents=900_000, bytes=10**9, seconds=4.0, cpu_seconds=3.0,
        messages_per_second=250_000.0, megabytes_per_second=250.0,
        codec_messages_per_cpu_second=150_000.0,
    )  # fmt: skip
    goals = evaluate_goals(drain=drain, load_ratio=None, steady=(), memory=None, rollback=None)
    codec = _goal(goals, "codec decodes")
    assert (codec.verdict, codec.measured) == ("MISS", "150,000 msgs/s")
    idle = evaluate_goals(drain=None, load_ratio=None, steady=(), memory=None, rollback=None)
    assert {goal.verdict for goal in idle} == {"NOT RUN"}
    assert "p99 lag <= 5 s" in _goal(idle, "sustained").goal


def test_memory_and_rollback_goals_need_a_complete_run() -> None:
    def memory(*, python_mib: float, complete: bool = True) -> MemoryResult:
        return MemoryResult(
            memory_budget_mb=32, snapshot_docs=1_000, snapshot_megabytes=128.0, rows=1_000,
            complete=complete, seconds=10.0, python_peak_rss_mib=python_mib,
            jvm_peak_rss_mib=900.0, peak_staged_mib=30.0,
        )  # fmt: skip

    def rollback(
        *, only_partition: bool, restored: bool, seconds: float = 1.0
    ) -> RollbackResult:
        return RollbackResult(
            vbucket=3, table_rows=100, table_files=10, vbucket_rows=10, from_seqno=20,
            to_seqno=10, seconds=seconds, files_added=1, files_removed=1, change_data_files=1,
            files_only_holding_vbucket=only_partition, rows_copied=0, rows_restored=restored,
            operation_metrics={},
        )  # fmt: skip

    def verdicts(memory: MemoryResult, rollback: RollbackResult) -> tuple[str, str]:
        goals = evaluate_goals(
            drain=None, load_ratio=None, steady=(), memory=memory, rollback=rollback
        )
        return _goal(goals, "peak RSS").verdict, _goal(goals, "one-vbucket rollback").verdict

    assert verdicts(memory(python_mib=500.0), rollback(only_partition=True, restored=True)) == (
        "PASS", "PASS",
    )  # fmt: skip
    assert verdicts(memory(python_mib=3_000.0), rollback(only_partition=False, restored=True)) == (
        "MISS", "MISS",
    )  # fmt: skip
    assert verdicts(
        memory(python_mib=500.0, complete=False), rollback(only_partition=True, restored=False)
    ) == ("MISS", "MISS")
    slow = rollback(only_partition=True, restored=True, seconds=5.5)
    assert verdicts(memory(python_mib=500.0), slow) == ("PASS", "MISS")


def test_two_shard_bench_removes_its_work_unless_kept_or_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from jobs.bench import main
    from replicator.bench import sharding

    failing = False

    def measured(
        docs: int, doc_size: int, vbuckets: int, *, work_dir: Path
    ) -> sharding.TwoShardLoadResult:
        (work_dir / "one-shard").mkdir(parents=True)  # what a real run leaves behind
        if failing:
            raise sharding.ShardedLoadFailed("two-shards: shard 1/2 exited 1")
        one = sharding.ShardRun(1, 2, 20.0, (20.0,), docs)
        two = sharding.ShardRun(2, 1, 40.0, (39.0, 38.0), docs)
        return sharding.TwoShardLoadResult(docs, doc_size, vbuckets, 1, 2, one, two)

    monkeypatch.setattr(sharding, "measure_two_shard_load", measured)
    work = tmp_path / "work"
    args = ["--two-shards", "--preset", "smoke", "--work-dir", str(work)]

    assert main(args) == 0
    assert "speed-up of two shards: 0.50x" in capsys.readouterr().out
    assert not work.exists()

    assert main([*args, "--keep-work"]) == 0
    assert (work / "one-shard").is_dir()
    shutil.rmtree(work)

    failing = True
    assert main(args) == 1
    assert "shard 1/2 exited 1" in capsys.readouterr().err
    assert (work / "one-shard").is_dir(), "a failed measurement keeps its logs"


def test_read_side_goals_need_a_quick_quiet_answer() -> None:
    from replicator.bench.read_side import CommandTiming, ReadSideResult

    def verdicts(*timings: CommandTiming) -> tuple[str, str]:
        result = ReadSideResult(
            rows=1_000, vbuckets=8, versions=500, checkpoint_rows=4_000, rollbacks=2,
            build_s=1.0, timings=timings,
        )  # fmt: skip
        goals = evaluate_goals(
            drain=None, load_ratio=None, steady=(), memory=None, rollback=None, read_side=result
        )
        return (_goal(goals, "`replicator status`").verdict,
                _goal(goals, "`replicator audit rollbacks`").verdict)

    quick = CommandTiming("status", "delta-rs", (1.2, 3.0, 1.4), 0, "")
    lagging = CommandTiming("status", "delta-rs", (1.2,), 3, "")  # a health verdict: answered
    noisy = CommandTiming("audit rollbacks", "delta-rs", (0.5,), 0, "WARNING: something\n")
    slow = CommandTiming("audit rollbacks", "delta-rs", (2.5, 2.1, 1.0), 0, "")
    failed = CommandTiming("status", "delta-rs", (0.3,), 2, "")
    assert verdicts(quick, noisy) == ("PASS", "MISS")
    assert verdicts(lagging, slow) == ("PASS", "MISS")
    assert verdicts(failed)[0] == "MISS"
    assert verdicts() == ("NOT RUN", "NOT RUN")
    idle = evaluate_goals(drain=None, load_ratio=None, steady=(), memory=None, rollback=None)
    assert _goal(idle, "`replicator status`").verdict == "NOT RUN"


def test_lag_percentiles_of_many_rows_are_those_of_the_rows(spark: Any) -> None:
    from replicator.bench.steady_state import _percentiles

    # 200,000 lags of 1 to 200,000 ms, spread over four partitions.
    lags = spark.range(1, 200_001).selectExpr("CAST(id AS DOUBLE) AS lag_ms").orderBy("lag_ms")
    percentiles = _percentiles(lags.repartition(4))
    assert percentiles.rows == 200_000 and percentiles.max_ms == 200_000
    assert abs(percentiles.p50_ms - 100_000) <= 2 and abs(percentiles.p99_ms - 198_000) <= 2
    assert _percentiles(lags.where("lag_ms < 0")) == LagPercentiles(0, 0.0, 0.0, 0.0)
