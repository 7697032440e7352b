"""A vbucket's failover table and the producer's answer to a stream request.

The answer follows kv_engine (`FailoverTable::needsRollback` and `DcpProducer::streamRequest`)
and spec/NOTES.md section 5. It is a pure function of the request and the producer's state, so
every case of the rollback document is a one-line test.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from replicator.model.positions import MAX_FAILOVER_ENTRIES, FailoverEntry, FailoverLog

_UUID_BITS = 48
"""kv_engine shifts a 64-bit random number right by 16 bits: uuids have 48 significant bits."""


class FailoverTable:
    """The branch points of one vbucket's history, newest first, at most 25 entries.

    Mutable producer state; `log()` hands out an immutable copy.

    >>> table = FailoverTable([FailoverEntry(0xAB, 0)])
    >>> entry = table.failover(10, random.Random(1))
    >>> [e.seqno for e in table.log().entries]
    [10, 0]
    """

    def __init__(
        self,
        entries: Iterable[FailoverEntry],
        *,
        max_entries: int = MAX_FAILOVER_ENTRIES,
    ) -> None:
        self._entries = list(entries)
        if not self._entries:
            raise ValueError("a failover table needs at least one entry")
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        if any(e.vbucket_uuid == 0 for e in self._entries):
            raise ValueError("vbucket uuid 0 is reserved (it means 'any history' in a request)")
        seqnos = [e.seqno for e in self._entries]
        if seqnos != sorted(seqnos, reverse=True):
            raise ValueError(f"failover entries must be newest first, got seqnos {seqnos}")
        self._max_entries = max_entries
        del self._entries[max_entries:]

    @classmethod
    def new(cls, rng: random.Random, *, max_entries: int = MAX_FAILOVER_ENTRIES) -> FailoverTable:
        """The table of a freshly created vbucket: one entry, a random uuid at seqno 0."""
        return cls([FailoverEntry(new_vbucket_uuid(rng), 0)], max_entries=max_entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[FailoverEntry]:
        return iter(tuple(self._entries))

    @property
    def newest(self) -> FailoverEntry:
        return self._entries[0]

    def log(self) -> FailoverLog:
        """An immutable copy, newest first, as a stream request or GET_FAILOVER_LOG returns it."""
        return FailoverLog(tuple(self._entries))

    def failover(self, high_seqno: int, rng: random.Random) -> FailoverEntry:
        """Start a new history branch at `high_seqno` and return its entry.

        Entries above `high_seqno` belong to a branch this vbucket no longer has and are
        dropped (kv_engine does the same); the oldest entries fall off beyond the capacity.
        """
        if high_seqno < 0:
            raise ValueError(f"high_seqno must not be negative, got {high_seqno}")
        self._entries = [e for e in self._entries if e.seqno <= high_seqno]
        entry = FailoverEntry(new_vbucket_uuid(rng), high_seqno)
        self._entries.insert(0, entry)
        del self._entries[self._max_entries :]
        return entry

    def upper_bound(self, vbucket_uuid: int, high_seqno: int) -> int | None:
        """How far the history of `vbucket_uuid` is shared with this producer, or None if unknown.

        That is the seqno of the next newer entry, or `high_seqno` when the uuid is the newest.
        Like kv_engine, the search runs from the oldest entry.
        """
        entries = self._entries
        for index in range(len(entries) - 1, -1, -1):
            if entries[index].vbucket_uuid == vbucket_uuid:
                return entries[index - 1].seqno if index > 0 else high_seqno
        return None


def new_vbucket_uuid(rng: random.Random) -> int:
    """A random non-zero vbucket uuid (0 is what a consumer sends when it has no history)."""
    while True:
        uuid = rng.getrandbits(_UUID_BITS)
        if uuid:
            return uuid


@dataclass(frozen=True, slots=True)
class StreamRequest:
    """The positions of a DCP stream request (STREAM_REQ extras) that decide its answer.

    `strict_vb_uuid` is flag 0x40 (check the uuid even at start 0); `ignore_purged_tombstones`
    is flag 0x80 (skip the purge rollback; a mirror must never set it, the simulator honours it).
    """

    start_seqno: int
    end_seqno: int
    vbucket_uuid: int
    snap_start_seqno: int
    snap_end_seqno: int
    strict_vb_uuid: bool = False
    ignore_purged_tombstones: bool = False


@dataclass(frozen=True, slots=True)
class StreamAccepted:
    """Open the stream; answer with `failover_log`."""

    failover_log: FailoverLog


@dataclass(frozen=True, slots=True)
class StreamRollback:
    """Answer ROLLBACK (0x23) with `rollback_seqno`; `reason` is for the producer's log."""

    rollback_seqno: int
    reason: str


@dataclass(frozen=True, slots=True)
class StreamRangeError:
    """Answer ERANGE (0x22): the request's seqnos are invalid for this producer."""

    reason: str


StreamDecision = StreamAccepted | StreamRollback | StreamRangeError
"""What the producer answers to a stream request."""


def decide_stream_request(
    request: StreamRequest,
    table: FailoverTable,
    high_seqno: int,
    purge_seqno: int,
) -> StreamDecision:
    """Accept, roll back or refuse a stream request, as kv_engine's producer does.

    Order (kv_engine's `DcpProducer::streamRequest`): the two checks on the request alone
    (start > end, snap_start <= start <= snap_end) answer ERANGE first, so a malformed request
    is never told to roll back; then the failover-table rollback decision (NOTES.md section 5);
    then ERANGE if start is beyond the producer's high seqno.

    >>> table = FailoverTable([FailoverEntry(0xBEEF, 0)])
    >>> decide_stream_request(StreamRequest(0, 2**64 - 1, 0, 0, 0), table, 5, 0)
    StreamAccepted(failover_log=FailoverLog(entries=(FailoverEntry(vbucket_uuid=48879, seqno=0),)))
    """
    start = request.start_seqno
    if start > request.end_seqno:
        return StreamRangeError(f"start seqno {start} is beyond end seqno {request.end_seqno}")
    if not request.snap_start_seqno <= start <= request.snap_end_seqno:
        return StreamRangeError(
            f"snap start {request.snap_start_seqno} <= start {start} <= "
            f"snap end {request.snap_end_seqno} does not hold"
        )
    rollback = _rollback_needed(request, table, high_seqno, purge_seqno)
    if rollback is not None:
        return rollback
    if start > high_seqno:
        return StreamRangeError(f"start seqno {start} is beyond the high seqno {high_seqno}")
    return StreamAccepted(table.log())


def _rollback_needed(
    request: StreamRequest,
    table: FailoverTable,
    high_seqno: int,
    purge_seqno: int,
) -> StreamRollback | None:
    start = request.start_seqno
    if start == 0 and (not request.strict_vb_uuid or request.vbucket_uuid == 0):
        return None
    if start != 0 and start < purge_seqno and not request.ignore_purged_tombstones:
        return StreamRollback(
            0, f"start {start} is below the purge seqno {purge_seqno}: deletions were purged"
        )
    upper = table.upper_bound(request.vbucket_uuid, high_seqno)
    if upper is None:
        return StreamRollback(0, f"vbucket uuid {request.vbucket_uuid} is not in the table")
    snap_start, snap_end = request.snap_start_seqno, request.snap_end_seqno
    if start == snap_start:
        # The consumer has none of the snapshot's items: it really stands at `start`.
        snap_end = start
    if snap_end <= upper:
        return None
    if start == snap_end:
        # The consumer has the whole snapshot: nothing before `start` needs redoing.
        snap_start = start
    rollback_seqno = upper if upper < snap_start else snap_start
    return StreamRollback(
        rollback_seqno, f"consumer ahead of producer: shared history ends at {upper}"
    )
