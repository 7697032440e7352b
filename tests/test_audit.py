"""The audit surface (issue 10) against a scripted history on the embedded producer.

One live replication mirrors a scenario whose every step is known: an order updated twice, a
user deleted, then a failover of the order's vbucket that loses the second update, so the
mirror rolls back. The answers are checked against the producer's own history
(`SimBucket.state_at` at committed boundaries) and, for the branch the failover abandoned,
against what the producer held before the failover. The pure parts are tested without Spark.
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality

from replicator.audit import (
    ChangeOperation,
    DocumentVersion,
    FieldChangeKind,
    HistoryEntry,
    TableVersion,
    VersionOutOfRangeError,
    VersionVacuumedError,
    changes_between,
    collapse_changes,
    commit_activities,
    diff_documents,
    document_history,
    first_version_from,
    mirror_as_of,
    mirror_at_source_seqno,
    parse_moment,
    readable_versions,
    resolve_source_seqno,
    resolve_version,
    rollback_record,
    rollbacks,
    version_at,
)
from replicator.audit_cli import add_audit_arguments, run_audit
from replicator.config import ReplicatorConfig, Secret
from replicator.delta.schema import CommitMetadata
from replicator.errors import ConfigError, NotAMirrorError
from replicator.replication import Replication
from replicator.runner import run_replication
from replicator.sim.bucket import Delete, DocumentRecord, SimBucket, Upsert
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import initial_load
from tests.mirror_check import expected_frame

VBUCKETS = 4
ROLLED = 2
"""The vbucket that fails over; the audited order lives in it."""
ORDERS = "app.orders"
ORDER_VALUES = (
    {"status": "new", "total": 10.5, "items": [{"sku": "a1"}]},
    {"status": "paid", "total": 10.5, "items": [{"sku": "a1"}]},
    {"status": "shipped", "total": 10.5, "items": [{"sku": "a1"}], "carrier": "DHL"},
)
LOST_WITH_FAILOVER = 3
"""Step C writes three items into the rolled vbucket: the failover loses exactly those."""
WAIT_S = 600.0


# --- the scenario -------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditScenario:
    """A mirror with a known history, and what the producer said at each step."""

    target: str
    bucket: SimBucket
    order_key: str
    deleted_key: str
    order_seqnos: tuple[int, int, int]
    boundary_a: int
    """Seqno of the rolled vbucket after the initial load."""
    boundary_b: int
    """... after the first update (the branch point the rollback returns to)."""
    boundary_c: int
    """... after the second update and two more documents (lost with the failover)."""
    boundary_d: int
    """... after one write on the new branch."""
    abandoned_state: tuple[DocumentRecord, ...]
    """The rolled vbucket at boundary_c, as the producer held it before the failover."""


def key_in_vbucket(bucket: SimBucket, vbucket: int, prefix: str, skip: int = 0) -> str:
    keys = (f"{prefix}-{i}" for i in range(10_000))
    return [key for key in keys if bucket.vbucket_for(key) == vbucket][skip]


class LiveReplication:
    """`run_replication` in a thread; the test waits for commits instead of restarting it."""

    def __init__(self, spark: Any, cluster: SimCluster, target: str) -> None:
        self._cluster = cluster
        self._started = threading.Event()
        self._replication: Replication | None = None
        self._errors: list[BaseException] = []
        config = ReplicatorConfig(
            source=cluster.connection_string, target=target, password=Secret("password"),
            commit_interval_s=0.1, progress="off",
        )

        def on_started(replication: Replication) -> None:
            self._replication = replication
            self._started.set()

        def replicate() -> None:
            try:
                run_replication(config, spark=spark, on_started=on_started)
            except BaseException as exc:
                self._errors.append(exc)
                self._started.set()

        self._thread = threading.Thread(target=replicate, name="audit-replication", daemon=True)
        self._thread.start()

    def wait_committed(self) -> dict[int, int]:
        """Wait until every vbucket committed the producer's high seqno on its current branch."""
        bucket = self._cluster.bucket

        def caught_up() -> bool:
            assert self._replication is not None
            positions = self._replication.positions()
            return all(
                vb in positions
                and positions[vb].seqno == high
                and positions[vb].vbucket_uuid
                == bucket.failover_log(vb).entry_at(high).vbucket_uuid
                for vb, high in bucket.high_seqnos().items()
            )

        self._wait(self._started.is_set, "the replication to start")
        self._wait(caught_up, "the replication to commit the producer's high seqnos")
        return bucket.high_seqnos()

    def finish(self) -> None:
        assert self._replication is not None
        self._replication.request_catch_up(self._cluster.bucket.high_seqnos())
        self._thread.join(timeout=WAIT_S)
        if self._errors:
            raise self._errors[0]
        assert not self._thread.is_alive(), "the replication did not stop"

    def _wait(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        pause = threading.Event()  # never set: a wait that wakes up to check the condition
        while not condition():
            if self._errors:
                raise self._errors[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {WAIT_S:.0f}s waiting for {what}")
            pause.wait(0.2)


_SCENARIOS: dict[str, AuditScenario] = {}


def audit_scenario(spark: Any, root: Path) -> AuditScenario:
    """Build the scenario mirror once per test run (test_interop_deltars reads it too)."""
    if "mirror" in _SCENARIOS:
        return _SCENARIOS["mirror"]
    target = str(root / "mirror")
    bucket = SimBucket("shop", num_vbuckets=VBUCKETS, seed=10)
    initial_load(bucket, docs=120, doc_size=160, seed=10, evict_checkpoints=False)
    order = key_in_vbucket(bucket, ROLLED, "order-audit")
    doomed = key_in_vbucket(bucket, 0, "user-doomed")
    late = [key_in_vbucket(bucket, ROLLED, "late", skip=i) for i in range(2)]
    # Another document under the same key in another collection: history must ask which.
    items = bucket.apply_batch([
        Upsert(order, ORDER_VALUES[0], collection=ORDERS),
        Upsert(order, {"sku": "shadow"}, collection="catalog.products"),
        Upsert(doomed, {"name": "Doomed"}, collection="app.users"),
    ])
    seqnos = [items[0].by_seqno]
    bucket.evict_checkpoints()
    with SimCluster(bucket, nodes=1) as cluster:
        live = LiveReplication(spark, cluster, target)
        boundary_a = live.wait_committed()[ROLLED]
        seqnos.append(bucket.upsert(order, ORDER_VALUES[1], collection=ORDERS).by_seqno)
        boundary_b = live.wait_committed()[ROLLED]
        step_c = bucket.apply_batch([
            Upsert(order, ORDER_VALUES[2], collection=ORDERS),
            Delete(doomed, collection="app.users"),
            *(Upsert(key, {"late": key}) for key in late),
        ])
        seqnos.append(step_c[0].by_seqno)
        boundary_c = live.wait_committed()[ROLLED]
        assert boundary_c == boundary_b + LOST_WITH_FAILOVER
        abandoned = tuple(bucket.state_at(ROLLED, boundary_c))
        cluster.failover(ROLLED, lose_last=LOST_WITH_FAILOVER)
        bucket.upsert(key_in_vbucket(bucket, ROLLED, "after-failover"), {"branch": 2})
        boundary_d = live.wait_committed()[ROLLED]
        live.finish()
    scenario = AuditScenario(
        target=target, bucket=bucket, order_key=order, deleted_key=doomed,
        order_seqnos=(seqnos[0], seqnos[1], seqnos[2]), boundary_a=boundary_a,
        boundary_b=boundary_b, boundary_c=boundary_c, boundary_d=boundary_d,
        abandoned_state=abandoned,
    )
    _SCENARIOS["mirror"] = scenario
    return scenario


@pytest.fixture(scope="module")
def scenario(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> AuditScenario:
    return audit_scenario(spark, tmp_path_factory.mktemp("audit"))


def checkpoint_version(spark: Any, target: str, vbucket: int, seqno: int) -> int:
    """The table version of the (first) checkpoint of `vbucket` at `seqno`."""
    rows = (
        spark.read.format("delta").load(f"{target}/_replicator/checkpoints")
        .where(f"vbucket = {vbucket} AND seqno = {seqno}")
        .orderBy("table_version").collect()
    )
    assert rows, f"no checkpoint of vbucket {vbucket} at seqno {seqno}"
    return int(rows[0]["table_version"])


def assert_rows_equal(spark: Any, actual: Any, records: Any) -> None:
    order = ("vbucket", "collection_id", "key")
    assert_df_equality(
        actual.orderBy(*order), expected_frame(spark, records).orderBy(*order),
        ignore_nullable=True,
    )


# --- document history ------------------------------------------------------------------------


@pytest.mark.spark
def test_history_of_an_order_shows_each_update_and_the_rollback_that_undid_one(
    spark: Any, scenario: AuditScenario
) -> None:
    history = document_history(spark, scenario.target, scenario.order_key, collection=ORDERS)

    assert [v.operation for v in history] == [
        ChangeOperation.INSERT, ChangeOperation.UPDATE, ChangeOperation.UPDATE,
        ChangeOperation.UPDATE,
    ]
    assert [v.json_value() for v in history] == [*ORDER_VALUES, ORDER_VALUES[1]]
    assert [v.seqno for v in history] == [*scenario.order_seqnos, scenario.order_seqnos[1]]
    assert [v.commit_kind for v in history] == ["commit", "commit", "commit", "rollback"]
    assert [v.table_version for v in history] == sorted({v.table_version for v in history})
    assert all(v.vbucket == ROLLED and v.collection_path == ORDERS for v in history)
    (now,) = [r for r in scenario.bucket.documents(collection=ORDERS)
              if r.key.decode() == scenario.order_key]
    assert (history[-1].seqno, history[-1].cas) == (now.seqno, now.cas)


@pytest.mark.spark
def test_history_of_a_deleted_document_ends_with_a_delete_without_value(
    spark: Any, scenario: AuditScenario
) -> None:
    history = document_history(spark, scenario.target, scenario.deleted_key)

    assert [v.operation for v in history] == [ChangeOperation.INSERT, ChangeOperation.DELETE]
    assert history[0].json_value() == {"name": "Doomed"}
    assert (history[-1].value, history[-1].seqno, history[-1].cas) == (None, None, None)
    assert history[-1].table_version > history[0].table_version


@pytest.mark.spark
def test_history_asks_which_collection_when_the_key_is_in_two(
    spark: Any, scenario: AuditScenario
) -> None:
    with pytest.raises(ConfigError, match=r"app\.orders, catalog\.products"):
        document_history(spark, scenario.target, scenario.order_key)
    shadow = document_history(spark, scenario.target, scenario.order_key,
                              collection="catalog.products")
    assert [(v.operation, v.json_value()) for v in shadow] == [
        (ChangeOperation.INSERT, {"sku": "shadow"})
    ]
    assert document_history(spark, scenario.target, "never-written") == []


# --- the mirror at a point ---------------------------------------------------------------------


@pytest.mark.spark
def test_as_of_a_version_and_its_commit_time_hold_the_producer_state_of_that_boundary(
    spark: Any, scenario: AuditScenario
) -> None:
    version_b = checkpoint_version(spark, scenario.target, ROLLED, scenario.boundary_b)
    committed = resolve_version(spark, scenario.target, version=version_b).committed_at

    by_version = mirror_as_of(spark, scenario.target, version=version_b)
    by_time = resolve_version(spark, scenario.target, timestamp=committed)

    assert by_time.version == version_b
    assert_rows_equal(spark, by_version.where(f"vbucket = {ROLLED}"),
                      scenario.bucket.state_at(ROLLED, scenario.boundary_b))
    as_text = mirror_as_of(spark, scenario.target, timestamp=committed.isoformat())
    assert as_text.count() == by_version.count()


@pytest.mark.spark
def test_as_of_the_abandoned_branch_shows_what_the_producer_held_before_the_failover(
    spark: Any, scenario: AuditScenario
) -> None:
    version_c = checkpoint_version(spark, scenario.target, ROLLED, scenario.boundary_c)

    abandoned = mirror_as_of(spark, scenario.target, version=version_c)

    assert_rows_equal(spark, abandoned.where(f"vbucket = {ROLLED}"), scenario.abandoned_state)


@pytest.mark.spark
@pytest.mark.parametrize("step", ["a", "b", "d", "beyond"])
def test_at_source_seqno_equals_the_producer_state_at_that_committed_boundary(
    spark: Any, scenario: AuditScenario, step: str
) -> None:
    asked, boundary_seqno = {
        "a": (scenario.boundary_a, scenario.boundary_a),
        "b": (scenario.boundary_b, scenario.boundary_b),
        "d": (scenario.boundary_d, scenario.boundary_d),
        "beyond": (scenario.boundary_d + 5, scenario.boundary_d),
    }[step]
    boundary = resolve_source_seqno(spark, scenario.target, ROLLED, asked)

    rows = mirror_at_source_seqno(spark, scenario.target, ROLLED, asked)

    assert boundary.seqno == boundary_seqno
    assert_rows_equal(spark, rows, scenario.bucket.state_at(ROLLED, boundary_seqno))
    assert {r["vbucket"] for r in rows.select("vbucket").distinct().collect()} == {ROLLED}


@pytest.mark.spark
def test_at_source_seqno_follows_the_live_history_not_the_abandoned_branch(
    spark: Any, scenario: AuditScenario
) -> None:
    version_c = checkpoint_version(spark, scenario.target, ROLLED, scenario.boundary_c)

    boundary = resolve_source_seqno(spark, scenario.target, ROLLED, scenario.boundary_c)

    # boundary_c was committed, then abandoned; on the live history the newest boundary at or
    # below it is the first write after the failover.
    assert boundary.seqno == scenario.boundary_d <= scenario.boundary_c
    assert boundary.table_version > version_c
    assert boundary.vbucket_uuid == scenario.bucket.failover_log(ROLLED).newest.vbucket_uuid
    with pytest.raises(VersionOutOfRangeError, match="no committed boundary at or below"):
        resolve_source_seqno(spark, scenario.target, ROLLED, scenario.boundary_a - 1)


# --- changes and rollbacks ---------------------------------------------------------------------


@pytest.mark.spark
def test_changes_between_versions_and_between_their_times_agree(
    spark: Any, scenario: AuditScenario
) -> None:
    # From just after the first update to just before the rollback: all of step C.
    start = checkpoint_version(spark, scenario.target, ROLLED, scenario.boundary_b) + 1
    end = rollbacks(spark, scenario.target)[0].table_version - 1
    times = {v: resolve_version(spark, scenario.target, version=v).committed_at
             for v in (start, end)}

    by_version = changes_between(spark, scenario.target, start, end)
    by_time = changes_between(spark, scenario.target, times[start], times[end].isoformat())

    changed = {(r["key"], r["_change_type"]) for r in by_version.collect()}
    assert (scenario.order_key, "update_postimage") in changed
    assert (scenario.deleted_key, "delete") in changed
    assert sorted(by_version.collect(), key=repr) == sorted(by_time.collect(), key=repr)
    assert changes_between(spark, scenario.target, datetime(2001, 1, 1, tzinfo=UTC),
                           datetime(2001, 1, 2, tzinfo=UTC)).count() == 0


@pytest.mark.spark
def test_rollbacks_lists_the_failover_with_its_boundaries_and_failover_log(
    spark: Any, scenario: AuditScenario
) -> None:
    version_b = checkpoint_version(spark, scenario.target, ROLLED, scenario.boundary_b)

    (record,) = rollbacks(spark, scenario.target)

    assert (record.kind, record.vbucket) == ("rollback", ROLLED)
    assert (record.from_seqno, record.to_seqno) == (scenario.boundary_c, scenario.boundary_b)
    assert record.rollback_seqno == scenario.boundary_b
    assert record.from_table_version == version_b
    assert record.failover_log == scenario.bucket.failover_log(ROLLED)
    assert record.discarded_seqnos == LOST_WITH_FAILOVER
    assert f"rewound from seqno {scenario.boundary_c} to seqno {scenario.boundary_b}" in (
        record.explain()
    )


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.spark
def test_points_outside_the_history_are_refused_with_the_range_that_exists(
    spark: Any, scenario: AuditScenario
) -> None:
    latest = resolve_version(spark, scenario.target, timestamp=datetime.now(UTC)).version

    with pytest.raises(VersionOutOfRangeError, match=f"versions 0 to {latest}"):
        mirror_as_of(spark, scenario.target, version=latest + 1)
    with pytest.raises(VersionOutOfRangeError, match="before the oldest version"):
        mirror_as_of(spark, scenario.target, timestamp="2001-01-01T00:00:00Z")
    with pytest.raises(ConfigError, match="exactly one"):
        mirror_as_of(spark, scenario.target)
    with pytest.raises(ConfigError, match="invalid timestamp"):
        mirror_as_of(spark, scenario.target, timestamp="yesterday")


@pytest.mark.spark
def test_paths_that_are_not_mirrors_are_refused(spark: Any, tmp_path: Path) -> None:
    plain = str(tmp_path / "plain")
    spark.range(3).write.format("delta").save(plain)

    with pytest.raises(NotAMirrorError, match="not a replicator mirror"):
        rollbacks(spark, plain)
    with pytest.raises(NotAMirrorError, match="does not exist"):
        document_history(spark, str(tmp_path / "nothing"), "k")


@pytest.mark.spark
def test_vacuumed_versions_are_refused_and_history_starts_from_a_baseline(
    spark: Any, scenario: AuditScenario, tmp_path: Path
) -> None:
    copy = str(tmp_path / "vacuumed")
    shutil.copytree(scenario.target, copy)
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{copy}` LITE RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    version_b = checkpoint_version(spark, copy, ROLLED, scenario.boundary_b)

    with pytest.raises(VersionVacuumedError, match="VACUUM"):
        mirror_as_of(spark, copy, version=version_b)
    history = document_history(spark, copy, scenario.order_key, collection=ORDERS)
    assert [v.operation for v in history] == [ChangeOperation.BASELINE]
    assert history[0].json_value() == ORDER_VALUES[1]


# --- the command line --------------------------------------------------------------------------


def audit_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="replicator audit")
    add_audit_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.spark
def test_cli_history_json_and_rollbacks_table(
    spark: Any, scenario: AuditScenario, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_audit(audit_args("--target", scenario.target, "history", scenario.order_key,
                                "--collection", ORDERS, "--json"), spark=spark)
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [v["operation"] for v in document["versions"]] == [
        "insert", "update", "update", "update"
    ]
    assert json.loads(document["versions"][-1]["value"]) == ORDER_VALUES[1]

    run_audit(audit_args("--json", "--target", scenario.target, "at-seqno", str(ROLLED),
                         str(scenario.boundary_b), "--limit", "0"), spark=spark)
    at_b = json.loads(capsys.readouterr().out)
    expected = scenario.bucket.state_at(ROLLED, scenario.boundary_b)
    assert at_b["boundary_seqno"] == scenario.boundary_b
    assert sorted(d["key"] for d in at_b["documents"]) == sorted(r.key.decode() for r in expected)

    run_audit(audit_args("--target", scenario.target, "rollbacks"), spark=spark)
    text = capsys.readouterr().out
    assert f"vbucket {ROLLED} was rewound from seqno {scenario.boundary_c}" in text
    with pytest.raises(VersionOutOfRangeError):
        run_audit(audit_args("--target", scenario.target, "as-of", "--version", "9999"),
                  spark=spark)


def test_cli_parser_requires_one_way_of_saying_when() -> None:
    with pytest.raises(SystemExit):
        audit_args("--target", "/m", "as-of", "--version", "1", "--timestamp", "2026-01-01")
    args = audit_args("--target", "/m", "changes", "--from", "3", "--to", "2026-01-01T00:00Z")
    assert (args.audit_command, args.start, args.end, args.json) == (
        "changes", "3", "2026-01-01T00:00Z", False
    )


# --- pure logic, no Spark ----------------------------------------------------------------------


def change_row(version: int, change: str, seqno: int, doc: str) -> dict[str, Any]:
    return {
        "vbucket": 3, "scope": "app", "collection": "orders", "key": "o-1", "seqno": seqno,
        "rev_seqno": 1, "cas": seqno * 10, "flags": 0, "expiry": None, "is_json": True,
        "doc": doc, "value": None, "xattrs": None, "_change_type": change,
        "_commit_version": version,
        "_commit_timestamp": datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=version),
    }


def test_collapse_turns_feed_rows_into_versions_and_skips_unchanged_rewrites() -> None:
    rows = [
        change_row(1, "insert", 5, '{"a":1}'),
        change_row(2, "update_preimage", 5, '{"a":1}'),
        change_row(2, "update_postimage", 9, '{"a":2}'),
        # A rollback rewrote the vbucket without changing this document:
        change_row(3, "delete", 9, '{"a":2}'),
        change_row(3, "insert", 9, '{"a":2}'),
        change_row(4, "delete", 9, '{"a":2}'),
        change_row(6, "insert", 12, '{"a":3}'),
    ]

    versions = collapse_changes(rows, {1: "commit", 2: "commit", 4: "commit", 6: "resync"})

    assert [(v.table_version, v.operation, v.seqno, v.value, v.commit_kind) for v in versions] == [
        (1, ChangeOperation.INSERT, 5, '{"a":1}', "commit"),
        (2, ChangeOperation.UPDATE, 9, '{"a":2}', "commit"),
        (4, ChangeOperation.DELETE, None, None, "commit"),
        (6, ChangeOperation.INSERT, 12, '{"a":3}', "resync"),
    ]


def test_collapse_starts_from_a_baseline_row() -> None:
    rows = [change_row(7, "baseline", 4, '{"a":0}'), change_row(8, "delete", 4, '{"a":0}')]

    versions = collapse_changes(rows)

    assert [v.operation for v in versions] == [ChangeOperation.BASELINE, ChangeOperation.DELETE]


def test_diff_walks_nested_fields_and_tells_added_removed_changed_apart() -> None:
    def version(text: str | None) -> DocumentVersion:
        return DocumentVersion(1, datetime(2026, 1, 1, tzinfo=UTC), ChangeOperation.UPDATE,
                               "k", "app", "orders", 0, 1, 1, text)

    old = version('{"a": {"b": 1, "c": [1, 2]}, "gone": true, "n": null}')
    new = version('{"a": {"b": 2, "c": [1]}, "n": 0, "added": "x"}')

    changes = {(c.path, c.kind, c.before, c.after) for c in diff_documents(old, new)}

    assert changes == {
        ("a.b", FieldChangeKind.CHANGED, 1, 2),
        ("a.c[1]", FieldChangeKind.REMOVED, 2, None),
        ("gone", FieldChangeKind.REMOVED, True, None),
        ("n", FieldChangeKind.CHANGED, None, 0),
        ("added", FieldChangeKind.ADDED, None, "x"),
    }
    assert {c.kind for c in diff_documents(old, None)} == {FieldChangeKind.REMOVED}
    assert diff_documents(old, old) == []


def entry(version: int, minute: int, operation: str = "MERGE", **extra: Any) -> HistoryEntry:
    return HistoryEntry(
        version=version, timestamp=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=minute),
        operation=operation, parameters=extra.get("parameters", {}),
        metrics=extra.get("metrics", {}), user_metadata=extra.get("user_metadata"),
    )


def test_readable_versions_follow_vacuum_runs_and_their_retention() -> None:
    entries = [entry(v, v * 10) for v in range(6)]
    assert readable_versions(entries) == (0, 0)
    # VACUUM at minute 60 keeping 25 minutes: commits before minute 35 (versions 0-3) expired.
    vacuum = entry(6, 60, "VACUUM START", parameters={"specifiedRetentionMillis": "1500000"})
    assert readable_versions([*entries, vacuum]) == (3, 4)
    default = entry(6, 60, "VACUUM START", parameters={"defaultRetentionMillis": "604800000"})
    assert readable_versions([*entries, default]) == (0, 0)


def test_time_resolution_picks_the_newest_before_and_the_oldest_after() -> None:
    versions = [TableVersion(v, datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=v))
                for v in range(3)]
    moment = datetime(2026, 1, 1, 0, 1, 30, tzinfo=UTC)

    assert version_at(versions, moment) == 1
    assert first_version_from(versions, moment) == 2
    assert version_at(versions, datetime(2025, 1, 1, tzinfo=UTC)) is None
    assert parse_moment("2026-01-01T00:01:30Z") == moment
    assert parse_moment("2026-01-01T00:01:30") == moment  # naive text means UTC


def test_rollback_records_and_activity_come_from_commit_metadata() -> None:
    def metadata(kind: str, seqno: int, **details: Any) -> str:
        from replicator.dcp.positions import VbucketPosition

        return CommitMetadata(kind, 1, 0, "vb0-3", "merge",
                              {2: VbucketPosition.at_boundary(2, 77, seqno)}, details).to_json()

    commit = entry(1, 1, metrics={"numTargetRowsInserted": "4", "numTargetRowsUpdated": "1"},
                   user_metadata=metadata("commit", 30))
    rollback = entry(2, 2, "WRITE", metrics={"numOutputRows": "3", "numDeletedRows": "5"},
                     user_metadata=metadata(
                         "rollback", 20, vbucket=2, from_seqno=30, to_seqno=20, rollback_seqno=22,
                         from_table_version=0, failover_log=[[99, 22], [77, 0]], reason="why"))
    after = entry(3, 3, user_metadata=metadata("commit", 26))
    foreign = entry(4, 4, "OPTIMIZE")

    record = rollback_record(rollback)
    activity = commit_activities([foreign, after, rollback, commit])

    assert rollback_record(commit) is None and rollback_record(foreign) is None
    assert record is not None
    assert (record.vbucket, record.from_seqno, record.to_seqno, record.rollback_seqno) == (
        2, 30, 20, 22
    )
    assert record.failover_log is not None and record.failover_log.as_pairs() == [(99, 22), (77, 0)]
    assert [(a.table_version, a.rows_inserted, a.rows_updated, a.rows_deleted,
             a.source_changes) for a in activity] == [
        (1, 4, 1, 0, 30), (2, 3, 0, 5, 0), (3, 0, 0, 0, 6), (4, 0, 0, 0, None)
    ]
