"""One word for a mirror's state, for cron jobs, probes and alerts: ok, lagging, stalled, fenced.

Judged from a MirrorStatus alone (pure): the claims in the owners table, each vbucket's last
commit and, when status read the source, each vbucket's lag. The worst finding wins:

- fenced: a vbucket is claimed by two live replicators; only one may commit, the other is
  being fenced off (two replicators configured over the same vbuckets).
- stalled: a claim's lease ran out without a release (its replicator died or hangs), or a
  vbucket behind the source has not committed for `stalled_after_s`.
- lagging: the mirror is more than `max_lag_seqnos` behind the source in all, or a vbucket
  behind the source last committed more than `max_lag_s` ago.
- ok: none of these. Without a source, lag cannot be judged: the verdict says so.

>>> verdict = judge(status, HealthThresholds(max_lag_s=60))  # doctest: +SKIP
>>> verdict.state, verdict.exit_code  # doctest: +SKIP
(<Health.LAGGING: 'lagging'>, 3)
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from replicator.config import vbucket_ranges


class OwnerFacts(Protocol):
    """What the verdict reads of one claim (a status's OwnerStatus)."""

    @property
    def owner_id(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def pid(self) -> int: ...
    @property
    def heartbeat_at(self) -> datetime: ...
    @property
    def live(self) -> bool: ...
    @property
    def claimed(self) -> frozenset[int]: ...


class VbucketFacts(Protocol):
    """What the verdict reads of one vbucket (a status's VbucketStatus)."""

    @property
    def vbucket(self) -> int: ...
    @property
    def committed_at(self) -> datetime | None: ...
    @property
    def lag(self) -> int | None: ...


class StatusFacts(Protocol):
    """What the verdict reads of a mirror's status (a MirrorStatus, which asks for its own
    verdict: the rules name only what they read, so health and status do not import each other)."""

    @property
    def owners(self) -> Sequence[OwnerFacts]: ...
    @property
    def vbuckets(self) -> Sequence[VbucketFacts]: ...
    @property
    def with_source(self) -> bool: ...
    @property
    def checked_at(self) -> datetime: ...
    @property
    def lag(self) -> int | None: ...


class Health(enum.StrEnum):
    OK = "ok"
    LAGGING = "lagging"
    STALLED = "stalled"
    FENCED = "fenced"

    @property
    def exit_code(self) -> int:
        """`replicator status` exits with this: 0 ok, 3 lagging, 4 stalled, 5 fenced.

        1 and 2 stay what they mean for every command (different, usage or read error).
        """
        return _EXIT_CODES[self]


_EXIT_CODES = {Health.OK: 0, Health.LAGGING: 3, Health.STALLED: 4, Health.FENCED: 5}
_SEVERITY = (Health.OK, Health.LAGGING, Health.STALLED, Health.FENCED)


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    """When a mirror stops being ok (`replicator status --max-lag-seqnos ...`)."""

    max_lag_seqnos: int = 100_000
    """Seqnos behind the source, summed over vbuckets, above which the mirror is lagging."""
    max_lag_s: float = 300.0
    """Seconds since a behind vbucket's last commit above which the mirror is lagging."""
    stalled_after_s: float = 900.0
    """Seconds since a behind vbucket's last commit above which the mirror is stalled."""

    def __post_init__(self) -> None:
        from replicator.errors import ConfigError

        for name in ("max_lag_seqnos", "max_lag_s", "stalled_after_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name.replace('_', '-')} must not be negative")
        if self.stalled_after_s < self.max_lag_s:
            raise ConfigError(
                f"--stalled-after-s ({self.stalled_after_s:g}) must be at least --max-lag-s "
                f"({self.max_lag_s:g}): a stall is a lag that went on"
            )


@dataclass(frozen=True, slots=True)
class HealthVerdict:
    """The verdict and every finding behind it, worst first."""

    state: Health
    reasons: tuple[str, ...]
    lag_checked: bool

    @property
    def exit_code(self) -> int:
        return self.state.exit_code

    def describe(self) -> str:
        text = f"health: {self.state}"
        if self.reasons:
            text += " (" + "; ".join(self.reasons) + ")"
        elif not self.lag_checked:
            text += " (lag not checked: give --source)"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"state": str(self.state), "reasons": list(self.reasons),
                "lag_checked": self.lag_checked}


def judge(status: StatusFacts, thresholds: HealthThresholds | None = None) -> HealthVerdict:
    """The health of `status` under `thresholds` (defaults when None) (pure)."""
    limits = thresholds or HealthThresholds()
    findings: list[tuple[Health, str]] = []
    findings += _fenced(status)
    findings += _expired_claims(status)
    if status.with_source:
        findings += _lag(status, limits)
    findings.sort(key=lambda finding: -_SEVERITY.index(finding[0]))
    state = findings[0][0] if findings else Health.OK
    return HealthVerdict(state, tuple(text for _, text in findings), status.with_source)


def _fenced(status: StatusFacts) -> list[tuple[Health, str]]:
    claimed: dict[int, list[str]] = {}
    for owner in status.owners:
        if owner.live:
            for vbucket in owner.claimed:
                claimed.setdefault(vbucket, []).append(owner.owner_id)
    contested = sorted(vb for vb, owners in claimed.items() if len(owners) > 1)
    if not contested:
        return []
    rivals = sorted({owner for vb in contested for owner in claimed[vb]})
    return [(Health.FENCED, f"{_these(contested, 'are', 'is')} claimed by several live "
                            f"replicators ({', '.join(rivals)}): only one can commit")]


def _expired_claims(status: StatusFacts) -> list[tuple[Health, str]]:
    live = {vb for owner in status.owners if owner.live for vb in owner.claimed}
    findings = []
    for owner in status.owners:
        orphaned = sorted(owner.claimed - live)
        if not owner.live and orphaned:
            findings.append((Health.STALLED, (
                f"the claim of {owner.owner_id} on {owner.host} pid {owner.pid} expired without "
                f"a release (last heartbeat {_age(status, owner.heartbeat_at)}): "
                f"{_these(orphaned, 'have', 'has')} no live replicator"
            )))
    return findings


def _lag(status: StatusFacts, limits: HealthThresholds) -> list[tuple[Health, str]]:
    findings = []
    behind = [vb for vb in status.vbuckets if (vb.lag or 0) > 0]
    stalled, slow = [], []
    for vb in behind:
        since = vb.committed_at
        waited = (status.checked_at - since).total_seconds() if since is not None else None
        if waited is None or waited > limits.stalled_after_s:
            stalled.append(vb.vbucket)
        elif waited > limits.max_lag_s:
            slow.append(vb.vbucket)
    if stalled:
        findings.append((Health.STALLED, (
            f"{_these(stalled, 'are', 'is')} behind the source and committed nothing "
            f"for more than {limits.stalled_after_s:g} s"
        )))
    if slow:
        findings.append((Health.LAGGING, (
            f"{_these(slow, 'are', 'is')} behind the source and last committed more than "
            f"{limits.max_lag_s:g} s ago"
        )))
    total = status.lag or 0
    if total > limits.max_lag_seqnos:
        findings.append((Health.LAGGING, (
            f"{total} seqnos behind the source (more than {limits.max_lag_seqnos})"
        )))
    return findings


def _these(vbuckets: list[int], plural: str, singular: str) -> str:
    """`vbucket 3 is` or `vbuckets 0-3,7 are`."""
    if len(vbuckets) == 1:
        return f"vbucket {vbuckets[0]} {singular}"
    return f"vbuckets {vbucket_ranges(vbuckets)} {plural}"


def _age(status: StatusFacts, moment: Any) -> str:
    return f"{int((status.checked_at - moment).total_seconds())} s ago"


__all__ = ["Health", "HealthThresholds", "HealthVerdict", "StatusFacts", "judge"]
