"""One writer per vbucket: claims with leases in the owners table, and fencing before commits.

A claim is refused while another live owner (heartbeat within its lease) holds any of the
vbuckets, or runs under the same owner id (it would share our Delta txnAppId). A claim that
evicts stale owners is a MERGE that reads the whole owners table, so two such claimers
committing at once conflict in Delta's optimistic concurrency; one with nothing to evict is an
append (one Spark job instead of a MERGE's six or seven), which lands beside a concurrent one.
Either way a claimer whose rival committed between its check and its own commit sees the rival
in the version its commit produced, withdraws, and is refused. When the claim's commit directly
follows the version its check read, nothing can have landed in between, and that second look
is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import StringType, StructField, StructType

from replicator.config import vbucket_ranges
from replicator.delta.conflicts import is_concurrent_modification, retry_on_conflict
from replicator.delta.lease_renewal import LeaseRenewer, lease_renewer_for
from replicator.delta.schema import OWNER_SCHEMA
from replicator.delta.table import (
    MirrorTable,
    as_utc,
    delta_write_confs,
    engine_error_summary,
    last_commit_version,
    now_utc,
    only_created,
    reset_last_commit_version,
    table_version,
)
from replicator.errors import OwnershipConflict

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_LEASE = timedelta(minutes=2)

_MAX_READABLE_OWNER_ID = 60


def stable_owner_id(vbuckets: Iterable[int]) -> str:
    """An owner id that depends only on the vbucket set, so a restarted shard keeps its id.

    >>> stable_owner_id([0, 1, 2, 3, 7])
    'vb0-3,7'
    """
    ranges = vbucket_ranges(vbuckets)
    if not ranges:
        raise ValueError("an owner needs at least one vbucket")
    readable = "vb" + ranges
    if len(readable) <= _MAX_READABLE_OWNER_ID:
        return readable
    return "vbset-" + hashlib.sha256(readable.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    """A row of the owners table: a claim as the table holds it."""

    owner_id: str
    claim_id: str
    vbuckets: frozenset[int]
    host: str
    pid: int
    lease: timedelta
    claimed_at: datetime
    heartbeat_at: datetime

    def is_live(self, now: datetime) -> bool:
        """The owner heartbeated within its lease."""
        return self.heartbeat_at + self.lease > now

    def describe(self, now: datetime) -> str:
        seen = int((now - self.heartbeat_at).total_seconds())
        return (
            f"owner {self.owner_id!r} on host {self.host} pid {self.pid}, last seen "
            f"{self.heartbeat_at.isoformat(timespec='seconds')} ({seen}s ago, lease "
            f"{int(self.lease.total_seconds())}s)"
        )


@dataclass(frozen=True, slots=True)
class OwnerClaim:
    """A granted claim: this process writes `vbuckets` until it releases or loses the claim."""

    owner_id: str
    claim_id: str
    vbuckets: frozenset[int]
    host: str
    pid: int
    lease: timedelta


def _vbucket_list(vbuckets: Iterable[int], limit: int = 12) -> str:
    ordered = sorted(vbuckets)
    shown = ", ".join(str(vb) for vb in ordered[:limit])
    return shown + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


class OwnersTable:
    """Claims, heartbeats, releases and fencing checks against the owners table at `path`.

    `clock` gives the current time (tests move it instead of sleeping). `step_hook` is called
    with "after_check" between reading the table and committing a claim, and with
    "before_renewal" between reading it and committing a heartbeat (tests inject races).
    Heartbeats are delta-rs's UPDATE on the local filesystem (`lease_renewal`), Spark's MERGE
    elsewhere or with `spark_heartbeats`.
    """

    def __init__(
        self,
        spark: SparkSession,
        path: str,
        *,
        clock: Callable[[], datetime] = now_utc,
        step_hook: Callable[[str], None] | None = None,
        spark_heartbeats: bool = False,
    ) -> None:
        self.spark = spark
        self.path = path
        self._clock = clock
        self._step_hook = step_hook
        self._renewer: LeaseRenewer | None = None if spark_heartbeats else lease_renewer_for(path)
        self._safe_until: dict[str, datetime] = {}
        """Per claim: until when no rival can have taken it over (its lease, with a margin)."""

    @classmethod
    def of(
        cls,
        mirror: MirrorTable,
        *,
        clock: Callable[[], datetime] = now_utc,
        step_hook: Callable[[str], None] | None = None,
        spark_heartbeats: bool = False,
    ) -> OwnersTable:
        """The owners table of a mirror."""
        return cls(
            mirror.spark, mirror.layout.owners, clock=clock, step_hook=step_hook,
            spark_heartbeats=spark_heartbeats,
        )  # fmt: skip

    def records(self, version: int | None = None) -> list[OwnerRecord]:
        """Every row of the owners table (at `version` when given)."""
        if version in (None, 0) and only_created(self.spark, self.path):
            return []  # only the table's creation: no job needed to know it holds no one
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return [owner_record_of_row(row) for row in reader.load(self.path).collect()]

    def claim(
        self,
        vbuckets: Iterable[int],
        owner_id: str | None = None,
        lease: timedelta = DEFAULT_LEASE,
        *,
        host: str | None = None,
        pid: int | None = None,
    ) -> OwnerClaim:
        """Claim `vbuckets` for this process; OwnershipConflict if a live owner holds any.

        Stale claims (no heartbeat within their lease) that overlap are taken over.
        """
        wanted = frozenset(int(vb) for vb in vbuckets)
        if not wanted:
            raise ValueError("a claim needs at least one vbucket")
        if any(vb < 0 for vb in wanted):
            raise ValueError(f"vbucket numbers are not negative: {_vbucket_list(wanted)}")
        if lease.total_seconds() < 1:
            raise ValueError(f"a lease must be at least one second, got {lease}")
        claim = OwnerClaim(
            owner_id=owner_id or stable_owner_id(wanted),
            claim_id=uuid.uuid4().hex,
            vbuckets=wanted,
            host=host or socket.gethostname(),
            pid=os.getpid() if pid is None else pid,
            lease=lease,
        )
        for attempt in (1, 2):
            # Pinned, so that the claim's commit version tells whether anything landed since.
            checked_version = table_version(self.spark, self.path)
            records = self.records(checked_version)
            now = self._clock()
            rivals = _rivals(records, claim, now)
            if rivals:
                raise OwnershipConflict(_conflict_message(claim, rivals, now))
            stale = [r for r in records if r.vbuckets & wanted or r.owner_id == claim.owner_id]
            if self._step_hook is not None:
                self._step_hook("after_check")
            try:
                claim_version = self._commit_claim(claim, stale, now)
                break
            except Exception as exc:
                if not is_concurrent_modification(exc):
                    raise
                if attempt == 2:
                    raise OwnershipConflict(
                        f"could not claim vbuckets {_vbucket_list(wanted)}: other replicators "
                        f"kept claiming at the same time ({engine_error_summary(exc)})"
                    ) from None
        if claim_version != checked_version + 1:
            self._withdraw_if_beaten(claim, claim_version)
        self._confirmed(claim, self._clock())
        return claim

    def heartbeat(self, claim: OwnerClaim) -> None:
        """Renew the claim's lease; OwnershipConflict if it was taken over or released."""
        moment = self._clock()
        metadata = _metadata("heartbeat", claim)
        what = f"heartbeat of owner {claim.owner_id!r}"
        renewer = self._renewer
        if renewer is not None:
            updated = retry_on_conflict(
                lambda: renewer.renew(
                    claim.claim_id, moment, metadata, before_commit=self._before_renewal
                ),
                what=what,
            )
        else:
            updated = self._spark_heartbeat(claim, moment, metadata, what)
        if updated == 0:
            self._safe_until.pop(claim.claim_id, None)
            raise self._lost(claim)
        self._confirmed(claim, moment)

    def _before_renewal(self) -> None:
        if self._step_hook is not None:
            self._step_hook("before_renewal")

    def _spark_heartbeat(
        self, claim: OwnerClaim, moment: datetime, metadata: str, what: str
    ) -> int:
        micros = _micros(moment)

        def update() -> int:
            row = self.spark.sql(
                f"MERGE INTO delta.`{_quoted(self.path)}` AS t USING {_claim_source(claim)} AS s "
                "ON t.claim_id = s.claim_id "
                f"WHEN MATCHED THEN UPDATE SET heartbeat_at = timestamp_micros({micros})"
            ).first()
            return int(row["num_updated_rows"]) if row is not None else 0

        with delta_write_confs(self.spark, user_metadata=metadata):
            return retry_on_conflict(update, what=what)

    def release(self, claim: OwnerClaim) -> None:
        """Give the vbuckets up (a no-op if the claim is already gone)."""
        self._safe_until.pop(claim.claim_id, None)
        with delta_write_confs(self.spark, user_metadata=_metadata("release", claim)):
            retry_on_conflict(
                lambda: self._delete(claim), what=f"release of owner {claim.owner_id!r}"
            )

    def verify(self, claim: OwnerClaim) -> None:
        """Fencing before a data commit: raise OwnershipConflict unless the claim still holds.

        A claim whose lease ran out is renewed first, so a rival cannot take it over between
        this check and the commit without this process noticing at its next check.
        """
        now = self._clock()
        safe_until = self._safe_until.get(claim.claim_id)
        if safe_until is not None and now < safe_until:
            return  # a rival can only take over after our lease ran out: no read needed
        mine = next((r for r in self.records() if r.claim_id == claim.claim_id), None)
        if mine is None:
            self._safe_until.pop(claim.claim_id, None)
            raise self._lost(claim)
        if not mine.is_live(now):
            self.heartbeat(claim)
        else:
            self._confirmed(claim, mine.heartbeat_at)

    def _confirmed(self, claim: OwnerClaim, heartbeat_at: datetime) -> None:
        # Three quarters of the lease leaves room for clock skew between replicators.
        self._safe_until[claim.claim_id] = heartbeat_at + claim.lease * 3 / 4

    def _lost(self, claim: OwnerClaim) -> OwnershipConflict:
        now = self._clock()
        holders = [
            record
            for record in self.records()
            if record.vbuckets & claim.vbuckets and record.claim_id != claim.claim_id
        ]
        by = "; ".join(r.describe(now) for r in holders) or "no one (it was released)"
        return OwnershipConflict(
            f"owner {claim.owner_id!r} (host {claim.host} pid {claim.pid}) no longer holds "
            f"vbuckets {_vbucket_list(claim.vbuckets)}: taken over by {by}. Stop writing; "
            "restart to claim again"
        )

    def _commit_claim(
        self, claim: OwnerClaim, stale: Sequence[OwnerRecord], now: datetime
    ) -> int | None:
        """Commit the claim; return its commit's version (None if Delta did not say).

        An append when no stale owner is to go, else a MERGE that inserts it and evicts them.
        """
        from delta.tables import DeltaTable

        with delta_write_confs(self.spark, user_metadata=_metadata("claim", claim)):
            # Every write of this package holds the session write lock, so the conf read below
            # is this commit's own version, not another thread's.
            reset_last_commit_version(self.spark)
            if not stale:
                (
                    self.spark.createDataFrame([_row(claim, now, now)], OWNER_SCHEMA)
                    .write.format("delta")
                    .mode("append")
                    .save(self.path)
                )
                return last_commit_version(self.spark)
            rows: list[tuple[Any, ...]] = [(*_row(claim, now, now), "claim")]
            rows += [(*_record_row(record), "evict") for record in stale]
            schema = StructType(
                [*OWNER_SCHEMA.fields, StructField("action", StringType(), False)]
            )
            source = self.spark.createDataFrame(rows, schema)
            (
                DeltaTable.forPath(self.spark, self.path)
                .alias("t")
                .merge(source.alias("s"), "t.claim_id = s.claim_id")
                # Compare-and-delete: a stale owner that heartbeated since we read stays.
                .whenMatchedDelete(
                    condition="s.action = 'evict' AND t.heartbeat_at = s.heartbeat_at"
                )
                .whenNotMatchedInsert(
                    condition="s.action = 'claim'",
                    values={name: f"s.{name}" for name in OWNER_SCHEMA.fieldNames()},
                )
                .execute()
            )
            return last_commit_version(self.spark)

    def _withdraw_if_beaten(self, claim: OwnerClaim, version: int | None) -> None:
        """Refuse the claim if a rival's claim landed before ours: it is in our commit's view."""
        if version is None:
            version = self._claim_version(claim)
        now = self._clock()
        rivals = _rivals(self.records(version), claim, now)
        if rivals:
            self.release(claim)
            raise OwnershipConflict(_conflict_message(claim, rivals, now))

    def _claim_version(self, claim: OwnerClaim) -> int:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        history = DeltaTable.forPath(self.spark, self.path)
        for frame in (history.history(32), history.history()):
            row = (
                frame.where(
                    (F.get_json_object("userMetadata", "$.claim") == claim.claim_id)
                    & (F.get_json_object("userMetadata", "$.action") == "claim")
                )
                .select("version")
                .first()
            )
            if row is not None:
                return int(row["version"])
        raise OwnershipConflict(
            f"the claim of owner {claim.owner_id!r} was not found in the owners table's history"
        )

    def _delete(self, claim: OwnerClaim) -> None:
        self.spark.sql(
            f"MERGE INTO delta.`{_quoted(self.path)}` AS t USING {_claim_source(claim)} AS s "
            "ON t.claim_id = s.claim_id WHEN MATCHED THEN DELETE"
        ).collect()


def _rivals(records: Iterable[OwnerRecord], claim: OwnerClaim, now: datetime) -> list[OwnerRecord]:
    return [
        record
        for record in records
        if record.claim_id != claim.claim_id
        and record.is_live(now)
        and not _process_gone(record, claim.host)
        and (record.vbuckets & claim.vbuckets or record.owner_id == claim.owner_id)
    ]


def _process_gone(record: OwnerRecord, this_host: str) -> bool:
    """The claim's process ran on this host and no longer exists (killed, crashed).

    Lets a restart after kill -9 take over at once instead of waiting out the lease. A pid
    reused by another process errs on the safe side: the lease is waited for.
    """
    if record.host != this_host or record.pid <= 0:
        return False
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _conflict_message(claim: OwnerClaim, rivals: Sequence[OwnerRecord], now: datetime) -> str:
    parts = []
    for rival in rivals:
        overlap = rival.vbuckets & claim.vbuckets
        what = f"vbuckets {_vbucket_list(overlap)}" if overlap else f"owner id {rival.owner_id!r}"
        parts.append(f"{what} held by {rival.describe(now)}")
    return (
        f"cannot claim vbuckets {_vbucket_list(claim.vbuckets)} as owner {claim.owner_id!r}: "
        + "; ".join(parts)
        + ". Stop the other replicator, or wait for its lease to run out"
    )


def _claim_source(claim: OwnerClaim) -> str:
    """A MERGE source naming the claim: one literal row, which Delta does not materialize.

    Heartbeats and releases are MERGEs rather than UPDATE and DELETE: on a table without
    deletion vectors (the owners table) those two drop the row counts of the files they
    rewrite, then warn "Could not validate number of records due to missing statistics" at
    every heartbeat; MERGE keeps the counts and validates. Still one commit each.
    """
    if not claim.claim_id.isalnum():
        raise ValueError(f"a claim id is alphanumeric, got {claim.claim_id!r}")
    return f"(SELECT '{claim.claim_id}' AS claim_id)"


def _metadata(action: str, claim: OwnerClaim) -> str:
    return json.dumps({"replicator_owners": 1, "action": action, "claim": claim.claim_id})


def _micros(moment: datetime) -> int:
    delta = moment - datetime(1970, 1, 1, tzinfo=moment.tzinfo)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _quoted(path: str) -> str:
    return path.replace("`", "``")


def _row(claim: OwnerClaim, claimed_at: datetime, heartbeat_at: datetime) -> tuple[Any, ...]:
    return (
        claim.owner_id,
        claim.claim_id,
        sorted(claim.vbuckets),
        claim.host,
        claim.pid,
        int(claim.lease.total_seconds()),
        claimed_at,
        heartbeat_at,
    )


def _record_row(record: OwnerRecord) -> tuple[Any, ...]:
    return (
        record.owner_id,
        record.claim_id,
        sorted(record.vbuckets),
        record.host,
        record.pid,
        int(record.lease.total_seconds()),
        record.claimed_at,
        record.heartbeat_at,
    )


def owner_record_of_row(row: Any) -> OwnerRecord:
    """An OwnerRecord from a row of the owners table (a Spark Row or a dict of its columns)."""
    return OwnerRecord(
        owner_id=str(row["owner_id"]),
        claim_id=str(row["claim_id"]),
        vbuckets=frozenset(int(vb) for vb in row["vbuckets"]),
        host=str(row["host"]),
        pid=int(row["pid"]),
        lease=timedelta(seconds=int(row["lease_seconds"])),
        claimed_at=as_utc(row["claimed_at"]),
        heartbeat_at=as_utc(row["heartbeat_at"]),
    )
