"""The history table beside the mirror: revisions appended before the commit that applies them,
rows of commits that never landed left out by readers and removed on restart, rollbacks marked."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from replicator.cli.audit import add_audit_arguments, run_audit
from replicator.delta.executor import CommitExecutor
from replicator.delta.history import HistoryTable
from replicator.delta.ownership import OwnersTable
from replicator.delta.schema import MirrorConfig
from replicator.delta.table import MirrorTable, open_or_create
from replicator.inspect.revisions import has_history, revision_history
from tests.delta.helpers import batch, upsert, vbucket_commit

pytestmark = pytest.mark.spark


class Crash(Exception):
    pass


def audit_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="replicator audit")
    add_audit_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def mirror(spark: Any, tmp_path: Path) -> MirrorTable:
    return open_or_create(spark, str(tmp_path / "m"), MirrorConfig("travel", num_vbuckets=8))


def executor_of(mirror: MirrorTable, **kw: Any) -> CommitExecutor:
    owners = OwnersTable.of(mirror)
    claim = owners.claim(range(8), "writer")
    history = HistoryTable.of(mirror)
    history.ensure(mirror.config)
    return CommitExecutor(mirror, claim, owners, history=history, **kw)


def history_rows(spark: Any, mirror: MirrorTable) -> list[tuple[int, int, int, str]]:
    rows = spark.read.format("delta").load(mirror.layout.history).collect()
    return sorted((r["batch_id"], r["vbucket"], r["seqno"], r["op"]) for r in rows)


def test_revisions_of_history_ranges_land_with_their_batch(spark: Any, mirror: MirrorTable) -> None:
    executor = executor_of(mirror)
    changes = [upsert(1, "k", 1, '{"n":1}'), upsert(1, "k", 2, '{"n":2}'), upsert(1, "j", 3)]
    first = dataclasses.replace(
        vbucket_commit(1, changes, seqno=3, first_load=True), history_ranges=((2, 3),)
    )
    executor.execute(batch(1, first))
    assert history_rows(spark, mirror) == [(1, 1, 2, "upsert"), (1, 1, 3, "upsert")]
    later = dataclasses.replace(
        vbucket_commit(1, [upsert(1, "k", 4, '{"n":4}'), upsert(1, "k", 5, '{"n":5}')],
                       seqno=5, first_load=False, previous_seqno=3),
        history_ranges=((4, 5),),
    )  # fmt: skip
    executor.execute(batch(2, later))
    assert has_history(mirror.layout.data)
    revisions = revision_history(None, mirror.layout.data, "k")
    assert revisions is not None
    assert [(r.seqno, r.value) for r in revisions] == [
        (2, '{"n":2}'), (4, '{"n":4}'), (5, '{"n":5}')
    ]
    # The mirror holds the latest only; every revision is in the history.
    assert mirror.read().where("key = 'k'").select("seqno").collect()[0][0] == 5


def test_a_crash_before_the_data_commit_leaves_rows_readers_skip_and_restarts_remove(
    spark: Any, mirror: MirrorTable
) -> None:
    def crash_before_commit(step: str) -> None:
        if step == "before_data_commit":
            raise Crash(step)

    executor = executor_of(mirror)
    executor.execute(batch(1, dataclasses.replace(
        vbucket_commit(2, [upsert(2, "a", 1)], seqno=1, first_load=True), history_ranges=((1, 1),)
    )))  # fmt: skip
    crashing = CommitExecutor(
        mirror, executor.claim, executor.owners, history=executor.history,
        fault_hook=crash_before_commit,
    )
    doomed = dataclasses.replace(
        vbucket_commit(2, [upsert(2, "a", 2, '{"lost":1}')], seqno=2, first_load=False,
                       previous_seqno=1),
        history_ranges=((2, 2),),
    )  # fmt: skip
    with pytest.raises(Crash):
        crashing.execute(batch(2, doomed))
    assert (2, 2, 2, "upsert") in history_rows(spark, mirror)  # appended before the commit
    revisions = revision_history(None, mirror.layout.data, "a")
    assert revisions is not None and [r.seqno for r in revisions] == [1]

    HistoryTable.of(mirror).forget_uncommitted(crashing.claim.owner_id, 2)
    assert history_rows(spark, mirror) == [(1, 2, 1, "upsert")]


def test_a_failover_marks_each_of_its_vbuckets_in_one_append(
    spark: Any, mirror: MirrorTable
) -> None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from replicator.model.positions import VbucketPosition

    executor = executor_of(mirror)
    executor.execute(batch(1,
        vbucket_commit(5, [upsert(5, "f", 1)], seqno=1, first_load=True),
        vbucket_commit(6, [upsert(6, "g", 1), upsert(6, "h", 2)], seqno=2, first_load=True),
    ))  # fmt: skip
    loaded = mirror.version()
    executor.execute(batch(2,
        vbucket_commit(5, [upsert(5, "f", 2)], seqno=2, first_load=False, previous_seqno=1),
        vbucket_commit(6, [upsert(6, "g", 3)], seqno=3, first_load=False, previous_seqno=2),
    ))  # fmt: skip
    def history_version() -> int:
        entry = DeltaTable.forPath(spark, mirror.layout.history).history(1).first()
        assert entry is not None
        return int(entry["version"])

    before = history_version()
    executor.replace_rows(
        {5: VbucketPosition.at_boundary(5, 7, 1), 6: VbucketPosition.at_boundary(6, 7, 2)},
        mirror.read(loaded), batch_id=3, kind="rollback", rewound_to={5: 1, 6: 2},
    )  # fmt: skip
    assert history_version() == before + 1  # one append for the failover
    history = spark.read.format("delta").load(mirror.layout.history)
    markers = history.where((F.col("op") == "rollback") & (F.col("vbucket").isin(5, 6)))
    assert sorted((r["vbucket"], r["seqno"], r["batch_id"]) for r in markers.collect()) == [
        (5, 1, 3), (6, 2, 3)
    ]
    rows = mirror.read().where("vbucket IN (5, 6)").select("vbucket", "key", "seqno")
    assert sorted(map(tuple, rows.collect())) == [(5, "f", 1), (6, "g", 1), (6, "h", 2)]


def test_a_rollback_is_marked_and_the_discarded_revisions_kept(
    spark: Any, mirror: MirrorTable, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyspark.sql import functions as F

    from replicator.model.positions import VbucketPosition

    executor = executor_of(mirror)
    executor.execute(batch(1, dataclasses.replace(
        vbucket_commit(3, [upsert(3, "r", 1), upsert(3, "r", 2)], seqno=2, first_load=True),
        history_ranges=((1, 2),),
    )))  # fmt: skip
    executor.execute(batch(2, dataclasses.replace(
        vbucket_commit(3, [upsert(3, "r", 3)], seqno=3, first_load=False, previous_seqno=2),
        history_ranges=((3, 3),),
    )))  # fmt: skip
    old_rows = mirror.read(1).where("vbucket = 3")
    executor.replace_rows(
        {3: VbucketPosition.at_boundary(3, 0xFEEDFACECAFEBEEF, 2)}, old_rows, batch_id=3,
        kind="rollback", rewound_to={3: 2},
    )  # fmt: skip
    executor.execute(batch(4, dataclasses.replace(
        vbucket_commit(3, [upsert(3, "r", 3, '{"again":1}')], seqno=3, first_load=False,
                       previous_seqno=2),
        history_ranges=((3, 3),),
    )))  # fmt: skip
    history = spark.read.format("delta").load(mirror.layout.history)
    markers = history.where(F.col("op") == "rollback")
    assert [(r["vbucket"], r["seqno"], r["batch_id"]) for r in markers.collect()] == [(3, 2, 3)]
    revisions = revision_history(None, mirror.layout.data, "r")
    assert revisions is not None
    rollback_version = max(r.table_version for r in revisions if r.seqno == 2) + 2
    assert [(r.seqno, r.rolled_back_at) for r in revisions] == [
        (1, None), (2, None), (3, rollback_version), (3, None)
    ]
    assert revisions[-1].value == '{"again":1}'

    # The same from the command line: every revision, the discarded one marked.
    code = run_audit(audit_args("--target", mirror.layout.data, "history", "r"))
    text = capsys.readouterr().out
    assert code == 0
    assert "revisions of 'r': 4, 1 of them rolled back" in text
    assert f"at version {rollback_version}" in text
    run_audit(audit_args("--target", mirror.layout.data, "--json", "history", "r"))
    document = json.loads(capsys.readouterr().out)
    assert document["source"] == "history"
    assert [r["rolled_back_at"] for r in document["revisions"]] == [
        None, None, rollback_version, None
    ]
    run_audit(audit_args("--target", mirror.layout.data, "--json", "history", "r", "--committed"))
    committed = json.loads(capsys.readouterr().out)
    assert "versions" in committed and "source" not in committed
