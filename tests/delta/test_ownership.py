"""One writer per vbucket: claims, conflicts, takeover after the lease, fencing, races."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from replicator.delta.ownership import OwnerRecord, OwnersTable
from replicator.delta.table import MirrorTable
from replicator.errors import OwnershipConflict

pytestmark = pytest.mark.spark

LEASE = timedelta(seconds=60)


class Clock:
    """A clock tests move by hand instead of sleeping."""

    def __init__(self) -> None:
        self.now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def test_overlapping_claim_of_a_live_owner_is_refused_with_who_holds_it(
    mirror: MirrorTable,
) -> None:
    clock = Clock()
    owners = OwnersTable.of(mirror, clock=clock)
    first = owners.claim(range(100, 104), lease=LEASE, host="node-a", pid=11)
    clock.advance(30)
    with pytest.raises(OwnershipConflict) as caught:
        owners.claim([103, 104], lease=LEASE, host="node-b", pid=22)
    message = str(caught.value)
    assert "vbuckets 103 held by owner 'vb100-103' on host node-a pid 11" in message
    assert "last seen 2026-03-01T12:00:00+00:00 (30s ago" in message
    # A disjoint claim is fine, and the refused one left nothing behind.
    other = owners.claim([104, 105], lease=LEASE, host="node-b", pid=22)
    holders = {r.claim_id: r.vbuckets for r in owners.records() if r.vbuckets & {103, 104, 105}}
    assert holders == {first.claim_id: frozenset(range(100, 104)), other.claim_id: {104, 105}}


def test_same_owner_id_twice_is_refused_even_without_overlap(mirror: MirrorTable) -> None:
    owners = OwnersTable.of(mirror, clock=Clock())
    owners.claim([110], "shard-7", lease=LEASE, host="a", pid=1)
    with pytest.raises(OwnershipConflict, match="owner id 'shard-7' held by"):
        owners.claim([111], "shard-7", lease=LEASE, host="b", pid=2)


def test_takeover_after_the_lease_fences_the_old_owner(mirror: MirrorTable) -> None:
    clock = Clock()
    owners = OwnersTable.of(mirror, clock=clock)
    old = owners.claim([120, 121], lease=LEASE, host="node-a", pid=11)
    clock.advance(20)
    owners.heartbeat(old)
    clock.advance(59)  # 79s after the claim, 59s after the heartbeat: still live
    with pytest.raises(OwnershipConflict):
        owners.claim([121], lease=LEASE, host="node-b", pid=22)
    clock.advance(2)
    new = owners.claim([121, 122], lease=LEASE, host="node-b", pid=22)

    with pytest.raises(OwnershipConflict, match="taken over by owner 'vb121-122' on host node-b"):
        owners.verify(old)
    with pytest.raises(OwnershipConflict):
        owners.heartbeat(old)
    owners.verify(new)
    assert [r.claim_id for r in owners.records() if 120 in r.vbuckets or 121 in r.vbuckets] == [
        new.claim_id
    ]


def test_verify_renews_an_expired_lease_nobody_took(mirror: MirrorTable) -> None:
    clock = Clock()
    owners = OwnersTable.of(mirror, clock=clock)
    claim = owners.claim([130], lease=LEASE, host="a", pid=1)
    clock.advance(600)
    owners.verify(claim)
    (record,) = [r for r in owners.records() if r.claim_id == claim.claim_id]
    assert record.heartbeat_at == clock.now


def test_released_vbuckets_can_be_claimed_at_once(mirror: MirrorTable) -> None:
    owners = OwnersTable.of(mirror, clock=Clock())
    claim = owners.claim([140], lease=LEASE, host="a", pid=1)
    owners.release(claim)
    with pytest.raises(OwnershipConflict, match="no one \\(it was released\\)"):
        owners.verify(claim)
    owners.claim([140], lease=LEASE, host="b", pid=2)


def test_a_claimer_beaten_between_check_and_commit_withdraws(mirror: MirrorTable) -> None:
    clock = Clock()
    rival = OwnersTable.of(mirror, clock=clock)
    won: list[object] = []

    def rival_claims_first(step: str) -> None:
        assert step == "after_check"
        if not won:
            won.append(rival.claim([150, 151], lease=LEASE, host="fast", pid=9))

    slow = OwnersTable.of(mirror, clock=clock, step_hook=rival_claims_first)
    with pytest.raises(OwnershipConflict, match=r"vbuckets 151 held by .* on host fast pid 9"):
        slow.claim([151, 152], lease=LEASE, host="slow", pid=8)
    holders = [
        (r.host, sorted(r.vbuckets)) for r in rival.records() if r.vbuckets & {150, 151, 152}
    ]
    assert holders == [("fast", [150, 151])]


def test_claim_rejects_bad_arguments(mirror: MirrorTable) -> None:
    owners = OwnersTable.of(mirror)
    with pytest.raises(ValueError, match="at least one vbucket"):
        owners.claim([])
    with pytest.raises(ValueError, match="lease"):
        owners.claim([1], lease=timedelta(0))


def test_a_claim_of_a_killed_process_on_this_host_is_taken_over_at_once(
    mirror: MirrorTable,
) -> None:
    import os
    import subprocess
    import sys

    owners = OwnersTable.of(mirror, clock=Clock())
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                            capture_output=True, text=True, check=True)
    dead_pid = int(exited.stdout)
    owners.claim([940, 941], lease=LEASE, host="this-host", pid=dead_pid)
    owners.claim([941, 942], lease=LEASE, host="this-host", pid=os.getpid())
    # A live process on the same host still holds its vbuckets, lease or not.
    with pytest.raises(OwnershipConflict, match="vbuckets 942 held by"):
        owners.claim([942], lease=LEASE, host="this-host", pid=os.getpid() + 10**6)


def test_verify_trusts_the_lease_for_three_quarters_of_it_then_reads(
    mirror: MirrorTable,
) -> None:
    clock = Clock()
    owners = OwnersTable.of(mirror, clock=clock)
    claim = owners.claim([160], lease=LEASE, host="node-a", pid=11)
    mirror.spark.sql(
        f"DELETE FROM delta.`{owners.path}` WHERE claim_id = '{claim.claim_id}'"
    )  # the row vanishes behind our back
    clock.advance(44)
    owners.verify(claim)  # within 3/4 of the lease nobody can have taken over: no read
    clock.advance(2)
    with pytest.raises(OwnershipConflict):
        owners.verify(claim)


def test_an_uncontested_claim_commits_right_after_its_check_and_reads_once(
    mirror: MirrorTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replicator.delta.table import table_version

    owners = OwnersTable.of(mirror, clock=Clock())
    reads: list[int | None] = []
    read = OwnersTable.records

    def counted(self: OwnersTable, version: int | None = None) -> list[OwnerRecord]:
        reads.append(version)
        return read(self, version)

    monkeypatch.setattr(OwnersTable, "records", counted)
    checked = table_version(mirror.spark, owners.path)
    claim = owners.claim([170, 171], lease=LEASE, host="a", pid=1)
    # Nothing landed between the check and the commit, so there is nothing to look at again.
    assert reads == [checked]
    assert table_version(mirror.spark, owners.path) == checked + 1
    monkeypatch.undo()
    assert [r.claim_id for r in owners.records() if r.vbuckets & {170, 171}] == [claim.claim_id]


def test_a_stale_owner_heartbeating_between_check_and_commit_keeps_its_vbuckets(
    mirror: MirrorTable,
) -> None:
    clock = Clock()
    stale_owner = OwnersTable.of(mirror, clock=clock)
    old = stale_owner.claim([180, 181], lease=LEASE, host="node-a", pid=11)
    clock.advance(61)  # its lease ran out: a claimer may take it over...

    def it_comes_back(step: str) -> None:
        stale_owner.heartbeat(old)  # ...but it heartbeats before the claim commits

    taker = OwnersTable.of(mirror, clock=clock, step_hook=it_comes_back)
    with pytest.raises(OwnershipConflict, match=r"vbuckets 181 held by owner 'vb180-181'"):
        taker.claim([181, 182], lease=LEASE, host="node-b", pid=22)
    holders = [(r.host, sorted(r.vbuckets)) for r in taker.records() if r.vbuckets & {181, 182}]
    assert holders == [("node-a", [180, 181])]
    stale_owner.verify(old)
