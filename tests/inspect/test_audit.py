"""The audit surface (issue 10) against a scripted history on the embedded producer.

One live replication mirrors a scenario whose every step is known: an order updated twice, a
user deleted, then a failover of the order's vbucket that loses the second update, so the
mirror rolls back. The answers are checked against the producer's own history
(`SimBucket.state_at` at committed boundaries) and, for the branch the failover abandoned,
against what the producer held before the failover. The pure parts are tested without Spark.
At the end, delta-rs reads the same mirror and must see what Spark sees.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable

from replicator.cli.audit import add_audit_arguments, run_audit
from replicator.cli.main import main as replicator_main
from replicator.delta.commit_metadata import CommitMetadata, rollback_details
from replicator.delta.reader import HistoryEntry
from replicator.delta.schema import DATA_COLUMNS, MirrorLayout
from replicator.errors import ConfigError, NotAMirrorError
from replicator.inspect.commits import commit_activities, rollback_records, rollbacks
from replicator.inspect.documents import (
    ChangeOperation,
    DocumentVersion,
    FieldChangeKind,
    collapse_changes,
    diff_documents,
    document_history,
)
from replicator.inspect.mirror_history import VersionOutOfRangeError, VersionVacuumedError
from replicator.inspect.time_travel import (
    changes_between,
    mirror_as_of,
    mirror_at_source_seqno,
    resolve_source_seqno,
    resolve_version,
)
from replicator.inspect.versions import (
    TableVersion,
    first_version_from,
    parse_moment,
    readable_versions,
    version_at,
)
from replicator.sim.bucket import Delete, DocumentRecord, SimBucket, Upsert
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import initial_load
from replicator.soak.audit import expected_row
from tests.mirror_check import expected_frame
from tests.replication_runs import BackgroundReplication, replicator_settings

VBUCKETS = 2
ROLLED = 1
"""The vbucket that fails over; the audited order lives in it."""
OTHER = 0
"""The other vbucket: the doomed user lives there, so step C commits in both."""
ORDERS = "app.orders"
ORDER_VALUES = (
    {"status": "new", "total": 10.5, "items": [{"sku": "a1"}]},
    {"status": "paid", "total": 10.5, "items": [{"sku": "a1"}]},
    {"status": "shipped", "total": 10.5, "items": [{"sku": "a1"}], "carrier": "DHL"},
)
LOST_WITH_FAILOVER = 3
"""Step C writes three items into the rolled vbucket: the failover loses exactly those."""
STEP_WAIT_S = 300.0
"""Upper bound on one step's commit (the first one may warm up a cold JVM on a busy machine)."""


# --- the scenario -------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditScenario:
    """A mirror with a known history, and what the producer said at each step."""

    target: str
    bucket: SimBucket
    order_key: str
    deleted_key: str
    late_keys: tuple[str, ...]
    """The two documents step C inserts into the rolled vbucket (lost with the failover)."""
    order_seqnos: tuple[int, int, int]
    boundary_a: int
    """Seqno of the rolled vbucket after the initial load."""
    boundary_b: int
    """... after the first update (the branch point the rollback returns to)."""
    boundary_c: int
    """... after the second update and two more documents (lost with the failover)."""
    boundary_d: int
    """... after one write on the new branch."""
    high_seqnos_b: Mapping[int, int]
    """Every vbucket's high seqno at step B: the whole mirror at B's table version."""
    abandoned_state: tuple[DocumentRecord, ...]
    """The rolled vbucket at boundary_c, as the producer held it before the failover."""

    def state_at_b(self) -> list[DocumentRecord]:
        """The producer's documents, all vbuckets, when the mirror committed step B."""
        return [record for vb, seqno in self.high_seqnos_b.items()
                for record in self.bucket.state_at(vb, seqno)]


def audit_scenario(spark: Any, root: Path) -> AuditScenario:
    """Build the scenario mirror (once, through the module fixture `scenario`, which the delta-rs
    tests at the end read too).

    One continuous run (a restart would claim and release the vbuckets again) commits each
    step before the next is written: the load, B, C, the rollback and D, five data commits
    when each step's vbuckets commit together. Small on purpose: the commits are the cost.
    """
    target = root / "mirror"
    bucket = SimBucket("shop", num_vbuckets=VBUCKETS, seed=10)
    initial_load(bucket, docs=24, doc_size=160, seed=10, evict_checkpoints=False)
    (order,) = bucket.keys_in_vbucket(ROLLED, 1, "order-audit")
    (doomed,) = bucket.keys_in_vbucket(OTHER, 1, "user-doomed")
    late = tuple(bucket.keys_in_vbucket(ROLLED, 2, "late"))
    (after_failover,) = bucket.keys_in_vbucket(ROLLED, 1, "after-failover")
    # Another document under the same key in another collection: history must ask which.
    items = bucket.apply_batch([
        Upsert(order, ORDER_VALUES[0], collection=ORDERS),
        Upsert(order, {"sku": "shadow"}, collection="catalog.products"),
        Upsert(doomed, {"name": "Doomed"}, collection="app.users"),
    ])
    seqnos = [items[0].by_seqno]
    bucket.evict_checkpoints()
    with SimCluster(bucket, nodes=1) as cluster, BackgroundReplication(
        spark, replicator_settings(cluster, target, until_caught_up=False)
    ) as live:

        def committed(step: str) -> dict[int, int]:
            """Wait until the mirror committed every vbucket's high seqno; returns them."""
            highs = bucket.high_seqnos()
            live.wait_for(lambda: dict(live.progress.committed) == highs,
                          f"step {step} to be committed ({highs})", timeout=STEP_WAIT_S)
            return highs

        boundary_a = committed("A")[ROLLED]
        seqnos.append(bucket.upsert(order, ORDER_VALUES[1], collection=ORDERS).by_seqno)
        highs_b = committed("B")
        step_c = bucket.apply_batch([
            Upsert(order, ORDER_VALUES[2], collection=ORDERS),
            Delete(doomed, collection="app.users"),
            *(Upsert(key, {"late": key}) for key in late),
        ])
        seqnos.append(step_c[0].by_seqno)
        boundary_c = committed("C")[ROLLED]
        assert boundary_c == highs_b[ROLLED] + LOST_WITH_FAILOVER
        abandoned = tuple(bucket.state_at(ROLLED, boundary_c))
        cluster.failover(ROLLED, lose_last=LOST_WITH_FAILOVER)
        bucket.upsert(after_failover, {"branch": 2})
        # The rolled vbucket's committed seqno goes C -> B (rollback) -> B + 1 (D): it only
        # equals the new high seqno once the write on the new branch is committed.
        highs_d = committed("D")
        summary = live.finish(highs_d)
    assert (summary.rollbacks, summary.full_resyncs) == (1, 0)
    return AuditScenario(
        target=str(target), bucket=bucket, order_key=order, deleted_key=doomed, late_keys=late,
        order_seqnos=(seqnos[0], seqnos[1], seqnos[2]), boundary_a=boundary_a,
        boundary_b=highs_b[ROLLED], boundary_c=boundary_c, boundary_d=highs_d[ROLLED],
        high_seqnos_b=highs_b, abandoned_state=abandoned,
    )


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


def step_c_changes(scenario: AuditScenario) -> set[tuple[str, str]]:
    """(key, change type) of every feed row step C left: all it wrote, nothing else."""
    return {
        (scenario.order_key, "update_preimage"), (scenario.order_key, "update_postimage"),
        (scenario.deleted_key, "delete"),
        *((key, "insert") for key in scenario.late_keys),
    }


def step_c_versions(spark: Any, scenario: AuditScenario) -> tuple[int, int]:
    """From just after the first update's commit to just before the rollback: all of step C."""
    start = checkpoint_version(spark, scenario.target, ROLLED, scenario.boundary_b) + 1
    return start, rollbacks(spark, scenario.target)[0].table_version - 1


def document_cells(record: DocumentRecord) -> tuple[Any, ...]:
    """What `audit ... --json` prints of a document, from the producer's record."""
    row = expected_row(record)
    return (row[0], row[1], row[2], row[4], row[5], row[7], row[11])


def printed_cells(document: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(document[name] for name in
                 ("vbucket", "scope", "collection", "key", "seqno", "cas", "doc"))


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
    # Each version carries the commit time of the table version that made it.
    assert [v.committed_at for v in history] == [
        resolve_version(spark, scenario.target, version=v.table_version).committed_at
        for v in history
    ]
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
    start, end = step_c_versions(spark, scenario)
    times = {v: resolve_version(spark, scenario.target, version=v).committed_at
             for v in (start, end)}

    by_version = changes_between(spark, scenario.target, start, end)
    by_time = changes_between(spark, scenario.target, times[start], times[end].isoformat())

    rows = by_version.collect()
    assert sorted((r["key"], r["_change_type"]) for r in rows) == sorted(step_c_changes(scenario))
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


def vacuumed_copy(spark: Any, scenario: AuditScenario, tmp_path: Path) -> tuple[str, int]:
    """A copy of the scenario mirror with every file no longer current vacuumed, and the
    (vacuumed) table version of step B."""
    copy = str(tmp_path / "vacuumed")
    shutil.copytree(scenario.target, copy)
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{copy}` LITE RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    return copy, checkpoint_version(spark, copy, ROLLED, scenario.boundary_b)


@pytest.mark.spark
def test_vacuumed_versions_are_refused_and_history_starts_from_a_baseline(
    spark: Any, scenario: AuditScenario, tmp_path: Path
) -> None:
    copy, version_b = vacuumed_copy(spark, scenario, tmp_path)

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


@pytest.mark.spark
def test_cli_as_of_and_changes_answer_what_the_producer_held_and_wrote(
    spark: Any, scenario: AuditScenario, capsys: pytest.CaptureFixture[str]
) -> None:
    version_b = checkpoint_version(spark, scenario.target, ROLLED, scenario.boundary_b)
    committed = resolve_version(spark, scenario.target, version=version_b).committed_at
    expected = sorted(document_cells(record) for record in scenario.state_at_b())

    for when in (("--version", str(version_b)), ("--timestamp", committed.isoformat())):
        code = run_audit(audit_args("--target", scenario.target, "as-of", *when, "--json",
                                    "--limit", "0"), spark=spark)
        answer = json.loads(capsys.readouterr().out)
        assert code == 0
        assert answer["version"] == version_b, when
        assert (answer["rows"], answer["shown"]) == (len(expected), len(expected)), when
        assert sorted(printed_cells(d) for d in answer["documents"]) == expected, when

    start, end = step_c_versions(spark, scenario)
    code = run_audit(audit_args("--json", "--target", scenario.target, "changes", "--from",
                                str(start), "--to", str(end), "--limit", "0"), spark=spark)
    changes = json.loads(capsys.readouterr().out)
    assert code == 0
    printed = [(d["key"], d["_change_type"]) for d in changes["documents"]]
    assert sorted(printed) == sorted(step_c_changes(scenario))
    # Within a version, a document's old image comes before its new one.
    assert [change for key, change in printed if key == scenario.order_key] == [
        "update_preimage", "update_postimage"
    ]


def test_cli_audit_without_a_target_says_so_in_one_line_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = replicator_main(["audit", "rollbacks"])

    captured = capsys.readouterr()
    assert code == 2
    (line,) = captured.err.splitlines()
    assert line.startswith("replicator: ") and "--target" in line
    assert captured.out == "" and "Traceback" not in captured.err


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
        from replicator.model.positions import VbucketPosition

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

    [record] = rollback_records(rollback)
    activity = commit_activities([foreign, after, rollback, commit])

    assert rollback_records(commit) == [] and rollback_records(foreign) == []
    assert (record.vbucket, record.from_seqno, record.to_seqno, record.rollback_seqno) == (
        2, 30, 20, 22
    )
    assert record.failover_log is not None and record.failover_log.as_pairs() == [(99, 22), (77, 0)]
    assert [(a.table_version, a.rows_inserted, a.rows_updated, a.rows_deleted,
             a.source_changes) for a in activity] == [
        (1, 4, 1, 0, 30), (2, 3, 0, 5, 0), (3, 0, 0, 0, 6), (4, 0, 0, 0, None)
    ]


def test_a_commit_that_rolls_back_several_vbuckets_gives_each_its_record() -> None:
    from replicator.model.positions import VbucketPosition

    facts = [
        {"vbucket": vb, "from_seqno": 30 + vb, "to_seqno": 20 + vb, "rollback_seqno": 25 + vb,
         "from_table_version": vb, "failover_log": [[90 + vb, 25 + vb], [77, 0]],
         "reason": f"why {vb}"}
        for vb in (7, 2)
    ]  # fmt: skip
    positions = {vb: VbucketPosition.at_boundary(vb, 90 + vb, 20 + vb) for vb in (2, 7)}
    text = CommitMetadata("rollback", 4, 0, "vb0-7", "replace", positions,
                          rollback_details(facts)).to_json()
    parsed = CommitMetadata.from_json(text)
    assert parsed is not None and sorted(parsed.vbucket_details()) == [2, 7]

    records = rollback_records(entry(5, 5, "MERGE", user_metadata=text))

    assert [(r.vbucket, r.from_seqno, r.to_seqno, r.rollback_seqno, r.from_table_version,
             r.reason, r.table_version) for r in records] == [
        (2, 32, 22, 27, 2, "why 2", 5), (7, 37, 27, 32, 7, "why 7", 5)
    ]
    assert [r.failover_log.as_pairs() for r in records if r.failover_log] == [
        [(92, 27), (77, 0)], [(97, 32), (77, 0)]
    ]
    # One vbucket keeps the flat form every earlier release wrote and read.
    assert rollback_details(facts[:1]) == facts[0]


# --- other engines: delta-rs (`deltalake`) reads the mirror exactly as Spark does -------------
# The mirror is this module's scenario (built once, for both parts): MERGEs that left
# deletion vectors, a rollback that rewrote a vbucket, and the replicator's own tables. The data
# table has deletion vectors enabled, which delta-rs's pyarrow-dataset path
# (`to_pyarrow_table`) refuses, so it is read with `DeltaTable.scan()` (delta-rs's own engine);
# the metadata tables have no deletion vectors and are read with `to_pyarrow_table()`. delta-rs's
# change data feed matches Spark's except on rollback commits (a strict xfail below records why).


def engine_neutral(value: Any) -> Any:
    """One cell as plain Python, the same whichever engine produced it."""
    if isinstance(value, datetime):
        # PySpark gives naive local time, delta-rs aware UTC.
        return value.astimezone(UTC)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return tuple(sorted((k, engine_neutral(v)) for k, v in value.items()))
    if hasattr(value, "asDict"):
        return engine_neutral(value.asDict())
    if isinstance(value, list):
        return tuple(engine_neutral(v) for v in value)
    return value


def spark_rows(frame: Any, columns: list[str]) -> list[tuple[Any, ...]]:
    rows = (tuple(engine_neutral(row[c]) for c in columns) for row in frame.collect())
    return sorted(rows, key=repr)


def arrow_rows(table: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    records = table.select(columns).to_pylist()
    return sorted((tuple(engine_neutral(r[c]) for c in columns) for r in records), key=repr)


def scanned(table: DeltaTable) -> pa.Table:
    """All rows through delta-rs's own engine (applies deletion vectors)."""
    return pa.RecordBatchReader.from_stream(table.scan()).read_all()


@pytest.mark.spark
def test_the_scenario_left_deletion_vectors_for_delta_rs_to_apply(
    scenario: AuditScenario,
) -> None:
    vectors = pa.RecordBatchReader.from_stream(DeltaTable(scenario.target).deletion_vectors())

    assert vectors.read_all().num_rows >= 1


@pytest.mark.spark
def test_data_table_now_and_at_an_old_version_reads_the_same_in_both_engines(
    spark: Any, scenario: AuditScenario
) -> None:
    columns = list(DATA_COLUMNS)
    before_rollback = rollbacks(spark, scenario.target)[0].table_version - 1

    for version in (None, before_rollback):
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        expected = spark_rows(reader.load(scenario.target), columns)

        actual = arrow_rows(scanned(DeltaTable(scenario.target, version=version)), columns)

        assert actual == expected, f"version {version}"
        if version is None:
            assert len(actual) == len(scenario.bucket.documents())


@pytest.mark.spark
@pytest.mark.parametrize("table", ["checkpoints", "failover_logs", "owners"])
def test_metadata_tables_read_the_same_in_both_engines(
    spark: Any, scenario: AuditScenario, table: str
) -> None:
    path = getattr(MirrorLayout(scenario.target), table)
    frame = spark.read.format("delta").load(path)
    columns = frame.columns

    actual = arrow_rows(DeltaTable(path).to_pyarrow_table(), columns)

    assert actual == spark_rows(frame, columns)
    if table != "owners":  # the replication released its claim when it stopped
        assert actual, f"the scenario wrote no {table} rows"
    if table == "checkpoints":
        uuids = {row[columns.index("vbucket_uuid")] for row in actual}
        assert all(isinstance(uuid, Decimal) for uuid in uuids)


CDF_COLUMNS = [*DATA_COLUMNS, "_change_type", "_commit_version"]


def change_feeds(
    spark: Any, scenario: AuditScenario, *, rollback_commits: bool
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(Spark's, delta-rs's) change data feed rows of versions 1..latest: those of rollback
    commits, or those of every other commit."""
    latest = DeltaTable(scenario.target).version()
    rewrites = {r.table_version for r in rollbacks(spark, scenario.target)}
    version = CDF_COLUMNS.index("_commit_version")
    expected = spark_rows(changes_between(spark, scenario.target, 1, latest), CDF_COLUMNS)
    feed = DeltaTable(scenario.target).load_cdf(starting_version=1, ending_version=latest)
    actual = arrow_rows(pa.RecordBatchReader.from_stream(feed).read_all(), CDF_COLUMNS)
    expected, actual = (
        [row for row in rows if (row[version] in rewrites) == rollback_commits]
        for rows in (expected, actual)
    )
    return expected, actual


@pytest.mark.spark
def test_change_data_feed_reads_the_same_in_both_engines_outside_rollbacks(
    spark: Any, scenario: AuditScenario
) -> None:
    expected, actual = change_feeds(spark, scenario, rollback_commits=False)

    assert actual == expected
    assert {row[CDF_COLUMNS.index("_change_type")] for row in actual} >= {
        "insert", "update_preimage", "update_postimage", "delete"
    }


@pytest.mark.spark
def test_change_data_feed_of_a_rollback_commit_reads_the_same_in_both_engines(
    spark: Any, scenario: AuditScenario
) -> None:
    # A rollback is a MERGE of the difference. It was a replaceWhere over a partition whose file
    # had a deletion vector, whose feed deltalake 1.6.6 read wrong (it inverted the vector).
    expected, actual = change_feeds(spark, scenario, rollback_commits=True)

    assert expected, "the scenario has a rollback commit"
    assert actual == expected


# --- the read-side commands on delta-rs: the same answers as Spark, without a JVM -----------


@pytest.mark.spark
def test_both_engines_read_the_same_history(spark: Any, scenario: AuditScenario) -> None:
    from replicator.delta.reader import DeltaRsReader, SparkReader

    through_spark = SparkReader(spark).history(scenario.target)
    through_delta_rs = DeltaRsReader().history(scenario.target)

    # Timestamps included: delta-rs's are taken from the commit files, as Spark's are.
    assert through_delta_rs == through_spark
    assert {entry.operation for entry in through_spark} >= {"MERGE", "CREATE TABLE"}
    assert [entry.version for entry in through_spark] == list(range(len(through_spark)))


@pytest.mark.spark
def test_rollbacks_and_activity_are_the_same_with_either_engine(
    spark: Any, scenario: AuditScenario
) -> None:
    from replicator.inspect.commits import commit_activity

    expected = rollbacks(spark, scenario.target)

    assert rollbacks(None, scenario.target) == expected
    assert rollbacks(spark, scenario.target, engine="delta-rs") == expected
    assert [r.vbucket for r in expected] == [ROLLED]
    assert commit_activity(None, scenario.target) == commit_activity(spark, scenario.target)


def answers_by_engine(
    spark: Any, scenario: AuditScenario, question: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
) -> dict[tuple[str, tuple[str, ...]], str]:
    """`audit QUESTION` printed by each engine, as text and as JSON; asserts they agree."""
    answers = {}
    for engine in ("spark", "delta-rs"):
        for form in ((), ("--json",)):
            code = run_audit(audit_args("--target", scenario.target, "--engine", engine,
                                        *question, *form), spark=spark)
            assert code == 0
            answers[engine, form] = capsys.readouterr().out
    assert answers["delta-rs", ()] == answers["spark", ()], question
    assert answers["delta-rs", ("--json",)] == answers["spark", ("--json",)], question
    return answers


@pytest.mark.spark
def test_history_and_changes_answer_the_same_with_either_engine(
    spark: Any, scenario: AuditScenario, capsys: pytest.CaptureFixture[str]
) -> None:
    start, end = step_c_versions(spark, scenario)
    latest = DeltaTable(scenario.target).version()
    history = answers_by_engine(
        spark, scenario, ("history", scenario.order_key, "--collection", ORDERS), capsys
    )
    assert [v["operation"] for v in json.loads(history["delta-rs", ("--json",)])["versions"]] == [
        "insert", "update", "update", "update"
    ]
    for question in (
        ("changes", "--from", str(start), "--to", str(end), "--limit", "0"),
        ("changes", "--from", "1", "--to", str(latest), "--limit", "0"),
        ("changes", "--from", "1", "--to", str(latest), "--limit", "5"),
    ):
        answers = answers_by_engine(spark, scenario, question, capsys)
        assert json.loads(answers["delta-rs", ("--json",)])["rows"] > 0
    # Without a session, and without --engine, delta-rs answers the same.
    run_audit(audit_args("--target", scenario.target, "--json", "history", scenario.order_key,
                         "--collection", ORDERS))
    assert capsys.readouterr().out == history["delta-rs", ("--json",)]


@pytest.mark.spark
def test_a_change_feed_delta_rs_misreads_is_read_with_spark_unless_delta_rs_is_named(
    spark: Any, scenario: AuditScenario
) -> None:
    from dataclasses import replace

    from replicator.delta.reader import DeltaRsReader, SparkReader
    from replicator.inspect.mirror_history import MirrorHistory

    history = MirrorHistory.open(DeltaRsReader(), scenario.target)
    (rollback,) = rollbacks(None, scenario.target)
    assert history.delta_rs_misreads(history.oldest, history.latest) == []
    assert history.for_changes(history.oldest, history.latest, engine=None, spark=None) is history
    # The same rollback as an older replicator wrote it: a replaceWhere (operation WRITE).
    older = MirrorHistory(DeltaRsReader(), scenario.target, [
        replace(e, operation="WRITE") if e.version == rollback.table_version else e
        for e in history.entries
    ])
    v = rollback.table_version
    assert older.delta_rs_misreads(history.oldest, history.latest) == [v]
    assert older.delta_rs_misreads(history.oldest, v - 1) == []
    assert older.for_changes(v + 1, history.latest, engine=None, spark=spark) is older
    with pytest.raises(ConfigError, match=rf"versions {v} of .* drop --engine delta-rs"):
        older.for_changes(v, v, engine="delta-rs", spark=spark)
    through_spark = older.for_changes(v, v, engine=None, spark=spark)
    assert isinstance(through_spark.reader, SparkReader)
    assert through_spark.entries == older.entries


@pytest.mark.spark
def test_as_of_and_at_seqno_answer_the_same_with_either_engine(
    spark: Any, scenario: AuditScenario, capsys: pytest.CaptureFixture[str]
) -> None:
    version_b = checkpoint_version(spark, scenario.target, ROLLED, scenario.boundary_b)
    committed = resolve_version(spark, scenario.target, version=version_b).committed_at
    questions = [  # (question, rows shown at most: 0 for all)
        (("as-of", "--version", str(version_b), "--limit", "0"), 0),
        (("as-of", "--timestamp", committed.isoformat(), "--limit", "3"), 3),
        (("as-of", "--version", str(version_b - 1)), 20),
        (("at-seqno", str(ROLLED), str(scenario.boundary_b), "--limit", "0"), 0),
        (("at-seqno", str(ROLLED), str(scenario.boundary_d), "--limit", "2"), 2),
    ]
    for question, limit in questions:
        answers = answers_by_engine(spark, scenario, question, capsys)
        shown = json.loads(answers["delta-rs", ("--json",)])
        assert shown["rows"] > 0, question
        assert shown["shown"] == (min(shown["rows"], limit) if limit else shown["rows"])
    # At boundary B the rolled vbucket holds what the producer held then, row for row.
    run_audit(audit_args("--json", "--target", scenario.target, "at-seqno", str(ROLLED),
                         str(scenario.boundary_b), "--limit", "0"))
    at_b = json.loads(capsys.readouterr().out)
    expected = scenario.bucket.state_at(ROLLED, scenario.boundary_b)
    assert sorted(printed_cells(d) for d in at_b["documents"]) == sorted(
        document_cells(record) for record in expected
    )


@pytest.mark.spark
def test_delta_rs_names_a_vacuumed_version_as_spark_does(
    spark: Any, scenario: AuditScenario, tmp_path: Path
) -> None:
    from replicator.delta.reader import DeltaRsReader
    from replicator.inspect.mirror_history import MirrorHistory

    copy, version_b = vacuumed_copy(spark, scenario, tmp_path)
    history = MirrorHistory.open(DeltaRsReader(), copy)

    with pytest.raises(VersionVacuumedError, match=r"removed by VACUUM; versions from \d+ on"):
        history.rows(version_b, DATA_COLUMNS, order_by=("key",), limit=1)
    total, rows = history.rows(history.latest, ["key"], order_by=("key",), limit=0)
    assert total == rows.num_rows == len(scenario.bucket.documents())

    # A data file gone without a VACUUM in the log is found by listing the version's files.
    Path(DeltaTable(copy).file_uris()[0].removeprefix("file://")).unlink()
    with pytest.raises(VersionVacuumedError, match="1 data files of version"):
        MirrorHistory.open(DeltaRsReader(), copy).rows(
            history.latest, ["key"], order_by=("key",), limit=0
        )


@pytest.mark.spark
def test_each_engine_quotes_text_for_its_own_dialect(spark: Any, tmp_path: Path) -> None:
    from replicator.delta.reader import DeltaRsReader, SparkReader

    keys = ["plain", "it's", "back\\slash", "both\\'", "ünï ✓", "%_"]
    path = str(tmp_path / "keys")
    spark.createDataFrame([(k,) for k in keys], "key string").write.format("delta").save(path)

    for reader in (DeltaRsReader(), SparkReader(spark)):
        for key in keys:
            found = reader.read(path, ["key"], where=f"key = {reader.literal(key)}")
            assert found.column("key").to_pylist() == [key], (reader.engine, key)


def no_java_environment(tmp_path: Path) -> dict[str, str]:
    """The environment with no way to start a JVM: no java on PATH, JAVA_HOME pointing nowhere."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    # Only the Python interpreter's directory: `java` is not in it.
    python_dir = os.path.dirname(sys.executable)
    assert shutil.which("java", path=python_dir) is None
    return {**os.environ, "PATH": f"{python_dir}:{bin_dir}", "JAVA_HOME": str(tmp_path / "none"),
            "SPARK_HOME": str(tmp_path / "none")}


def run_replicator(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    from replicator.soak.process import replicator_command

    return subprocess.run([*replicator_command(), *argv], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.mark.spark
def test_status_and_audit_rollbacks_answer_without_a_jvm_and_print_only_the_answer(
    scenario: AuditScenario, tmp_path: Path
) -> None:
    env = no_java_environment(tmp_path)

    status = run_replicator(env, "status", "--target", scenario.target)
    audit = run_replicator(env, "audit", "--target", scenario.target, "rollbacks", "--json")
    as_of = run_replicator(env, "audit", "--target", scenario.target, "as-of", "--version", "1",
                           "--json")
    history = run_replicator(env, "audit", "--target", scenario.target, "--engine",
                             "delta-rs", "history", scenario.order_key, "--collection", ORDERS,
                             "--json")

    assert (status.returncode, status.stderr) == (0, "")
    assert status.stdout.startswith(f"mirror of bucket 'shop' at {scenario.target} ")
    assert status.stdout.splitlines()[1] == "health: ok (lag not checked: give --source)"
    assert (audit.returncode, audit.stderr) == (0, "")
    (record,) = json.loads(audit.stdout)["rollbacks"]
    assert (record["kind"], record["vbucket"]) == ("rollback", ROLLED)
    assert (as_of.returncode, as_of.stderr) == (0, "")
    assert json.loads(as_of.stdout)["version"] == 1
    assert (history.returncode, history.stderr) == (0, "")
    assert json.loads(history.stdout)["versions"][0]["operation"] == "insert"
