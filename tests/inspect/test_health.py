"""The health verdict of `replicator status`: ok, lagging, stalled or fenced, and its exit code."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from replicator.errors import ConfigError
from replicator.inspect.health import Health, HealthThresholds, judge
from replicator.inspect.status import MirrorStatus, OwnerStatus, VbucketStatus
from replicator.model.positions import VbucketPosition

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def vb(number: int, seqno: int, *, high: int | None = None, ago_s: float = 5.0) -> VbucketStatus:
    return VbucketStatus(
        number, VbucketPosition.at_boundary(number, 77, seqno),
        committed_at=NOW - timedelta(seconds=ago_s), source_high_seqno=high,
    )  # fmt: skip


def owner(name: str, vbuckets: range, *, live: bool = True, ago_s: float = 3.0) -> OwnerStatus:
    return OwnerStatus(
        name, len(vbuckets), "db1", 42, NOW - timedelta(seconds=ago_s), live,
        claimed=frozenset(vbuckets),
    )  # fmt: skip


def status(
    *vbuckets: VbucketStatus, owners: tuple[OwnerStatus, ...] = (), **kw: Any
) -> MirrorStatus:
    return MirrorStatus(
        target="/lake/m", bucket="b", table_version=3, checked_at=NOW, vbuckets=vbuckets,
        owners=owners, **kw,
    )  # fmt: skip


def test_a_caught_up_mirror_with_a_live_replicator_is_ok() -> None:
    verdict = judge(status(vb(0, 10, high=10), vb(1, 5, high=5), owners=(owner("a", range(2)),),
                           with_source=True))
    assert (verdict.state, verdict.reasons, verdict.exit_code) == (Health.OK, (), 0)
    assert verdict.lag_checked


def test_without_a_source_lag_is_not_judged_and_the_verdict_says_so() -> None:
    verdict = judge(status(vb(0, 10, ago_s=86_400)))
    assert verdict.state is Health.OK and not verdict.lag_checked
    assert verdict.describe() == "health: ok (lag not checked: give --source)"


def test_too_many_seqnos_behind_is_lagging() -> None:
    limits = HealthThresholds(max_lag_seqnos=100)
    lagging = judge(status(vb(0, 10, high=70), vb(1, 10, high=60), with_source=True), limits)
    assert lagging.state is Health.LAGGING and lagging.exit_code == 3
    assert lagging.reasons == ("110 seqnos behind the source (more than 100)",)
    at_limit = judge(status(vb(0, 10, high=110), with_source=True), limits)
    assert at_limit.state is Health.OK


def test_a_behind_vbucket_that_has_not_committed_for_a_while_is_lagging_then_stalled() -> None:
    limits = HealthThresholds(max_lag_s=60, stalled_after_s=600)
    recent = judge(status(vb(0, 10, high=11, ago_s=30), with_source=True), limits)
    slow = judge(status(vb(0, 10, high=11, ago_s=120), with_source=True), limits)
    stuck = judge(status(vb(0, 10, high=11, ago_s=601), with_source=True), limits)
    idle = judge(status(vb(0, 10, high=10, ago_s=86_400), with_source=True), limits)
    assert recent.state is Health.OK
    assert slow.state is Health.LAGGING
    assert slow.reasons == (
        "vbucket 0 is behind the source and last committed more than 60 s ago",
    )
    assert stuck.state is Health.STALLED and stuck.exit_code == 4
    # A vbucket with nothing to commit is never late, however old its last commit.
    assert idle.state is Health.OK


def test_a_vbucket_behind_that_never_committed_is_stalled() -> None:
    never = VbucketStatus(3, None, source_high_seqno=9)
    verdict = judge(status(never, with_source=True))
    assert verdict.state is Health.STALLED
    assert "vbucket 3 is behind" in verdict.reasons[0]


def test_an_expired_claim_nobody_took_over_is_stalled() -> None:
    dead = owner("vb0-3", range(4), live=False, ago_s=300)
    verdict = judge(status(vb(0, 1), owners=(dead,)))
    assert verdict.state is Health.STALLED
    assert verdict.reasons == (
        "the claim of vb0-3 on db1 pid 42 expired without a release (last heartbeat 300 s ago): "
        "vbuckets 0-3 have no live replicator",
    )
    # Taken over by a live replicator: only the vbuckets nobody holds are reported.
    partly = judge(status(vb(0, 1), owners=(dead, owner("vb0-1", range(2)))))
    assert partly.state is Health.STALLED and "vbuckets 2-3 have no live" in partly.reasons[0]
    taken = judge(status(vb(0, 1), owners=(dead, owner("vb0-3b", range(4)))))
    assert taken.state is Health.OK


def test_two_live_claims_on_one_vbucket_are_fenced_and_fenced_is_the_worst() -> None:
    limits = HealthThresholds(max_lag_seqnos=1)
    verdict = judge(
        status(
            vb(0, 1, high=50), vb(5, 1, high=1),
            owners=(owner("a", range(0, 8)), owner("b", range(4, 12)),
                    owner("c", range(20, 21), live=False)),
            with_source=True,
        ),
        limits,
    )
    assert verdict.state is Health.FENCED and verdict.exit_code == 5
    assert verdict.reasons[0] == (
        "vbuckets 4-7 are claimed by several live replicators (a, b): only one can commit"
    )
    # Every finding is kept, worst first.
    assert [reason.split()[0] for reason in verdict.reasons] == ["vbuckets", "the", "49"]


def test_the_verdict_is_in_the_json_and_first_under_the_summary() -> None:
    mirror = status(vb(0, 10, high=500), with_source=True,
                    thresholds=HealthThresholds(max_lag_seqnos=10))
    document = json.loads(mirror.to_json_text())
    assert document["health"] == {
        "state": "lagging", "reasons": ["490 seqnos behind the source (more than 10)"],
        "lag_checked": True,
    }
    assert mirror.render().splitlines()[1] == (
        "health: lagging (490 seqnos behind the source (more than 10))"
    )


def test_thresholds_must_make_sense() -> None:
    with pytest.raises(ConfigError, match="max-lag-seqnos must not be negative"):
        HealthThresholds(max_lag_seqnos=-1)
    with pytest.raises(ConfigError, match="must be at least --max-lag-s"):
        HealthThresholds(max_lag_s=600, stalled_after_s=60)
