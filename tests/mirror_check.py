"""Row-by-row comparison of a mirror with the embedded producer's own state (chispa)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from chispa import assert_df_equality
from delta.tables import DeltaTable

from replicator.delta.commit_metadata import RESYNC, ROLLBACK
from replicator.delta.schema import DATA_COLUMNS, DATA_SCHEMA
from replicator.model.positions import FailoverLog
from replicator.sim.bucket import DocumentRecord, SimBucket
from replicator.soak.audit import expected_row


class ProducerState(Protocol):
    """What the comparisons read of the producer: a SimBucket, or a view of one."""

    def documents(self) -> list[DocumentRecord]: ...

    def state_at(self, vbucket: int, seqno: int) -> list[DocumentRecord]: ...


class ReadersView:
    """The producer's documents as a reader sees them: one already past its expiry is gone,
    though the expiry pager has not visited it yet. The replicator deletes those (issue 5:
    "a mutation whose expiry is already past removes it too"); the bucket still lists them."""

    def __init__(self, bucket: SimBucket) -> None:
        self._bucket = bucket

    def documents(self) -> list[DocumentRecord]:
        return self._readable(self._bucket.documents())

    def state_at(self, vbucket: int, seqno: int) -> list[DocumentRecord]:
        return self._readable(self._bucket.state_at(vbucket, seqno))

    @staticmethod
    def _readable(records: list[DocumentRecord]) -> list[DocumentRecord]:
        now = time.time()
        return [r for r in records if not r.expiry or r.expiry > now]


def expected_frame(spark: Any, records: Iterable[DocumentRecord]) -> Any:
    return spark.createDataFrame([expected_row(r) for r in records], DATA_SCHEMA)


def mirror_frame(spark: Any, target: str, *, version: int | None = None) -> Any:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(target).select(*DATA_COLUMNS)


def assert_mirror_equals_bucket(
    spark: Any, target: str, bucket: ProducerState, *, vbuckets: Iterable[int] | None = None
) -> None:
    """The mirror holds exactly the bucket's live documents (of `vbuckets`, default all)."""
    wanted = None if vbuckets is None else set(vbuckets)
    records = [r for r in bucket.documents() if wanted is None or r.vbucket in wanted]
    actual = mirror_frame(spark, target)
    if wanted is not None:
        actual = actual.where(actual.vbucket.isin(sorted(wanted)))
    assert_df_equality(
        actual.orderBy("vbucket", "collection_id", "key"),
        expected_frame(spark, records).orderBy("vbucket", "collection_id", "key"),
        ignore_nullable=True,
    )


def committed_positions_by_version(spark: Any, target: str) -> dict[int, dict[int, int]]:
    """For every data table version, each vbucket's committed seqno at that version."""
    checkpoints = spark.read.format("delta").load(f"{target}/_replicator/checkpoints").collect()
    versions = sorted(
        row["version"] for row in DeltaTable.forPath(spark, target).history().collect()
    )
    by_version: dict[int, dict[int, int]] = {}
    for version in versions:
        latest: dict[int, tuple[int, int]] = {}
        for row in checkpoints:
            if row["table_version"] <= version:
                seen = latest.get(row["vbucket"])
                if seen is None or row["table_version"] >= seen[0]:
                    latest[row["vbucket"]] = (row["table_version"], row["seqno"])
        by_version[version] = {vb: seqno for vb, (_, seqno) in latest.items()}
    return by_version


def assert_every_version_consistent(spark: Any, target: str, bucket: ProducerState) -> int:
    """Every table version holds, per vbucket, exactly the producer's state at the committed
    boundary of that version: no version exposes a partial snapshot. Needs an unbroken
    producer history (no failover). Returns how many versions were checked."""
    positions = committed_positions_by_version(spark, target)
    for version, seqnos in positions.items():
        records = [
            record
            for vbucket, seqno in seqnos.items()
            for record in bucket.state_at(vbucket, seqno)
        ]
        actual = mirror_frame(spark, target, version=version).orderBy(
            "vbucket", "collection_id", "key"
        )
        assert_df_equality(
            actual,
            expected_frame(spark, records).orderBy("vbucket", "collection_id", "key"),
            ignore_nullable=True,
        )
    return len(positions)


def rewinds(spark: Any, target: str) -> tuple[set[int], int]:
    """Vbuckets that a rollback or resync commit rewound, and the last such table version."""
    rewound: set[int] = set()
    last = -1
    for row in DeltaTable.forPath(spark, target).history().collect():
        details = json.loads(row["userMetadata"]) if row["userMetadata"] else {}
        if details.get("kind") in (ROLLBACK, RESYNC):
            rewound.update(int(vb) for vb in details["positions"])  # one or a failover's
            last = max(last, int(row["version"]))
    return rewound, last


def assert_no_change_applied_twice(spark: Any, target: str) -> set[int]:
    """In the change data feed, each (vbucket, collection, key, seqno) is written at most once.

    After a rollback the producer re-sends the seqnos above the rewound boundary that it kept,
    so those may land twice by design. Nothing else may: no repeat in vbuckets never rewound,
    and no repeat at all since the last rewind. Returns the rewound vbuckets.
    """
    rewound, last = rewinds(spark, target)
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(target)
        .where("_change_type IN ('insert', 'update_postimage')")
    )
    keys = ["vbucket", "collection_id", "key", "seqno"]
    for scope, frame in [
        ("never rewound vbuckets", feed.where(~feed.vbucket.isin(sorted(rewound)))),
        ("changes since the last rewind", feed.where(feed._commit_version > last)),
    ]:
        repeated = frame.groupBy(*keys).count().where("count > 1").limit(5).collect()
        assert not repeated, f"{scope}: changes applied more than once: {repeated}"
    return rewound


# --- across rollbacks ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LostBranch:
    """History a failover threw away, captured just before it: the vbucket's live documents at
    every seqno in (branch_seqno, lost_high], on the branch the pre-failover log describes."""

    vbucket: int
    branch_seqno: int
    lost_high: int
    failover_log: FailoverLog
    states: Mapping[int, tuple[DocumentRecord, ...]]

    def holds(self, seqno: int, vbucket_uuid: int) -> bool:
        """True if a committed position (seqno, uuid) lies on this branch above the branch point."""
        return self.branch_seqno < seqno <= self.lost_high and on_history(
            self.failover_log, self.lost_high, seqno, vbucket_uuid
        )


def on_history(log: FailoverLog, high_seqno: int, seqno: int, vbucket_uuid: int) -> bool:
    """True if `vbucket_uuid` is in `log` and its branch (up to the next newer entry, or the
    high seqno for the newest) covers `seqno`."""
    entries = log.entries
    for index, entry in enumerate(entries):
        if entry.vbucket_uuid == vbucket_uuid:
            upper = entries[index - 1].seqno if index > 0 else high_seqno
            return entry.seqno <= seqno <= upper
    return False


def fail_over_recording(bucket: SimBucket, vbucket: int, lose_last: int) -> LostBranch:
    """Fail `vbucket` over (losing its last `lose_last` items), keeping what was lost.

    The capture and the failover happen under the bucket's lock, so no write slips between.
    """
    with bucket.condition:
        high = bucket.high_seqnos()[vbucket]
        branch = high - lose_last
        log = bucket.failover_log(vbucket)
        states = {
            seqno: tuple(bucket.state_at(vbucket, seqno)) for seqno in range(branch + 1, high + 1)
        }
        bucket.failover(vbucket, lose_last)
    return LostBranch(vbucket, branch, high, log, states)


@dataclass(frozen=True, slots=True)
class CommittedMark:
    """Where a data table version leaves one vbucket, per the checkpoints table."""

    seqno: int
    vbucket_uuid: int
    kind: str
    table_version: int
    """The version whose commit wrote this checkpoint (<= the version it describes)."""


def committed_marks_by_version(spark: Any, target: str) -> dict[int, dict[int, CommittedMark]]:
    """For every data table version, each vbucket's newest checkpoint at or before it."""
    checkpoints = sorted(
        spark.read.format("delta").load(f"{target}/_replicator/checkpoints").collect(),
        key=lambda row: (row["table_version"], row["batch_id"]),
    )
    versions = sorted(
        row["version"] for row in DeltaTable.forPath(spark, target).history().collect()
    )
    by_version: dict[int, dict[int, CommittedMark]] = {}
    for version in versions:
        marks: dict[int, CommittedMark] = {}
        for row in checkpoints:
            if row["table_version"] <= version:
                marks[row["vbucket"]] = CommittedMark(
                    row["seqno"], int(row["vbucket_uuid"]), row["kind"], row["table_version"]
                )
        by_version[version] = marks
    return by_version


def _comparable(values: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(bytes(v) if isinstance(v, bytearray) else v for v in values)


def _rows_by_document(rows: Iterable[Any]) -> dict[tuple[int, int, str], tuple[Any, ...]]:
    table: dict[tuple[int, int, str], tuple[Any, ...]] = {}
    for row in rows:
        values = _comparable(row)
        table[(values[0], values[3], values[4])] = values
    return table


def assert_every_version_consistent_across_rollbacks(
    spark: Any, target: str, bucket: SimBucket, lost: Sequence[LostBranch]
) -> int:
    """Every table version holds, per vbucket, exactly the producer's state at that version's
    committed boundary, on whichever history the boundary belongs to: the current one, or a
    branch a failover later threw away (`lost`, as `fail_over_recording` captured it).

    A version showing a vbucket on a lost branch must be followed by a rollback (or resync)
    commit of that vbucket to the branch point or below: once the mirror learnt of the
    failover, nothing of the lost branch may land again. Returns how many versions were checked.
    """
    marks_by_version = committed_marks_by_version(spark, target)
    highs = bucket.high_seqnos()
    logs = {vb: bucket.failover_log(vb) for vb in range(bucket.num_vbuckets)}
    for version, marks in marks_by_version.items():
        expected: list[DocumentRecord] = []
        for vbucket, mark in marks.items():
            branch = next(
                (
                    b
                    for b in lost
                    if b.vbucket == vbucket and b.holds(mark.seqno, mark.vbucket_uuid)
                ),
                None,
            )
            if branch is None:
                assert on_history(logs[vbucket], highs[vbucket], mark.seqno, mark.vbucket_uuid), (
                    f"version {version}: vbucket {vbucket} at seqno {mark.seqno} "
                    f"(uuid {mark.vbucket_uuid:#x}) is on no history the producer had"
                )
                expected.extend(bucket.state_at(vbucket, mark.seqno))
                continue
            expected.extend(branch.states[mark.seqno])
            rewound_later = any(
                later > version
                and (later_mark := later_marks.get(vbucket)) is not None
                and later_mark.table_version > version
                and later_mark.kind in (ROLLBACK, RESYNC)
                and later_mark.seqno <= branch.branch_seqno
                for later, later_marks in marks_by_version.items()
            )
            assert rewound_later, (
                f"version {version} shows vbucket {vbucket} at seqno {mark.seqno} of a history "
                f"the producer lost (failover to {branch.branch_seqno}), and no rollback of it "
                "follows"
            )
        actual = _rows_by_document(mirror_frame(spark, target, version=version).collect())
        # Through Spark too, so timestamps and binaries convert the same way on both sides.
        wanted = _rows_by_document(expected_frame(spark, expected).collect())
        if actual != wanted:
            differing = sorted(
                key for key in actual.keys() | wanted.keys() if actual.get(key) != wanted.get(key)
            )
            raise AssertionError(
                f"version {version} differs from the producer at its committed boundaries "
                f"{ {vb: m.seqno for vb, m in marks.items()} } in {len(differing)} documents, "
                f"e.g. {[(k, actual.get(k), wanted.get(k)) for k in differing[:3]]}"
            )
    return len(marks_by_version)
