"""One benchmark run: every measurement in turn for a preset, side by side, then the goals.

A measurement that fails is recorded (its section stays empty, the reason is kept) and the run
goes on, so one broken part never hides the others' numbers.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from replicator.bench.catch_up import CatchUpResult, measure_catch_up
from replicator.bench.drain import DrainResult, measure_drain_side_by_side
from replicator.bench.goals import evaluate_goals
from replicator.bench.initial_load import InitialLoadResult, bench_config, measure_initial_load
from replicator.bench.machine import describe_machine
from replicator.bench.memory import MemoryResult, measure_memory
from replicator.bench.plain_append import PlainAppendResult, measure_plain_append
from replicator.bench.presets import BenchPreset
from replicator.bench.procfs import load_average
from replicator.bench.read_side import ReadSideResult, measure_read_side
from replicator.bench.report import BenchReport, load_ratio
from replicator.bench.rollback import RollbackResult, measure_rollback
from replicator.bench.serve import ServeResult, measure_serve
from replicator.bench.simulator import SIM_PASSWORD, SIM_USERNAME, SimulatorProcess
from replicator.bench.steady_state import (
    SteadyStateResult,
    SteadyStateSettings,
    measure_steady_state,
)
from replicator.bench.transactions import TransactionSourceResult, measure_transaction_source
from replicator.config import ReplicatorConfig, VbucketSelection
from replicator.dcp.transport.auth import Credentials
from replicator.pipeline.runner import run_replication
from replicator.planning.planner import CommitThresholds

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

T = TypeVar("T")

LOAD_BUCKET = "bench"
Announce = Callable[[str], None]


@dataclass
class _Sections:
    """Results gathered so far, and why sections failed."""

    failures: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    announce: Announce = print

    def run(self, section: str, title: str, measure: Callable[[], T]) -> T | None:
        self.announce(f"running {title} ...")
        started = time.perf_counter()
        try:
            result = measure()
        except Exception as exc:
            self.seconds[section] = time.perf_counter() - started
            log.error("%s failed:\n%s", section, traceback.format_exc())
            self.failures[section] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            self.announce(f"  {section} FAILED: {self.failures[section]}")
            return None
        self.seconds[section] = time.perf_counter() - started
        self.announce(f"  {section} done in {self.seconds[section]:.1f} s")
        return result


def run_suite(
    preset: BenchPreset,
    *,
    spark: SparkSession | None = None,
    work_dir: str | None = None,
    keep_work: bool = False,
    announce: Announce = print,
) -> BenchReport:
    """Run every measurement of `preset`; returns the report (write it with report.write_report).

    Tables, spill files and the simulators' logs go to `work_dir` (a new temporary directory
    by default), which is removed afterwards unless `keep_work` or a measurement failed.
    """
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.perf_counter()
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="replicator-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if spark is None:
        from replicator.runtime.spark import build_session

        spark = build_session("replicator-bench")
    machine = describe_machine(spark)
    sections = _Sections(announce=announce)
    alongside = _MemoryAlongside(preset, work, sections) if preset.memory_alongside else None

    serve: ServeResult | None = sections.run(
        "serve", "1. producer serve rate",
        lambda: measure_serve(preset.docs, preset.doc_size, preset.vbuckets),
    )  # fmt: skip
    mirror_path = str(work / "mirror")
    drain, initial = _load_from_one_producer(spark, preset, work, mirror_path, sections)
    plain: PlainAppendResult | None = None
    rollback: RollbackResult | None = None
    read_side: ReadSideResult | None = None
    if initial is not None:
        plain = sections.run(
            "plain_append", "4. plain Arrow append of the same rows",
            lambda: measure_plain_append(
                spark, mirror_path, str(work / "plain-append"),
                max_chunk_bytes=CommitThresholds().max_first_load_bytes,
            ),
        )  # fmt: skip
        rollback = sections.run(
            "rollback", "7. one-vbucket rollback on the loaded mirror",
            lambda: measure_rollback(
                spark, mirror_path, LOAD_BUCKET, vbucket=preset.vbuckets // 3,
                changed_docs=preset.rollback_changed_docs,
            ),
        )  # fmt: skip
        read_side = sections.run(
            "read_side", f"9. read-side commands on the mirror grown to "
            f"{preset.read_side_versions} versions",
            lambda: measure_read_side(
                spark, mirror_path, versions=preset.read_side_versions,
                runs=preset.read_side_runs, spark_runs=preset.read_side_spark_runs,
            ),
        )  # fmt: skip
    else:
        for section in ("plain_append", "rollback", "read_side"):
            sections.failures[section] = "not run: it needs the initial load's mirror"
    steady: list[SteadyStateResult] = []
    for rate, seed_docs, window_s in preset.steady_runs:
        settings = SteadyStateSettings(
            offered_rate=rate,
            window_s=window_s,
            seed_docs=seed_docs,
            doc_size=preset.doc_size,
            vbuckets=preset.vbuckets,
            commit_interval_s=preset.steady_commit_interval_s,
            catch_up_timeout_s=preset.catch_up_timeout_s,
            warmup_catch_ups=preset.steady_warmup_catch_ups,
        )
        result = sections.run(
            f"steady_state_{rate}", f"5. steady state at {rate:,} mutations/s",
            functools.partial(measure_steady_state, spark, settings, work_dir=str(work)),
        )  # fmt: skip
        if result is not None:
            steady.append(result)
    catch_up: CatchUpResult | None = sections.run(
        "catch_up", f"8. until-caught-up run, {preset.catch_up_changes:,} changes pending",
        lambda: measure_catch_up(
            spark, target=str(work / "catch-up"), docs=preset.catch_up_docs,
            doc_size=preset.doc_size, vbuckets=preset.vbuckets, changes=preset.catch_up_changes,
        ),
    )  # fmt: skip
    transactions: TransactionSourceResult | None = sections.run(
        "transactions", f"10. Drizzle transaction source, {preset.drizzle_transactions:,} "
        "transactions from a log and from RabbitMQ",
        lambda: measure_transaction_source(
            spark, work, transactions=preset.drizzle_transactions
        ),
    )  # fmt: skip
    memory = alongside.join() if alongside is not None else _measure_memory(preset, work, sections)

    ratio = load_ratio(initial, plain)
    report = BenchReport(
        preset=preset.name,
        started_at=started_at,
        docs=preset.docs,
        doc_size=preset.doc_size,
        vbuckets=preset.vbuckets,
        machine=machine,
        serve=serve,
        drain=drain,
        initial_load=initial,
        plain_append=plain,
        load_ratio=ratio,
        steady_state=tuple(steady),
        memory=memory,
        rollback=rollback,
        catch_up=catch_up,
        read_side=read_side,
        transactions=transactions,
        goals=evaluate_goals(
            drain=drain, load_ratio=ratio, steady=steady, memory=memory, rollback=rollback,
            catch_up=catch_up, read_side=read_side,
        ),
        load_average_at_end=load_average(),
        seconds=time.perf_counter() - started,
        failures=dict(sections.failures),
        section_seconds=dict(sections.seconds),
    )
    if keep_work or sections.failures:
        announce(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _measure_memory(preset: BenchPreset, work: Path, sections: _Sections) -> MemoryResult | None:
    return sections.run(
        "memory", "6. peak memory, one vbucket of "
        f"{preset.memory_snapshot_factor} x the {preset.memory_budget_mb} MB budget",
        lambda: measure_memory(
            memory_budget_mb=preset.memory_budget_mb, docs=preset.memory_docs,
            doc_size=preset.memory_doc_size, work_dir=str(work),
            jvm_options=preset.probe_jvm_options,
        ),
    )  # fmt: skip


class _MemoryAlongside:
    """Measurement 6 on a thread (its work happens in child processes) beside the others."""

    def __init__(self, preset: BenchPreset, work: Path, sections: _Sections) -> None:
        self._result: MemoryResult | None = None
        self._thread = threading.Thread(
            target=self._run, args=(preset, work, sections), name="bench-memory", daemon=True
        )
        self._thread.start()

    def _run(self, preset: BenchPreset, work: Path, sections: _Sections) -> None:
        self._result = _measure_memory(preset, work, sections)

    def join(self) -> MemoryResult | None:
        self._thread.join()
        return self._result


def _load_from_one_producer(
    spark: SparkSession, preset: BenchPreset, work: Path, mirror_path: str, sections: _Sections
) -> tuple[DrainResult | None, InitialLoadResult | None]:
    """Measurements 2 and 3 share one producer process (loading it is the slow part); the
    initial load builds the mirror at `mirror_path` that measurements 4 and 7 read."""
    announce = sections.announce
    announce(f"starting a producer with {preset.docs:,} documents ...")
    try:
        simulator = SimulatorProcess(
            LOAD_BUCKET, docs=preset.docs, doc_size=preset.doc_size, vbuckets=preset.vbuckets,
            log_path=work / "sim-load.log",
        ).start()  # fmt: skip
    except Exception as exc:
        sections.failures["drain"] = sections.failures["initial_load"] = str(exc)
        return None, None
    try:
        drain: DrainResult | None = sections.run(
            "drain", "2. protocol-layer drain, beside the Java DCP client",
            lambda: measure_drain_side_by_side(
                simulator.connection_string, Credentials(SIM_USERNAME, SIM_PASSWORD),
                expected_documents=preset.docs, rounds=preset.drain_rounds,
            ),
        )  # fmt: skip
        config = bench_config(
            simulator.connection_string, mirror_path, SIM_PASSWORD,
            until_caught_up=True, staging_dir=str(work / "staging-load"),
        )  # fmt: skip

        def load() -> InitialLoadResult:
            warmup = warm_up_jvm(
                spark, config, work / "jvm-warmup", vbuckets=preset.jvm_warmup_vbuckets
            )
            result = measure_initial_load(spark, config, expected_rows=preset.docs)
            return dataclasses.replace(result, jvm_warmup_seconds=warmup)

        initial: InitialLoadResult | None = sections.run(
            "initial_load", "3. initial load, end to end", load
        )
    finally:
        simulator.stop()
    return drain, initial


def warm_up_jvm(
    spark: SparkSession, config: ReplicatorConfig, work: Path, *, vbuckets: int
) -> float:
    """Load `vbuckets` of `config`'s source into a throwaway mirror and append its rows plainly,
    untimed; returns the seconds it took (0.0 when `vbuckets` is 0).

    On two cores a cold JVM's compiler threads took 36 to 40 of the 78 to 88 JVM CPU seconds of
    a 1,000,000-document load, and a second load in the same JVM ran in 37 s instead of 51 to
    57 s (2026-11-27). Without a warm-up the initial load pays those compilations for both
    measurements, and the plain append measured after it runs on the JVM it warmed.
    """
    if not vbuckets:
        return 0.0
    started = time.perf_counter()
    warm = dataclasses.replace(
        config, target=str(work / "mirror"), staging_dir=str(work / "staging"),
        vbuckets=VbucketSelection.parse(f"0-{vbuckets - 1}"),
    )  # fmt: skip
    run_replication(warm, spark=spark)
    measure_plain_append(
        spark, warm.target, str(work / "plain-append"),
        max_chunk_bytes=CommitThresholds().max_first_load_bytes,
    )  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    return time.perf_counter() - started
