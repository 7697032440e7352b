"""Measurement 9: the read-side commands on a large mirror, timed as an operator runs them.

The initial load's mirror (the preset's documents over its vbuckets) first gets a long history:
data commits until it has `versions` table versions, each carrying the replicator's commit
metadata for every vbucket (as a group commit of a busy bucket does), a one-vbucket rollback
every ROLLBACK_EVERY commits with the details a real rollback records, and the checkpoint rows
of every commit, recorded every CHECKPOINT_EVERY commits as the executor does. The commits add
no rows (empty appends): `status` and `audit rollbacks` read the log, the checkpoints, the owners
and the failover logs, never the rows (`as-of` reads the rows of version 1), and empty appends
build 500 versions in minutes where MERGEs would take most of an hour.

Then `replicator status`, `audit rollbacks` and `audit as-of` run as new processes, several times
each, wall clock from start to exit: what a cron job or an operator in an incident waits. Once
each with `--engine spark` too, for comparison. Whatever a command writes to stderr is kept:
the goal is an answer and nothing else on the terminal.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replicator.delta.commit_metadata import ROLLBACK, CommitMetadata
from replicator.model.positions import VbucketPosition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROLLBACK_EVERY = 50
CHECKPOINT_EVERY = 10
OWNER_ID = "bench-read-side"
COMMANDS = (("status",), ("audit", "rollbacks"), ("audit", "as-of", "--version", "1"))
"""Timed commands: `as-of` reads rows too (the first 20 of the version that loaded them all)."""


@dataclass(frozen=True, slots=True)
class CommandTiming:
    """Runs of one read-side command: each run's wall seconds, and what it put on stderr."""

    command: str
    engine: str
    seconds: tuple[float, ...]
    exit_code: int
    stderr: str

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def answered(self) -> bool:
        """The command gave its answer: exit 0, or (status) a health verdict's exit code."""
        from replicator.inspect.health import Health

        return self.exit_code in {state.exit_code for state in Health}

    @property
    def quiet(self) -> bool:
        """Nothing but the answer: no line on stderr."""
        return not self.stderr.strip()


@dataclass(frozen=True, slots=True)
class ReadSideResult:
    """The mirror the commands read, and their timings."""

    rows: int
    vbuckets: int
    versions: int
    checkpoint_rows: int
    rollbacks: int
    build_s: float
    timings: tuple[CommandTiming, ...]

    def timing(self, command: str, engine: str) -> CommandTiming | None:
        for timing in self.timings:
            if timing.command == command and timing.engine == engine:
                return timing
        return None


def measure_read_side(
    spark: SparkSession, target: str, *, versions: int, runs: int = 3, spark_runs: int = 1
) -> ReadSideResult:
    """Grow the mirror at `target` to `versions` table versions, then time the commands
    `runs` times with delta-rs and `spark_runs` times with Spark."""
    started = time.perf_counter()
    rollbacks = grow_history(spark, target, versions=versions)
    build_s = time.perf_counter() - started
    from replicator.delta.schema import MirrorLayout

    layout = MirrorLayout(target)
    rows = spark.read.format("delta").load(layout.data).count()
    checkpoint_rows = spark.read.format("delta").load(layout.checkpoints).count()
    vbuckets = spark.read.format("delta").load(layout.checkpoints).select("vbucket").distinct()
    timings = []
    for engine, times in (("delta-rs", runs), ("spark", spark_runs)):
        for command in COMMANDS[: len(COMMANDS) if times else 0]:
            timings.append(time_command(target, command, engine=engine, runs=times))
    return ReadSideResult(
        rows=rows, vbuckets=vbuckets.count(), versions=_version(spark, target) + 1,
        checkpoint_rows=checkpoint_rows, rollbacks=rollbacks, build_s=build_s,
        timings=tuple(timings),
    )  # fmt: skip


def time_command(target: str, command: tuple[str, ...], *, engine: str, runs: int) -> CommandTiming:
    """Run `replicator COMMAND --target TARGET --engine ENGINE` `runs` times, in new processes."""
    from replicator.soak.process import replicator_command

    argv = [
        *replicator_command(), command[0], "--target", target, "--engine", engine, *command[1:],
    ]
    seconds = []
    exit_code, stderr = 0, ""
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        seconds.append(time.perf_counter() - started)
        exit_code, stderr = done.returncode, stderr or done.stderr
    return CommandTiming(" ".join(command), engine, tuple(seconds), exit_code, stderr)


def grow_history(spark: SparkSession, target: str, *, versions: int) -> int:
    """Add commits to the mirror at `target` until it has `versions` versions; returns how
    many of the added commits are rollbacks."""
    from replicator.delta.checkpoints import CheckpointsTable
    from replicator.delta.commit_metadata import txn_app_id
    from replicator.delta.schema import MirrorLayout
    from replicator.delta.table import (
        CommitRecord,
        delta_write_confs,
        last_commit_version,
        now_utc,
        reset_last_commit_version,
    )

    layout = MirrorLayout(target)
    checkpoints = CheckpointsTable(spark, layout.checkpoints)
    positions = {vb: c.position for vb, c in checkpoints.latest().items()}
    if not positions:
        raise ValueError(f"{target} has no checkpoints to continue from")
    empty = spark.read.format("delta").load(layout.data).limit(0)
    pending: list[CommitRecord] = []
    rollbacks = 0
    batch = 1
    while _version(spark, target) + 1 < versions:
        if batch % ROLLBACK_EVERY == 0:
            metadata = _rollback(batch, positions, _version(spark, target))
            rollbacks += 1
        else:
            positions = {vb: _advanced(p) for vb, p in positions.items()}
            metadata = CommitMetadata(
                kind="commit", batch_id=batch, part=1, owner_id=OWNER_ID, strategy="merge",
                positions=dict(positions),
                details={"trigger": "interval"},
            )  # fmt: skip
        with delta_write_confs(
            spark, user_metadata=metadata.to_json(), app_id=txn_app_id(OWNER_ID),
            version=metadata.txn_version,
        ):  # fmt: skip
            reset_last_commit_version(spark)
            empty.write.format("delta").mode("append").save(layout.data)
            version = last_commit_version(spark)
        if version is None:
            raise RuntimeError(f"the empty append of batch {batch} made no commit")
        pending.append(CommitRecord(version, now_utc(), metadata))
        if metadata.kind == ROLLBACK:
            vbucket = next(iter(metadata.positions))
            positions[vbucket] = metadata.positions[vbucket]
        if len(pending) >= CHECKPOINT_EVERY:
            checkpoints.record(pending)
            pending = []
        batch += 1
    if pending:
        checkpoints.record(pending)
    return rollbacks


def _advanced(position: VbucketPosition) -> VbucketPosition:
    """One more snapshot of ten seqnos past `position`."""
    seqno = position.seqno + 10
    return VbucketPosition.at_boundary(
        position.vbucket, position.vbucket_uuid, seqno,
        purge_seqno=position.purge_seqno, manifest_uid=position.manifest_uid,
    )  # fmt: skip


def _rollback(
    batch: int, positions: dict[int, VbucketPosition], restored_from: int
) -> CommitMetadata:
    """A rollback commit's metadata: one vbucket back five seqnos, on a new branch."""
    vbucket = sorted(positions)[batch % len(positions)]
    current = positions[vbucket]
    to_seqno = max(0, current.seqno - 5)
    new_uuid = (current.vbucket_uuid * 31 + batch) % (1 << 63)
    rewound = VbucketPosition.at_boundary(
        vbucket, new_uuid, to_seqno,
        purge_seqno=current.purge_seqno, manifest_uid=current.manifest_uid,
    )  # fmt: skip
    return CommitMetadata(
        kind=ROLLBACK, batch_id=batch, part=1, owner_id=OWNER_ID, strategy="replace",
        positions={vbucket: rewound},
        details={
            "vbucket": vbucket, "from_seqno": current.seqno, "to_seqno": to_seqno,
            "rollback_seqno": to_seqno, "from_table_version": restored_from,
            "failover_log": [[new_uuid, to_seqno], [current.vbucket_uuid, 0]],
            "reason": "bench: the producer asked for a rollback",
        },
    )  # fmt: skip


def _version(spark: SparkSession, target: str) -> int:
    from replicator.delta.table import table_version

    return table_version(spark, target)
