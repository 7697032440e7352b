"""Heartbeats committed by delta-rs: the same row, the same fencing, races refused, and a table
Spark keeps reading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from replicator.delta.ownership import OwnerClaim, OwnersTable
from replicator.delta.schema import MirrorConfig
from replicator.delta.table import MirrorTable, open_or_create
from replicator.errors import OwnershipConflict
from tests.delta.test_ownership import LEASE, Clock

pytestmark = pytest.mark.spark


def _newest_commit(owners: OwnersTable) -> dict[str, Any]:
    from delta.tables import DeltaTable

    entry = DeltaTable.forPath(owners.spark, owners.path).history(1).collect()[0].asDict()
    return {"engine": str(entry["engineInfo"]), **json.loads(entry["userMetadata"])}


def _holders(owners: OwnersTable, vbuckets: set[int]) -> dict[str, Any]:
    return {r.claim_id: r.heartbeat_at for r in owners.records() if r.vbuckets & vbuckets}


def test_a_heartbeat_is_delta_rs_s_commit_of_the_claim_s_row_alone(mirror: MirrorTable) -> None:
    clock = Clock()
    owners = OwnersTable.of(mirror, clock=clock)
    claim = owners.claim([200, 201], lease=LEASE, host="a", pid=1)
    other = owners.claim([202], lease=LEASE, host="b", pid=2)
    claimed_at = clock.now
    clock.advance(17.000123)

    owners.heartbeat(claim)

    newest = _newest_commit(owners)
    assert newest["engine"].startswith("delta-rs")
    assert (newest["action"], newest["claim"]) == ("heartbeat", claim.claim_id)
    assert _holders(owners, {200, 202}) == {claim.claim_id: clock.now, other.claim_id: claimed_at}


def test_spark_heartbeats_when_asked(mirror: MirrorTable) -> None:
    clock = Clock()
    owners = OwnersTable.of(mirror, clock=clock, spark_heartbeats=True)
    claim = owners.claim([205], lease=LEASE, host="a", pid=1)
    clock.advance(5)
    owners.heartbeat(claim)
    assert _newest_commit(owners)["engine"].startswith("Apache-Spark")
    assert _holders(owners, {205}) == {claim.claim_id: clock.now}


def test_a_heartbeat_racing_the_claim_that_evicts_it_loses_and_is_not_resurrected(
    mirror: MirrorTable, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    taker = OwnersTable.of(mirror, clock=clock)
    taken: list[OwnerClaim] = []

    def evicted_meanwhile(step: str) -> None:
        if step == "before_renewal" and not taken:
            # The taker commits between the heartbeat's read of the table and its commit.
            taken.append(taker.claim([211, 212], lease=LEASE, host="node-b", pid=22))

    slow = OwnersTable.of(mirror, clock=clock, step_hook=evicted_meanwhile)
    old = slow.claim([210, 211], lease=LEASE, host="node-a", pid=11)
    clock.advance(61)  # its lease ran out

    with (
        caplog.at_level("INFO", logger="replicator.delta.conflicts"),
        pytest.raises(OwnershipConflict, match="taken over by owner 'vb211-212' on host node-b"),
    ):
        slow.heartbeat(old)

    # delta-rs refused the commit that read the evicted row's file; the retry found no row.
    assert "heartbeat of owner 'vb210-211' conflicted" in caplog.text
    assert "DeltaRsConflict" in caplog.text
    assert taken and _holders(taker, {210, 211, 212}) == {taken[0].claim_id: clock.now}


def test_heartbeats_of_two_claims_racing_both_land_without_a_retry(
    mirror: MirrorTable, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    first = OwnersTable.of(mirror, clock=clock)
    second_claims: list[OwnerClaim] = []
    second = OwnersTable.of(mirror, clock=clock)

    def the_other_beats_first(step: str) -> None:
        if step == "before_renewal" and second_claims:
            second.heartbeat(second_claims.pop())

    racing = OwnersTable.of(mirror, clock=clock, step_hook=the_other_beats_first)
    mine = racing.claim([220], lease=LEASE, host="a", pid=1)
    theirs = second.claim([221], lease=LEASE, host="b", pid=2)
    second_claims.append(theirs)
    clock.advance(30)

    with caplog.at_level("INFO", logger="replicator.delta.conflicts"):
        racing.heartbeat(mine)  # its commit lands after the other's, on the newer version

    assert not second_claims
    assert "conflicted" not in caplog.text  # rebased onto the other's commit, not retried
    assert _holders(first, {220, 221}) == {mine.claim_id: clock.now, theirs.claim_id: clock.now}


def test_spark_reads_the_owners_table_after_delta_rs_s_checkpoints(
    spark: Any, tmp_path: Path
) -> None:
    mirror = open_or_create(spark, str(tmp_path / "m"), MirrorConfig("b", num_vbuckets=8))
    clock = Clock()
    owners = OwnersTable.of(mirror, clock=clock)
    claim = owners.claim([0, 1], lease=LEASE, host="a", pid=1)
    for _ in range(101):  # delta-rs checkpoints every 100 versions
        clock.advance(1)
        owners.heartbeat(claim)

    assert list((Path(owners.path) / "_delta_log").glob("*.checkpoint.parquet"))
    assert _holders(OwnersTable.of(mirror), {0}) == {claim.claim_id: clock.now}
    clock.advance(LEASE.total_seconds() + 1)
    owners.verify(claim)  # an expired lease nobody took: renewed, as Spark reads it
    assert _holders(OwnersTable.of(mirror), {0}) == {claim.claim_id: clock.now}
