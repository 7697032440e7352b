"""Delta's refusals of a commit: which are retried, which mean fencing failed, and the retry.

Delta raises them as typed Python exceptions (`delta.exceptions`) once
`delta.exceptions.captured` has taught PySpark to convert them from the JVM's; delta-spark does
not import that module itself, so this one does.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import delta.exceptions.captured  # noqa: F401  (installs the conversion; see above)
from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)

from replicator.model.backoff import Backoff

T = TypeVar("T")
log = logging.getLogger(__name__)


class MergeConflict(RuntimeError):
    """Other writers took every table version the replicator's own steady writer (not Spark)
    planned a commit for; nothing of it was committed, and it is retried as Delta's are."""


class DeltaRsConflict(RuntimeError):
    """delta-rs refused a commit of the replicator's own tables: a commit that landed first
    touched what this one read (a rival's eviction of the claim a heartbeat renews, a metadata
    change). Retried: the next attempt reads the table again."""


RETRIED_CONFLICTS: tuple[type[Exception], ...] = (
    MergeConflict,
    DeltaRsConflict,
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentDeleteDeleteException,
    ConcurrentWriteException,
    MetadataChangedException,
    ProtocolChangedException,
)
"""Delta's refusals of a commit after another writer committed first, safe to retry: the
write is recomputed from the new table version (a MERGE re-reads its target rows, an append
or replaceWhere only ever holds this owner's vbuckets)."""

FENCING_CONFLICTS: tuple[type[Exception], ...] = (ConcurrentTransactionException,)
"""Another process committed with our txnAppId at the same time: two writers share an owner
id, which fencing must have prevented. Never retried."""

DELTA_CONFLICTS: tuple[type[Exception], ...] = (
    *RETRIED_CONFLICTS,
    *FENCING_CONFLICTS,
    DeltaConcurrentModificationException,
)
"""Every Delta concurrency exception (Delta's Python classes do not share a base class)."""


@contextmanager
def delta_rs_conflicts(what: str) -> Iterator[None]:
    """delta-rs's refusal of a commit (its CommitFailedError) raised as DeltaRsConflict."""
    from deltalake.exceptions import CommitFailedError

    try:
        yield
    except CommitFailedError as exc:
        raise DeltaRsConflict(f"{what} lost a race with another commit: {exc}") from exc


def delta_conflict_name(exc: BaseException) -> str | None:
    """The Delta concurrency exception class `exc` is (e.g. ConcurrentAppendException), or None."""
    for conflict in DELTA_CONFLICTS:
        if isinstance(exc, conflict):
            return conflict.__name__
    return None


def is_concurrent_modification(exc: BaseException) -> bool:
    """True when Delta refused a commit because another writer committed first."""
    return isinstance(exc, DELTA_CONFLICTS)


@dataclass(frozen=True, slots=True)
class ConflictRetry:
    """Bounded retries, paced by `backoff` (its jitter keeps shards from retrying in step).

    `attempts` alone bounds the retries: the backoff's deadline is not consulted.
    """

    attempts: int = 6
    backoff: Backoff = field(
        default_factory=lambda: Backoff(initial=0.2, maximum=5.0, deadline=math.inf)
    )

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")


def retry_on_conflict(
    action: Callable[[], T],
    *,
    what: str = "a commit",
    policy: ConflictRetry = ConflictRetry(),
    before_retry: Callable[[], None] | None = None,
    pause: Callable[[float], None] = time.sleep,
) -> T:
    """Run `action`, again after a retryable Delta conflict (RETRIED_CONFLICTS), with backoff.

    Every commit goes through here: shards share the unpartitioned owners and failover-log
    tables, so their heartbeats and saves do collide, and a data commit can meet an OPTIMIZE.
    `before_retry` runs before each new attempt (the executor re-checks its claim there). The
    last attempt's exception, or any other one, propagates.
    """
    for attempt in range(1, policy.attempts + 1):
        try:
            return action()
        except RETRIED_CONFLICTS as exc:
            if attempt == policy.attempts:
                raise
            wait = policy.backoff.delay(attempt)
            log.info(
                "%s conflicted with a concurrent commit (%s); retry %d of %d in %.2fs",
                what, delta_conflict_name(exc), attempt, policy.attempts - 1, wait,
            )
            pause(wait)
            if before_retry is not None:
                before_retry()
    raise AssertionError("unreachable")
