"""Where a vbucket stands in the producer's history: failover logs and committed positions.

Shared by the protocol layer (stream requests) and the Delta layer (checkpoints), so it knows
nothing of sockets or of Spark.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MAX_SEQNO = 0xFFFFFFFFFFFFFFFF
"""Stream end for an open-ended (continuous) stream."""

MAX_FAILOVER_ENTRIES = 25
"""kv_engine keeps at most this many entries in a vbucket's failover table."""

SeqnoRange = tuple[int, int]
"""An inclusive range of seqnos of one vbucket: (first, last)."""


@dataclass(frozen=True, slots=True)
class FailoverEntry:
    """A branch point of a vbucket's history: from `seqno` on, history is `vbucket_uuid`'s."""

    vbucket_uuid: int
    seqno: int


@dataclass(frozen=True, slots=True)
class FailoverLog:
    """A vbucket's failover log, newest entry first, as the producer sends it."""

    entries: tuple[FailoverEntry, ...]

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError("a failover log has at least one entry")

    @classmethod
    def of(cls, pairs: Iterable[tuple[int, int]]) -> FailoverLog:
        """Build from (vbucket_uuid, seqno) pairs, newest first.

        >>> FailoverLog.of([(0xBEEF, 100), (0xCAFE, 0)]).newest.vbucket_uuid == 0xBEEF
        True
        """
        return cls(tuple(FailoverEntry(uuid, seqno) for uuid, seqno in pairs))

    @property
    def newest(self) -> FailoverEntry:
        return self.entries[0]

    def entry_at(self, seqno: int) -> FailoverEntry:
        """The newest entry whose branch seqno is <= `seqno`: the uuid to resume from `seqno` with.

        Falls back to the oldest entry, whose history starts at the vbucket's beginning.
        """
        for entry in self.entries:
            if entry.seqno <= seqno:
                return entry
        return self.entries[-1]

    def as_pairs(self) -> list[tuple[int, int]]:
        return [(e.vbucket_uuid, e.seqno) for e in self.entries]


@dataclass(frozen=True, slots=True)
class VbucketPosition:
    """A committed boundary of one vbucket: everything up to `seqno` is applied, nothing after.

    The replicator persists only whole snapshots, so a committed position normally has
    `snapshot_start == snapshot_end == seqno`; the fields exist because the stream request
    carries them and the producer's rollback decision reads them.
    """

    vbucket: int
    vbucket_uuid: int
    seqno: int
    snapshot_start: int
    snapshot_end: int
    purge_seqno: int = 0
    manifest_uid: int = 0

    def __post_init__(self) -> None:
        if not self.snapshot_start <= self.seqno <= self.snapshot_end:
            raise ValueError(
                f"vbucket {self.vbucket}: position breaks snap_start <= start <= snap_end "
                f"({self.snapshot_start} <= {self.seqno} <= {self.snapshot_end})"
            )

    @classmethod
    def beginning(cls, vbucket: int) -> VbucketPosition:
        """The position of a vbucket nothing has been mirrored from yet (uuid 0: any history)."""
        return cls(vbucket, 0, 0, 0, 0)

    @classmethod
    def at_boundary(
        cls,
        vbucket: int,
        vbucket_uuid: int,
        seqno: int,
        *,
        purge_seqno: int = 0,
        manifest_uid: int = 0,
    ) -> VbucketPosition:
        """A position at a whole-snapshot boundary: snap_start = snap_end = start."""
        return cls(vbucket, vbucket_uuid, seqno, seqno, seqno, purge_seqno, manifest_uid)
