"""`replicator status`: reading a mirror's positions and rollbacks, and showing them."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from replicator.config import ReplicatorConfig, VbucketSelection
from replicator.delta.checkpoints import Checkpoint
from replicator.delta.ownership import OwnerRecord
from replicator.errors import ConfigError, NotAMirrorError
from replicator.inspect.formatting import align_columns
from replicator.inspect.mirror import LastRollback
from replicator.inspect.status import (
    MirrorStatus,
    OwnerStatus,
    SourceSeqnos,
    VbucketStatus,
    build_status,
    selected_vbuckets,
)
from replicator.model.positions import VbucketPosition

T0 = datetime(2026, 1, 31, 12, 0, 5, tzinfo=UTC)
T1 = datetime(2026, 1, 31, 12, 30, 0, tzinfo=UTC)


def vb_status(vb: int, seqno: int | None, *, high: int | None = None, **kw: Any) -> VbucketStatus:
    position = None if seqno is None else VbucketPosition.at_boundary(vb, 1000 + vb, seqno)
    committed = kw.pop("committed_at", T0 if seqno is not None else None)
    return VbucketStatus(vb, position, committed_at=committed, source_high_seqno=high, **kw)


def status_of(*vbuckets: VbucketStatus, with_source: bool = False, **kw: Any) -> MirrorStatus:
    return MirrorStatus(
        target="/lake/travel", bucket="travel", table_version=9, checked_at=T1,
        vbuckets=tuple(vbuckets), with_source=with_source, **kw,
    )


# --- showing it -----------------------------------------------------------------------------


def test_summary_line_adds_up_the_vbuckets_and_owners() -> None:
    rollback = LastRollback("rollback", T1, 7, to_seqno=40, from_seqno=55, reason="failover")
    status = status_of(
        vb_status(0, 120, high=130),
        vb_status(1, 40, high=40, rollbacks=2, last_rollback=rollback, committed_at=T1),
        vb_status(2, None, high=5),
        with_source=True,
        owners=(
            OwnerStatus("vb0-1", 2, "db1", 11, T1, live=True),
            OwnerStatus("old", 1, "db2", 12, T0, live=False),
        ),
    )
    assert status.summary() == (
        "mirror of bucket 'travel' at /lake/travel (table version 9): 2 of 3 vbuckets mirrored "
        "(1 never committed), 160 seqnos committed, last commit 2026-01-31 12:30:00Z, "
        "rollbacks 2, owners live 1, lag 15 seqnos in 2 vbuckets"
    )
    lines = status.render().splitlines()
    assert lines[0] == status.summary()
    # vbuckets 0 and 2 are behind and last committed 30 minutes ago (or never).
    assert lines[1] == (
        "health: stalled (vbuckets 0,2 are behind the source and committed nothing for more "
        "than 900 s)"
    )
    assert lines[2].startswith("  owner vb0-1 (2 vbuckets) on db1 pid 11")
    assert not any("owner old" in line for line in lines)
    header, *rows = lines[4:]
    assert header.split() == [
        "vbucket", "seqno", "vbucket", "uuid", "last", "commit", "rollbacks", "last", "rollback",
        "source", "high", "lag",
    ]
    assert rows[1].split()[:2] == ["1", "40"]
    assert "rollback 55->40 at 2026-01-31 12:30:00Z" in rows[1]
    assert rows[2].split() == ["2", "-", "-", "-", "0", "-", "5", "5"]
    # Aligned: every column starts at the same offset on every line.
    lag_column = header.index("lag")
    assert {row[lag_column:].strip() for row in rows} == {"10", "0", "5"}
    assert len({len(line) for line in [header, *rows]}) == 1


def test_a_mirror_ahead_of_the_source_shows_negative_lag_but_adds_none() -> None:
    status = status_of(vb_status(0, 50, high=45), vb_status(1, 10, high=12), with_source=True)
    assert [vb.lag for vb in status.vbuckets] == [-5, 2]
    assert status.lag == 2 and status.vbuckets_behind == 1


def test_without_a_source_there_is_no_lag_column() -> None:
    status = status_of(vb_status(0, 50))
    assert status.lag is None
    assert "lag" not in status.summary()
    assert "source high" not in status.render()


def test_many_vbuckets_in_identical_state_fold_into_ranges() -> None:
    vbuckets = [vb_status(vb, None, high=0) for vb in range(100)]
    vbuckets[50] = vb_status(50, 7, high=7)
    status = status_of(*vbuckets, with_source=True)
    labels = [line.split()[0] for line in status.render().splitlines()[4:]]
    assert labels == ["0-49", "50", "51-99"]
    unfolded = status.render(fold=False).splitlines()[4:]
    assert len(unfolded) == 100


def test_json_has_the_summary_and_every_vbucket() -> None:
    rollback = LastRollback("resync", T1, 7, to_seqno=0)
    status = status_of(
        vb_status(0, 120, high=130), vb_status(1, 3, rollbacks=1, last_rollback=rollback),
        with_source=True,
    )
    document = json.loads(status.to_json_text())
    assert document["summary"] == {
        "vbuckets": 2, "vbuckets_mirrored": 2, "never_committed": 0, "seqnos_committed": 123,
        "last_commit": T0.isoformat(), "rollbacks": 1, "owners_live": 0, "lag": 10,
        "vbuckets_behind": 1,
    }
    first, second = document["vbuckets"]
    assert (first["vbucket"], first["seqno"], first["vbucket_uuid"], first["lag"]) == (
        0, 120, 1000, 10
    )
    assert second["last_rollback"]["kind"] == "resync"
    assert second["last_rollback"]["from_seqno"] is None


def test_a_fully_mirrored_summary_names_no_never_committed_vbuckets() -> None:
    status = status_of(vb_status(0, 5), vb_status(1, 0))
    assert status.never_committed == 0
    assert "2 of 2 vbuckets mirrored, 5 seqnos committed" in status.summary()
    assert "never committed" not in status.summary()


def test_vbuckets_that_never_committed_fold_even_among_few() -> None:
    alike = [
        VbucketStatus(vb, VbucketPosition.at_boundary(vb, 7, 5), committed_at=T0) for vb in (0, 1)
    ]
    status = status_of(
        *alike, *(vb_status(vb, None) for vb in range(2, 10)),
        vb_status(10, None, rollbacks=1), vb_status(11, None),
    )

    def labels(text: str) -> list[str]:
        # After the summary, health, a gap and the header.
        return [line.split()[0] for line in text.splitlines()[4:]]

    # Committed vbuckets keep a row each below FOLD_ABOVE; a differing state breaks a run.
    assert labels(status.render()) == ["0", "1", "2-9", "10", "11"]
    assert labels(status.render(fold=False)) == [str(vb) for vb in range(12)]
    assert labels(status.render(fold=True)) == ["0-1", "2-9", "10", "11"]


# --- which vbuckets are reported (pure: claims, failover logs, checkpoints) ----------------


def claim_of(
    owner_id: str, vbuckets: Iterable[int], *, heartbeat_at: datetime = T1
) -> OwnerRecord:
    return OwnerRecord(
        owner_id=owner_id, claim_id=f"claim-{owner_id}", vbuckets=frozenset(vbuckets),
        host="db1", pid=11, lease=timedelta(minutes=2), claimed_at=T0, heartbeat_at=heartbeat_at,
    )


def checkpoint_of(vb: int, seqno: int, owner_id: str = "vb0-1023") -> Checkpoint:
    return Checkpoint(
        owner_id=owner_id, batch_id=1, table_version=3, kind="commit",
        position=VbucketPosition.at_boundary(vb, 1000 + vb, seqno), committed_at=T0,
    )


def built(
    *,
    checkpoints: Iterable[Checkpoint] = (),
    owners: Iterable[OwnerRecord] = (),
    streamed: Iterable[int] = (),
    source: SourceSeqnos | None = None,
    vbuckets: str | None = None,
) -> MirrorStatus:
    config = ReplicatorConfig(
        target="/lake/travel",
        vbuckets=VbucketSelection.parse(vbuckets) if vbuckets else VbucketSelection(),
    )
    return build_status(
        config, bucket="travel", table_version=9, checked_at=T1,
        checkpoints={c.vbucket: c for c in checkpoints}, rollbacks={}, owners=list(owners),
        streamed=streamed, source=source,
    )


def test_without_a_source_every_claimed_vbucket_is_reported() -> None:
    status = built(checkpoints=[checkpoint_of(700, 42)], owners=[claim_of("vb0-1023", range(1024))])

    assert [vb.vbucket for vb in status.vbuckets] == list(range(1024))
    assert (status.vbuckets_mirrored, status.never_committed) == (1, 1023)
    assert (
        "(table version 9): 1 of 1024 vbuckets mirrored (1023 never committed), 42 seqnos "
        "committed, last commit 2026-01-31 12:00:05Z, rollbacks 0, owners live 1"
    ) in status.summary()
    # The never-committed vbuckets fold around the one that committed.
    lines = status.render().splitlines()
    assert lines[1] == "health: ok (lag not checked: give --source)"
    assert lines[2].startswith("  owner vb0-1023 (1024 vbuckets)")
    assert lines[4].split()[0] == "vbucket"
    rows = [line.split() for line in lines[5:]]
    assert rows == [
        ["0-699", "-", "-", "-", "0", "-"],
        ["700", "42", "1700", "2026-01-31", "12:00:05Z", "0", "-"],
        ["701-1023", "-", "-", "-", "0", "-"],
    ]
    document = json.loads(status.to_json_text())
    assert (document["summary"]["vbuckets"], document["summary"]["vbuckets_mirrored"]) == (1024, 1)
    assert document["summary"]["never_committed"] == 1023
    assert len(document["vbuckets"]) == 1024
    never = document["vbuckets"][0]
    assert (never["vbucket"], never["seqno"], never["mirrored"], never["last_commit"]) == (
        0, 0, False, None
    )
    assert document["vbuckets"][700]["mirrored"] is True


def test_expired_claims_and_shards_count_and_so_do_streamed_vbuckets() -> None:
    status = built(
        checkpoints=[checkpoint_of(3, 9, "vb0-31")],
        owners=[
            claim_of("vb0-31", range(32)),
            claim_of("vb32-47", range(32, 48), heartbeat_at=T0),  # lease ran out long ago
        ],
        streamed=range(40, 64),  # a released claim's vbuckets, remembered by their failover logs
    )
    assert [vb.vbucket for vb in status.vbuckets] == list(range(64))
    assert "1 of 64 vbuckets mirrored (63 never committed)" in status.summary()
    assert status.owners_live == 1 and len(status.owners) == 2


def test_a_released_run_is_reported_from_its_failover_logs() -> None:
    status = built(checkpoints=[checkpoint_of(5, 9)], streamed=range(64))
    assert "1 of 64 vbuckets mirrored (63 never committed)" in status.summary()
    assert status.owners == ()


def test_with_nothing_claimed_or_streamed_only_committed_vbuckets_are_known() -> None:
    status = built(checkpoints=[checkpoint_of(5, 9)])
    assert [vb.vbucket for vb in status.vbuckets] == [5]
    assert "1 of 1 vbuckets mirrored," in status.summary()


def test_a_vbucket_selection_narrows_the_claimed_vbuckets() -> None:
    status = built(
        checkpoints=[checkpoint_of(700, 42)], owners=[claim_of("vb0-1023", range(1024))],
        vbuckets="0-9,700",
    )
    assert [vb.vbucket for vb in status.vbuckets] == [*range(10), 700]
    assert "1 of 11 vbuckets mirrored (10 never committed)" in status.summary()


def test_with_a_source_its_vbuckets_are_reported_not_the_claims() -> None:
    source = SourceSeqnos("travel", 8, {vb: 10 + vb for vb in range(8)})
    status = built(
        checkpoints=[checkpoint_of(2, 12)], owners=[claim_of("vb0-1023", range(1024))],
        streamed=range(1024), source=source,
    )
    assert [vb.vbucket for vb in status.vbuckets] == list(range(8))
    assert status.with_source and status.never_committed == 7
    assert "1 of 8 vbuckets mirrored (7 never committed), 12 seqnos committed" in status.summary()
    assert status.summary().endswith("lag 96 seqnos in 7 vbuckets")
    document = json.loads(status.to_json_text())
    assert (document["summary"]["never_committed"], len(document["vbuckets"])) == (7, 8)
    assert document["vbuckets"][0]["source_high_seqno"] == 10


def test_align_columns_pads_left_or_right() -> None:
    assert align_columns([("a", "1"), ("bbb", "22")], numeric=[1]) == ["a     1", "bbb  22"]


def test_vbucket_selection_of_status() -> None:
    config = ReplicatorConfig(target="/t")
    assert selected_vbuckets(config, {1, 2}, None) is None
    ranged = ReplicatorConfig(target="/t", vbuckets=VbucketSelection.parse("2-3"))
    assert selected_vbuckets(ranged, {0, 1}, None) == (2, 3)
    shard = ReplicatorConfig(target="/t", vbuckets=VbucketSelection.parse("2/2"))
    assert selected_vbuckets(shard, {0}, 8) == (4, 5, 6, 7)
    with pytest.raises(ConfigError, match="--source"):
        selected_vbuckets(shard, {0}, None)


# --- reading a real mirror ------------------------------------------------------------------


def read_with_both_engines(spark: Any, config: ReplicatorConfig) -> MirrorStatus:
    """read_status through Spark, after checking delta-rs reads exactly the same status."""
    from replicator.inspect.status import read_status

    now = datetime.now(UTC)
    through_spark = read_status(config, spark=spark, now=now)
    through_delta_rs = read_status(config, engine="delta-rs", now=now)
    assert through_delta_rs.to_json() == through_spark.to_json()
    assert through_delta_rs.render() == through_spark.render()
    return through_spark


class Crash(Exception):
    """Raised by the fault hook: the process 'dies' between a data commit and its checkpoint."""


@pytest.mark.spark
def test_status_reads_positions_rollbacks_and_uncheckpointed_commits(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replicator.delta.commit_metadata import ROLLBACK
    from replicator.delta.executor import CommitExecutor
    from replicator.delta.failover_logs import FailoverLogsTable
    from replicator.delta.ownership import OwnersTable
    from replicator.delta.schema import MirrorConfig
    from replicator.delta.table import open_or_create
    from replicator.model.positions import FailoverLog
    from tests.delta.helpers import UUID, batch, upsert, vbucket_commit

    target = str(tmp_path / "mirror")
    mirror = open_or_create(spark, target, MirrorConfig("travel"))
    owners = OwnersTable.of(mirror)
    claim = owners.claim(range(64), "status-writer")
    crash_after_data = {"on": False}

    def fault(step: str) -> None:
        if crash_after_data["on"] and step == "after_data_commit":
            raise Crash(step)

    executor = CommitExecutor(mirror, claim, owners, fault_hook=fault)
    changes = [upsert(0, "a", 1), upsert(0, "b", 2), upsert(1, "x", 3)]
    loaded = executor.execute(batch(1,
        vbucket_commit(0, changes, seqno=2, first_load=True),
        vbucket_commit(1, changes, seqno=3, first_load=True),
    ))
    executor.execute(batch(2, vbucket_commit(
        0, [upsert(0, "c", 5)], seqno=5, first_load=False, previous_seqno=2,
    )))
    executor.replace_rows(
        {0: VbucketPosition.at_boundary(0, UUID, 2)}, mirror.read(loaded.commits[0].table_version),
        batch_id=3, kind=ROLLBACK, rewound_to={0: 2},
        details={"from_seqno": 5, "to_seqno": 2, "reason": "producer requested rollback"},
    )
    crash_after_data["on"] = True
    with pytest.raises(Crash):
        executor.execute(batch(4, vbucket_commit(
            1, [upsert(1, "y", 7)], seqno=7, first_load=False, previous_seqno=3,
        )))

    status = read_with_both_engines(spark, ReplicatorConfig(target=target))

    assert status.bucket == "travel" and not status.with_source
    by_vb = {vb.vbucket: vb for vb in status.vbuckets}
    # Every claimed vbucket is reported; the 62 that never committed are counted as such.
    assert sorted(by_vb) == list(range(64))
    assert not by_vb[2].mirrored and by_vb[2].seqno == 0
    assert (status.vbuckets_mirrored, status.never_committed) == (2, 62)
    assert "2 of 64 vbuckets mirrored (62 never committed)" in status.summary()
    assert by_vb[0].seqno == 2 and by_vb[0].position is not None
    assert by_vb[0].position.vbucket_uuid == UUID
    assert by_vb[0].rollbacks == 1
    last = by_vb[0].last_rollback
    assert last is not None
    assert (last.kind, last.from_seqno, last.to_seqno) == ("rollback", 5, 2)
    assert last.reason == "producer requested rollback"
    # The crashed batch's data commit is the truth even though its checkpoint is missing.
    assert by_vb[1].seqno == 7 and by_vb[1].rollbacks == 0
    assert by_vb[1].table_version == status.table_version
    assert status.seqnos_committed == 9 and status.rollbacks == 1
    assert status.owners_live == 1 and status.owners[0].owner_id == "status-writer"
    assert status.render().splitlines()[0] == status.summary()

    selected = read_with_both_engines(
        spark, ReplicatorConfig(target=target, vbuckets=VbucketSelection.parse("1"))
    )
    assert [vb.vbucket for vb in selected.vbuckets] == [1]

    # With a source, its vbuckets are reported (not the claim's), never-committed ones counted.
    monkeypatch.setattr(
        "replicator.inspect.status.read_source_seqnos",
        lambda config: SourceSeqnos("travel", 4, {0: 2, 1: 7, 2: 1, 3: 0}),
    )
    sourced = read_with_both_engines(
        spark, ReplicatorConfig(source="couchbase://db1/travel", target=target)
    )
    assert [vb.vbucket for vb in sourced.vbuckets] == [0, 1, 2, 3]
    assert sourced.with_source and sourced.never_committed == 2
    assert "2 of 4 vbuckets mirrored (2 never committed)" in sourced.summary()
    monkeypatch.undo()

    # Released, the claim is gone from the owners table: only committed vbuckets are known,
    # unless the failover logs (saved when streams open) remember the rest.
    owners.release(claim)
    released = read_with_both_engines(spark, ReplicatorConfig(target=target))
    assert released.owners_live == 0 and [vb.vbucket for vb in released.vbuckets] == [0, 1]
    FailoverLogsTable.of(mirror).save({vb: FailoverLog.of([(UUID, 0)]) for vb in range(64)})
    streamed = read_with_both_engines(spark, ReplicatorConfig(target=target))
    assert (len(streamed.vbuckets), streamed.never_committed) == (64, 62)


@pytest.mark.spark
def test_open_mirror_refuses_what_is_not_a_mirror(spark: Any, tmp_path: Path) -> None:
    from replicator.delta.reader import DeltaRsReader
    from replicator.delta.schema import MirrorConfig
    from replicator.delta.table import open_or_create
    from replicator.inspect.mirror import check_mirror
    from replicator.inspect.mirror import open_mirror as open_with_spark

    def open_mirror(target: str, bucket: str | None = None) -> Any:
        """Open with Spark, after checking delta-rs accepts or refuses it the same way."""
        try:
            config = check_mirror(DeltaRsReader(), target, bucket=bucket)
        except NotAMirrorError as refused:
            with pytest.raises(NotAMirrorError) as also:
                open_with_spark(spark, target, bucket=bucket)
            assert str(also.value) == str(refused)
            raise
        opened = open_with_spark(spark, target, bucket=bucket)
        assert opened.config == config
        return opened

    with pytest.raises(NotAMirrorError, match="does not exist"):
        open_mirror(str(tmp_path / "nothing"))
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("hello")
    with pytest.raises(NotAMirrorError, match="holds no Delta table"):
        open_mirror(str(plain))
    foreign = str(tmp_path / "foreign")
    spark.range(2).write.format("delta").save(foreign)
    with pytest.raises(NotAMirrorError, match="not a replicator mirror"):
        open_mirror(foreign)
    other = str(tmp_path / "other")
    open_or_create(spark, other, MirrorConfig("beer-sample"))
    assert open_mirror(other).config.bucket == "beer-sample"
    with pytest.raises(NotAMirrorError, match="'beer-sample', not of 'travel'"):
        open_mirror(other, bucket="travel")
    # Reading never creates anything.
    assert not (tmp_path / "nothing").exists()
