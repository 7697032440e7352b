"""One vbucket of the simulated bucket: its history by seqno and what a DCP stream is served.

Over 500 lines on purpose: the history arrays, the snapshot planning over them and the
`StreamCursor` that serves it are one data structure; split, each part would reach into the
others' internals. The item and write types are in replicator.sim.history_items.

The history is an append-only list with the item at seqno s at index s - 1 (seqnos have no
gaps: a failover only cuts the tail). Two parallel arrays say, for each item, which seqno
replaced it (0: still the latest version of its key) and which version it replaced; together
they give deduplicated backfills, `state_at` and failover truncation without copying history.

Serving follows kv_engine: a stream behind the in-memory checkpoints first gets a DISK
snapshot of one item per key (the latest as of the vbucket's high seqno then, purged tombstones
absent, marker end = that high seqno); after that, one MEMORY snapshot per batch of writes.

History retention (Couchbase 7.2+ change streams, magma buckets): with a retention by age
and/or bytes, the vbucket keeps a history window, the newest seqnos from `history_start_seqno`
on. A change-streams stream gets every revision of the documents of history-enabled collections
in that window: a disk snapshot reaching into it is split as kv_engine splits it (a deduplicated
prologue below the window, then a HISTORY snapshot), and a batch that writes a history-enabled
key twice is split into two checkpoints (memory snapshots), as kv_engine's historical
checkpoints never hold one key twice.

Memory: by default every version stays, so a failover may go back anywhere and `state_at`
answers for any seqno (what tests need). With `superseded_window` W, checkpoints hold at most
the last W items, and a version is freed once the seqno that replaced it is more than W
behind the high seqno (so below the checkpoints) and at or below the end of every snapshot a
stream is still serving (a snapshot is the consistent state of its end seqno and serves
versions replaced after it): memory then follows the live documents and the recent writes, not
the number of writes, as a server's does. A failover may then lose at most the last W seqnos,
and `state_at` answers from `earliest_state_seqno` on.
"""

from __future__ import annotations

import random
import threading
import time
import weakref
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass

from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
    SystemEvent,
    SystemEventType,
)
from replicator.model.positions import MAX_SEQNO, FailoverEntry, FailoverLog
from replicator.sim.collections import ManifestChange
from replicator.sim.failover_table import (
    FailoverTable,
    StreamDecision,
    StreamRequest,
    decide_stream_request,
)
from replicator.sim.history_items import (
    DocumentItem,
    DocumentNotFoundError,
    DocumentWrite,
    HistoryItem,
    ItemIdentity,
    WriteKind,
    history_item_size,
    item_identity,
)

_NANOS_PER_SECOND = 1_000_000_000
_HLC_LOGICAL_MASK = 0xFFFF
"""kv_engine's hybrid logical clock keeps a counter in the low 16 bits of the CAS."""

DEFAULT_CHECKPOINT_MAX_ITEMS = 10_000


@dataclass(frozen=True, slots=True)
class ServedSnapshot:
    """A part of one snapshot as a stream serves it.

    `marker` is set on the first part of a snapshot and None on its continuations (large
    backfills are served in parts); `is_last_part` says the snapshot ends with these items.
    Expirations are recorded as `Expiration`: the server sends them as DELETION to consumers
    that did not enable the expiry opcode (see `expiration_as_deletion`).

    `prologue` marks every part of the deduplicated disk snapshot that precedes a HISTORY
    snapshot of the same range (kv_engine's NoHistoryPrecedingHistory): its marker is sent
    only along with an item, and nothing (no SEQNO_ADVANCED) closes it; the HISTORY snapshot's
    marker follows.
    """

    marker: SnapshotMarker | None
    items: tuple[HistoryItem, ...]
    is_last_part: bool
    prologue: bool = False
    from_disk: bool = False
    """The part belongs to a disk snapshot (a backfill)."""


@dataclass(slots=True, weakref_slot=True, eq=False)  # identity: kept in a WeakSet
class _SnapshotInProgress:
    marker: SnapshotMarker | None  # still to be sent with the first part
    next_seqno: int
    end_seqno: int  # the marker's end: what deduplication looks up to
    is_disk: bool
    last_seqno: int  # the last seqno this snapshot reads (a prologue stops before history)
    history_from: int = 0  # from here on, history-enabled collections keep every revision
    prologue: bool = False
    follow_up: _SnapshotInProgress | None = None  # the HISTORY snapshot after a prologue


class VBucket:
    """One vbucket's documents, history, failover table and checkpoints.

    Every method takes `lock` (shared by a bucket's vbuckets), so tests may write while server
    threads read through cursors; `lock.notify_all()` runs after each change.

    History retention is on when `history_retention_seconds` or `history_retention_bytes`
    (this vbucket's share of the bucket's budget) is positive; `history_collections` holds the
    ids of the collections with history (the bucket shares its live set).
    """

    def __init__(
        self,
        vbucket: int,
        *,
        rng: random.Random,
        lock: threading.Condition | None = None,
        may_contain_duplicates: bool = False,
        checkpoint_max_items: int = DEFAULT_CHECKPOINT_MAX_ITEMS,
        clock_ns: Callable[[], int] = time.time_ns,
        history_retention_seconds: int = 0,
        history_retention_bytes: int = 0,
        history_collections: Set[int] = frozenset(),
        superseded_window: int | None = None,
    ) -> None:
        if checkpoint_max_items < 1:
            raise ValueError(f"checkpoint_max_items must be positive, got {checkpoint_max_items}")
        if history_retention_seconds < 0 or history_retention_bytes < 0:
            raise ValueError(
                "history retention must not be negative, got "
                f"{history_retention_seconds} s and {history_retention_bytes} bytes"
            )
        if superseded_window is not None and superseded_window < 1:
            raise ValueError(f"superseded_window must be positive, got {superseded_window}")
        if superseded_window is not None and (history_retention_seconds or history_retention_bytes):
            raise ValueError("a vbucket that retains history keeps its superseded versions")
        self.vbucket = vbucket
        self.lock = lock if lock is not None else threading.Condition(threading.RLock())
        self.may_contain_duplicates = may_contain_duplicates
        self._checkpoint_max_items = min(checkpoint_max_items, superseded_window or MAX_SEQNO)
        self._clock_ns = clock_ns
        self._rng = rng
        self._failover = FailoverTable.new(rng)
        # The item at seqno s is at index s - 1; None once freed (superseded_window).
        self._history: list[HistoryItem] = []
        self._superseded_by = array("Q")  # per item: seqno of the next version of its key, or 0
        self._previous = array("Q")  # per item: seqno of the version it replaced, or 0
        self._latest: dict[ItemIdentity, int] = {}
        self._expiring: dict[ItemIdentity, int] = {}  # live documents with an expiry: when
        self._dropped_at: dict[int, int] = {}  # collection id -> seqno of its drop event
        self._manifest_events: list[tuple[int, int]] = []  # (seqno, ManifestChange.sequence)
        self._batch_ends: list[int] = []
        self._memory_low_seqno = 0
        self._purge_seqno = 0
        self._last_cas = 0
        self._generation = 0
        self._history_seconds = history_retention_seconds
        self._history_bytes = history_retention_bytes
        self._history_collections = history_collections
        self._retains_history = history_retention_seconds > 0 or history_retention_bytes > 0
        # Kept only while retaining history: per item its HLC time (ns, never decreasing) and
        # the running total of item sizes (_size_totals[s] = sizes of seqnos 1..s).
        self._item_times = array("Q")
        self._size_totals = array("Q", [0])
        self._history_floor = 0  # history once purged never comes back
        self._superseded_window = superseded_window
        # Versions replaced at or below this seqno are freed (their history slot is None).
        self._freed_through = 0
        self._free_due_at = 0  # the high seqno at which to look for versions to free again
        # Snapshots streams are serving (with a window only): they hold the freeing back.
        self._open_snapshots: weakref.WeakSet[_SnapshotInProgress] = weakref.WeakSet()

    # -- state --------------------------------------------------------------------------

    @property
    def high_seqno(self) -> int:
        return len(self._history)

    @property
    def purge_seqno(self) -> int:
        """Tombstones at or below this seqno are gone from what a backfill serves."""
        return self._purge_seqno

    @property
    def memory_low_seqno(self) -> int:
        """Checkpoints hold the items above this seqno; a stream behind it is backfilled."""
        return self._memory_low_seqno

    @property
    def earliest_state_seqno(self) -> int:
        """The oldest seqno `state_at` can answer for and a failover can go back to.

        0 unless `superseded_window` frees old versions (see the module's docstring).
        """
        with self.lock:
            return self._freed_through

    @property
    def retains_history(self) -> bool:
        """True when history retention is on (by age, by bytes or both)."""
        return self._retains_history

    @property
    def history_start_seqno(self) -> int:
        """The first seqno of the history window; 0 when no history is retained.

        The window holds the newest items within the byte budget whose CAS time is within
        the age limit; high seqno + 1 means none is (the next write starts it again).
        """
        with self.lock:
            return self._history_start()

    def history_revisions(self) -> list[DocumentItem]:
        """Every revision in the history window of a collection with history, by seqno.

        What a change-streams stream serves of those collections from the window start on:
        dropped collections and purged tombstones are left out, as they are from backfills.
        """
        with self.lock:
            start = self._history_start()
            if not start:
                return []
            history, cids, dropped = self._history, self._history_collections, self._dropped_at
            purge_seqno = self._purge_seqno
            revisions: list[DocumentItem] = []
            for index in range(start - 1, len(history)):
                item = history[index]
                if isinstance(item, SystemEvent):
                    continue
                if item.collection_id not in cids or item.collection_id in dropped:
                    continue
                if not isinstance(item, Mutation) and item.by_seqno <= purge_seqno:
                    continue
                revisions.append(item)
            return revisions

    @property
    def manifest_events_applied(self) -> int:
        """How many of the manifest's system events this vbucket's history holds."""
        with self.lock:
            return self._manifest_events[-1][1] + 1 if self._manifest_events else 0

    def failover_log(self) -> FailoverLog:
        with self.lock:
            return self._failover.log()

    def item_at(self, seqno: int) -> HistoryItem:
        """The history item written at `seqno` (1 .. high seqno)."""
        with self.lock:
            if not 0 < seqno <= len(self._history):
                raise ValueError(f"vbucket {self.vbucket} has no seqno {seqno}")
            item = self._history[seqno - 1]
            if item is None:
                raise ValueError(
                    f"vbucket {self.vbucket}: the version at seqno {seqno} was replaced and "
                    f"freed (superseded_window {self._superseded_window})"
                )
            return item

    def documents(self) -> list[Mutation]:
        """The live documents, by seqno: not deleted, not expired by the pager, not dropped.

        A document past its expiry that the pager has not visited yet is still here, as the
        server would still serve it.
        """
        with self.lock:
            history, dropped = self._history, self._dropped_at
            live = []
            for seqno in sorted(self._latest.values()):
                item = history[seqno - 1]
                if isinstance(item, Mutation) and item.collection_id not in dropped:
                    live.append(item)
            return live

    def state_at(self, seqno: int) -> list[Mutation]:
        """The live documents as they were right after `seqno` was written (O(seqno))."""
        with self.lock:
            if not 0 <= seqno <= len(self._history):
                raise ValueError(
                    f"vbucket {self.vbucket}: seqno {seqno} is beyond the high seqno "
                    f"{len(self._history)}"
                )
            if seqno < self._freed_through:
                raise ValueError(
                    f"vbucket {self.vbucket}: the state at seqno {seqno} is gone: versions "
                    f"replaced at or below {self._freed_through} were freed (superseded_window "
                    f"{self._superseded_window})"
                )
            superseded, history = self._superseded_by, self._history
            dropped = {cid: at for cid, at in self._dropped_at.items() if at <= seqno}
            live = []
            for index in range(seqno):
                item = history[index]
                if not isinstance(item, Mutation) or item.collection_id in dropped:
                    continue
                replaced_at = superseded[index]
                if replaced_at == 0 or replaced_at > seqno:
                    live.append(item)
            return live

    # -- writes -------------------------------------------------------------------------

    def apply_writes(self, writes: Sequence[DocumentWrite]) -> tuple[HistoryItem, ...]:
        """Apply document writes as one batch (one memory snapshot); returns the items written.

        All writes are checked before any is applied, so a failing batch changes nothing.
        While retaining history, a second write of a key of a collection with history starts
        a new memory snapshot (checkpoint) at that write.
        """
        if not writes:
            return ()
        with self.lock:
            self.check_writes(writes)
            now_s = self._clock_ns() // _NANOS_PER_SECOND
            written = []
            for write in writes:
                if self._retains_history and write.collection_id in self._history_collections:
                    # A historical checkpoint never holds one key twice: a second revision
                    # of the key goes into a new checkpoint (kv_engine).
                    previous = self._latest.get((write.collection_id, write.key), 0)
                    if previous > (self._batch_ends[-1] if self._batch_ends else 0):
                        self._end_batch()
                written.append(self._write_document(write, now_s))
            self._end_batch()
            return tuple(written)

    def check_writes(self, writes: Sequence[DocumentWrite]) -> None:
        """Raise if `apply_writes(writes)` would fail (missing document, dropped collection)."""
        with self.lock:
            overlay: dict[ItemIdentity, bool] = {}
            for write in writes:
                identity = (write.collection_id, write.key)
                if write.collection_id in self._dropped_at:
                    raise ValueError(
                        f"vbucket {self.vbucket}: collection 0x{write.collection_id:x} is dropped"
                    )
                if write.kind is WriteKind.UPSERT:
                    overlay[identity] = True
                    continue
                exists = overlay.get(identity)
                if exists is None:
                    exists = self._is_live(identity)
                if not exists:
                    raise DocumentNotFoundError(self.vbucket, write.collection_id, write.key)
                overlay[identity] = write.kind is WriteKind.TOUCH

    def apply_manifest_changes(self, changes: Iterable[ManifestChange]) -> tuple[SystemEvent, ...]:
        """Write one system event per manifest change, as one batch; returns them."""
        with self.lock:
            events = []
            for change in changes:
                event = SystemEvent(
                    vbucket=self.vbucket,
                    by_seqno=self.high_seqno + 1,
                    event=change.event,
                    version=0,
                    name=change.name,
                    manifest_uid=change.manifest_uid,
                    scope_id=change.scope_id,
                    collection_id=change.collection_id,
                )
                self._append(event)
                self._manifest_events.append((event.by_seqno, change.sequence))
                if change.event is SystemEventType.COLLECTION_DROPPED:
                    assert change.collection_id is not None
                    self._dropped_at[change.collection_id] = event.by_seqno
                    self._forget_expiring(change.collection_id)
                events.append(event)
            if events:
                self._end_batch()
            return tuple(events)

    def run_expiry_pager(self, now: int) -> tuple[Expiration, ...]:
        """Expire every live document whose expiry (unix seconds) is at or before `now`."""
        with self.lock:
            due = [identity for identity, expiry in self._expiring.items() if expiry <= now]
            due.sort(key=self._latest.__getitem__)  # in the order they were written
            expired = tuple(self._expire(identity, now) for identity in due)
            if expired:
                self._end_batch()
            return expired

    def purge_tombstones(self, up_to: int | None = None) -> int:
        """Hide tombstones at or below `up_to` (default all) from backfills; return the purge seqno.

        Compaction only purges what is on disk, so checkpoints up to there are expelled too.
        """
        with self.lock:
            high = len(self._history)
            target = high if up_to is None else up_to
            if not 0 <= target <= high:
                raise ValueError(
                    f"vbucket {self.vbucket}: cannot purge up to {target}, high seqno is {high}"
                )
            self._purge_seqno = max(self._purge_seqno, target)
            self._expel_up_to(self._purge_seqno)
            self.lock.notify_all()
            return self._purge_seqno

    def evict_checkpoints(self) -> None:
        """Expel every checkpoint, as after persistence: all streams behind now backfill."""
        with self.lock:
            self._memory_low_seqno = len(self._history)
            self.lock.notify_all()

    def failover(self, lose_last: int, rng: random.Random | None = None) -> FailoverEntry:
        """Promote a replica that lacked the last `lose_last` items; returns the new branch.

        History and documents go back to high - lose_last (older versions come back), a new
        failover entry starts there, and every open cursor ends with STATE_CHANGED.
        """
        with self.lock:
            new_high = self.lose_history(lose_last)
            return self._failover.failover(new_high, rng if rng is not None else self._rng)

    def lose_history(self, lose_last: int) -> int:
        """Forget the last `lose_last` items; returns the new high seqno.

        Alone, without the new failover entry `failover` adds, this is what a broken producer
        does when it restarts with less data under the same vbucket uuid: real servers never
        do, and the consumer must notice (the high seqno below its own).
        """
        with self.lock:
            high = len(self._history)
            if not 0 <= lose_last <= high - self._freed_through:
                raise ValueError(
                    f"vbucket {self.vbucket}: lose_last must be in "
                    f"0..{high - self._freed_through}, got {lose_last}"
                    + (
                        f" (versions replaced at or below seqno {self._freed_through} were "
                        f"freed: superseded_window {self._superseded_window})"
                        if self._freed_through
                        else ""
                    )
                )
            if self._retains_history and high:
                self._history_start()  # what was purged before the failover stays purged
            self._truncate(high - lose_last)
            self._generation += 1
            self.lock.notify_all()
            return high - lose_last

    # -- streams ------------------------------------------------------------------------

    def stream_request(self, request: StreamRequest) -> StreamDecision:
        """The producer's answer to a stream request against the current state."""
        with self.lock:
            return decide_stream_request(
                request, self._failover, len(self._history), self._purge_seqno
            )

    def open_cursor(
        self,
        start_seqno: int,
        end_seqno: int = MAX_SEQNO,
        *,
        snap_start_seqno: int | None = None,
        change_streams: bool = False,
    ) -> StreamCursor:
        """A cursor serving everything after `start_seqno` up to `end_seqno`.

        `snap_start_seqno` is the request's; the first marker starts no later than it.
        With `change_streams` (the DCP control), history is served as HISTORY snapshots.
        """
        with self.lock:
            if start_seqno > len(self._history):
                raise ValueError(
                    f"vbucket {self.vbucket}: start seqno {start_seqno} is beyond the high "
                    f"seqno {len(self._history)}"
                )
            if start_seqno > end_seqno:
                raise ValueError(f"start seqno {start_seqno} is beyond end seqno {end_seqno}")
            snap_start = start_seqno if snap_start_seqno is None else snap_start_seqno
            if snap_start > start_seqno:
                raise ValueError(f"snap start {snap_start} is beyond start seqno {start_seqno}")
            return StreamCursor(
                self,
                start_seqno,
                end_seqno,
                snap_start,
                self._generation,
                change_streams=change_streams,
            )

    # -- internals ----------------------------------------------------------------------

    def _is_live(self, identity: ItemIdentity) -> bool:
        seqno = self._latest.get(identity)
        return seqno is not None and isinstance(self._history[seqno - 1], Mutation)

    def _write_document(self, write: DocumentWrite, now_s: int) -> HistoryItem:
        identity = (write.collection_id, write.key)
        previous_seqno = self._latest.get(identity, 0)
        previous = self._history[previous_seqno - 1] if previous_seqno else None
        # A key rewritten after its deletion continues from the tombstone's revision.
        rev_seqno = 1 if previous is None else _revision(previous) + 1
        seqno = len(self._history) + 1
        item: HistoryItem
        if write.kind is WriteKind.UPSERT:
            item = Mutation(
                vbucket=self.vbucket,
                by_seqno=seqno,
                rev_seqno=rev_seqno,
                cas=self._next_cas(),
                flags=write.flags,
                expiration=write.expiry,
                lock_time=0,
                collection_id=write.collection_id,
                key=write.key,
                value=write.value,
                is_json=write.is_json,
                xattrs=write.xattrs,
            )
        elif write.kind is WriteKind.TOUCH:
            assert isinstance(previous, Mutation)
            item = Mutation(
                vbucket=self.vbucket,
                by_seqno=seqno,
                rev_seqno=rev_seqno,
                cas=self._next_cas(),
                flags=previous.flags,
                expiration=write.expiry,
                lock_time=0,
                collection_id=write.collection_id,
                key=write.key,
                value=previous.value,
                is_json=previous.is_json,
                xattrs=previous.xattrs,
            )
        elif write.kind is WriteKind.DELETE:
            assert isinstance(previous, Mutation)
            item = Deletion(
                vbucket=self.vbucket,
                by_seqno=seqno,
                rev_seqno=rev_seqno,
                cas=self._next_cas(),
                collection_id=write.collection_id,
                key=write.key,
                delete_time=now_s,
                xattrs=_system_xattrs(previous.xattrs),
            )
        else:
            return self._expire(identity, now_s)
        self._append(item, identity, previous_seqno)
        return item

    def _expire(self, identity: ItemIdentity, now_s: int) -> Expiration:
        previous_seqno = self._latest[identity]
        previous = self._history[previous_seqno - 1]
        assert isinstance(previous, Mutation)
        item = Expiration(
            vbucket=self.vbucket,
            by_seqno=len(self._history) + 1,
            rev_seqno=previous.rev_seqno + 1,
            cas=self._next_cas(),
            collection_id=previous.collection_id,
            key=previous.key,
            delete_time=now_s,
        )
        self._append(item, identity, previous_seqno)
        return item

    def _append(
        self,
        item: HistoryItem,
        identity: ItemIdentity | None = None,
        previous_seqno: int | None = None,
    ) -> None:
        if identity is None:
            identity = item_identity(item)
        if previous_seqno is None:
            previous_seqno = self._latest.get(identity, 0)
        seqno = item.by_seqno
        self._history.append(item)
        self._superseded_by.append(0)
        self._previous.append(previous_seqno)
        if self._retains_history:
            # System events carry no CAS; they take an HLC tick for their time.
            stamp = self._next_cas() if isinstance(item, SystemEvent) else item.cas
            self._item_times.append(stamp)
            self._size_totals.append(self._size_totals[-1] + history_item_size(item))
        if previous_seqno:
            self._superseded_by[previous_seqno - 1] = seqno
        self._latest[identity] = seqno
        if isinstance(item, Mutation) and item.expiration:
            self._expiring[identity] = item.expiration
        else:
            self._expiring.pop(identity, None)

    def _next_cas(self) -> int:
        cas = self._clock_ns() & ~_HLC_LOGICAL_MASK
        if cas <= self._last_cas:
            cas = self._last_cas + 1  # the logical part counts up while the clock stands still
        self._last_cas = cas
        return cas

    def _forget_expiring(self, collection_id: int) -> None:
        for identity in [i for i in self._expiring if i[0] == collection_id]:
            del self._expiring[identity]

    def _history_start(self) -> int:
        """`history_start_seqno` (under the lock); moves the purge watermark up."""
        high = len(self._history)
        if not self._retains_history or not high:
            return 0
        start = max(1, self._history_floor)
        if self._history_bytes:
            totals = self._size_totals
            # The smallest s with (sizes of s..high) <= budget: totals[s - 1] >= total - budget.
            start = max(start, bisect_left(totals, totals[high] - self._history_bytes) + 1)
        if self._history_seconds:
            # Retained while (now - CAS time) <= retention, both in whole seconds.
            now_s = self._clock_ns() // _NANOS_PER_SECOND
            oldest_ns = (now_s - self._history_seconds) * _NANOS_PER_SECOND
            start = max(start, bisect_left(self._item_times, oldest_ns) + 1)
        start = min(start, high + 1)
        self._history_floor = start
        return start

    def _end_batch(self) -> None:
        high = len(self._history)
        self._batch_ends.append(high)
        if high - self._memory_low_seqno > self._checkpoint_max_items:
            # Expel whole checkpoints, oldest first, until the rest fits.
            ends = self._batch_ends
            self._expel_up_to(ends[bisect_left(ends, high - self._checkpoint_max_items)])
        window = self._superseded_window
        # Freed in steps of about 1/32 of the window, even while a snapshot being served holds
        # the freeing back: a look at them per batch cost the producer's writer a tenth of its
        # time at 20,000 changes/s.
        if window is not None and high >= self._free_due_at:
            self._free_superseded(window)
            self._free_due_at = high + max(1, window // 32)
        self.lock.notify_all()

    def _free_superseded(self, window: int) -> None:
        """Free the versions no stream, failover or state question can need any more."""
        # Checkpoints hold at most `window` items (see __init__), so no snapshot planned from
        # now on reaches below this floor; one a stream is still serving may.
        floor = len(self._history) - window
        for snapshot in self._open_snapshots:
            floor = min(floor, snapshot.end_seqno)
        history, previous = self._history, self._previous
        for replacing in range(self._freed_through + 1, floor + 1):
            replaced = previous[replacing - 1]
            if replaced and not isinstance(history[replaced - 1], SystemEvent):
                history[replaced - 1] = None  # type: ignore[call-overload]
        self._freed_through = max(self._freed_through, floor)

    def _expel_up_to(self, seqno: int) -> None:
        if seqno <= self._memory_low_seqno:
            return
        ends = self._batch_ends
        index = bisect_left(ends, seqno)
        # Checkpoints go whole: the memory boundary is always a batch end.
        self._memory_low_seqno = ends[index] if index < len(ends) else len(self._history)

    def _truncate(self, new_high: int) -> None:
        history, previous, superseded = self._history, self._previous, self._superseded_by
        touched: set[ItemIdentity] = set()
        for index in range(len(history) - 1, new_high - 1, -1):
            identity = item_identity(history[index])
            restored = previous[index]
            if restored:
                self._latest[identity] = restored
                if restored <= new_high:
                    superseded[restored - 1] = 0
            else:
                del self._latest[identity]
            touched.add(identity)
        del history[new_high:]
        del previous[new_high:]
        del superseded[new_high:]
        if self._retains_history:
            del self._item_times[new_high:]
            del self._size_totals[new_high + 1 :]
            # Only the lost tail goes: the retained history below stays, none comes back.
            self._history_floor = min(self._history_floor, new_high + 1)
        for identity in touched:
            seqno = self._latest.get(identity)
            item = history[seqno - 1] if seqno else None
            if isinstance(item, Mutation) and item.expiration:
                self._expiring[identity] = item.expiration
            else:
                self._expiring.pop(identity, None)
        revived = {cid for cid, at in self._dropped_at.items() if at > new_high}
        self._dropped_at = {cid: at for cid, at in self._dropped_at.items() if at <= new_high}
        if revived:
            # Their drop is undone: their documents' expiries count again.
            for identity, seqno in self._latest.items():
                item = history[seqno - 1]
                if identity[0] in revived and isinstance(item, Mutation) and item.expiration:
                    self._expiring[identity] = item.expiration
        self._manifest_events = [e for e in self._manifest_events if e[0] <= new_high]
        ends = self._batch_ends
        del ends[bisect_left(ends, new_high + 1) :]
        if new_high and (not ends or ends[-1] < new_high):
            ends.append(new_high)  # the promoted replica had part of that batch
        self._memory_low_seqno = min(self._memory_low_seqno, new_high)
        self._purge_seqno = min(self._purge_seqno, new_high)

    def _plan_snapshot(
        self,
        position: int,
        end_seqno: int,
        first_marker_start: int | None,
        change_streams: bool = False,
    ) -> _SnapshotInProgress:
        high = len(self._history)
        if position < self._memory_low_seqno:
            start, end = position + 1, min(high, end_seqno)
            if first_marker_start is not None:
                # A stream's first marker starts no later than the request's snap start.
                start = min(start, first_marker_start)
            flags = SnapshotFlags.DISK | SnapshotFlags.CHECKPOINT
            history_start = self._history_start() if change_streams else 0
            plain = _SnapshotInProgress(
                self._marker(start, end, flags, is_disk=True), position + 1, end, True, end
            )
            if not history_start or history_start > end:
                return plain
            # kv_engine: the part of the backfill in the history window is a HISTORY snapshot
            # keeping every revision of history-enabled collections; the part below it, if
            # any, a deduplicated snapshot first. Both markers name the whole range.
            history_flags = flags | SnapshotFlags.HISTORY | SnapshotFlags.MAY_CONTAIN_DUPLICATES
            history = _SnapshotInProgress(
                self._marker(start, end, history_flags, is_disk=True),
                max(position + 1, history_start),
                end,
                True,
                end,
                history_from=history_start,
            )
            if position + 1 >= history_start:
                return history
            plain.last_seqno = history_start - 1
            plain.prologue = True
            plain.follow_up = history
            return plain
        index = bisect_left(self._batch_ends, position + 1)
        batch_start = self._batch_ends[index - 1] + 1 if index else 1
        start = max(batch_start, position + 1)
        end = min(self._batch_ends[index], end_seqno)
        if first_marker_start is not None:
            start = min(start, first_marker_start)
        flags = SnapshotFlags.MEMORY | SnapshotFlags.CHECKPOINT
        if self.may_contain_duplicates:
            flags |= SnapshotFlags.MAY_CONTAIN_DUPLICATES
        if change_streams and self._retains_history:
            # A checkpoint written while the bucket retains history is historical: kv_engine
            # flags it HISTORY (not MAY_CONTAIN_DUPLICATES: it never holds one key twice).
            flags |= SnapshotFlags.HISTORY
        marker = self._marker(start, end, flags, is_disk=False)
        return _SnapshotInProgress(marker, position + 1, end, False, end)

    def _marker(
        self, start: int, end: int, flags: SnapshotFlags, *, is_disk: bool
    ) -> SnapshotMarker:
        return SnapshotMarker(
            vbucket=self.vbucket,
            start_seqno=start,
            end_seqno=end,
            flags=flags,
            max_visible_seqno=end,
            high_completed_seqno=0 if is_disk else None,
            purge_seqno=self._purge_seqno,
            high_prepared_seqno=0 if is_disk else None,
        )

    def _serve(self, snapshot: _SnapshotInProgress, max_items: int) -> ServedSnapshot:
        history, superseded = self._history, self._superseded_by
        end, last = snapshot.end_seqno, snapshot.last_seqno
        keep_duplicates = not snapshot.is_disk and self.may_contain_duplicates
        purge_seqno = self._purge_seqno if snapshot.is_disk else 0
        dropped = self._dropped_at
        history_from = snapshot.history_from
        history_collections = self._history_collections
        items: list[HistoryItem] = []
        seqno = snapshot.next_seqno
        while seqno <= last and len(items) < max_items:
            item = history[seqno - 1]
            replaced_at = superseded[seqno - 1]
            if item is None:
                seqno += 1
                continue  # freed: replaced long ago, as gone as from a server's seqno index
            if (
                not keep_duplicates
                and replaced_at
                and replaced_at <= end
                and not (
                    history_from
                    and seqno >= history_from
                    and not isinstance(item, SystemEvent)
                    and item.collection_id in history_collections
                )
            ):
                seqno += 1
                continue  # a later version within this snapshot replaces it
            seqno += 1
            if isinstance(item, SystemEvent):
                items.append(item)
                continue
            dropped_at = dropped.get(item.collection_id)
            if dropped_at is not None and dropped_at <= end:
                continue  # its collection's drop is in this snapshot: logically deleted
            if item.by_seqno <= purge_seqno and not isinstance(item, Mutation):
                continue  # a purged tombstone
            items.append(item)
        snapshot.next_seqno = seqno
        if self._superseded_window is not None:
            # An unfinished snapshot keeps its versions until served; most are served whole by
            # the call that planned them (one hold of the lock) and never need registering.
            if seqno > last:
                self._open_snapshots.discard(snapshot)
            else:
                self._open_snapshots.add(snapshot)
        marker, snapshot.marker = snapshot.marker, None
        return ServedSnapshot(
            marker, tuple(items), seqno > last, snapshot.prologue, from_disk=snapshot.is_disk
        )


class StreamCursor:
    """Where one DCP stream of a vbucket stands; hands out snapshots in parts.

    Safe against concurrent writes: every call takes the vbucket's lock, and history is only
    ever appended to (a failover ends the cursor instead).
    """

    def __init__(
        self,
        vbucket: VBucket,
        start_seqno: int,
        end_seqno: int,
        snap_start_seqno: int,
        generation: int,
        *,
        change_streams: bool = False,
    ) -> None:
        self._vbucket = vbucket
        self._change_streams = change_streams
        self._snap_start_seqno = snap_start_seqno
        self._position = start_seqno
        self._end_seqno = end_seqno
        self._generation = generation
        self._snapshot: _SnapshotInProgress | None = None
        self._snapshots_started = 0
        self._finished = False

    @property
    def vbucket(self) -> int:
        return self._vbucket.vbucket

    @property
    def position(self) -> int:
        """The last seqno served (or skipped) so far."""
        return self._position

    @property
    def finished(self) -> bool:
        """True once the cursor has handed out its StreamEnd."""
        return self._finished

    def next_snapshot(self, max_items: int = 1024) -> ServedSnapshot | StreamEnd | None:
        """The next part of a snapshot; a StreamEnd when the stream is over; None if caught up.

        StreamEnd is OK once `end_seqno` is served, STATE_CHANGED after a failover of the
        vbucket; after it the cursor only returns None.
        """
        if max_items < 1:
            raise ValueError(f"max_items must be positive, got {max_items}")
        vbucket = self._vbucket
        with vbucket.lock:
            if self._finished:
                return None
            if self._generation != vbucket._generation:
                return self._finish(StreamEndReason.STATE_CHANGED)
            if self._snapshot is None:
                if self._position >= self._end_seqno:
                    return self._finish(StreamEndReason.OK)
                if self._position >= vbucket.high_seqno:
                    return None
                first_start = self._snap_start_seqno if self._snapshots_started == 0 else None
                self._snapshot = vbucket._plan_snapshot(
                    self._position, self._end_seqno, first_start, self._change_streams
                )
                self._snapshots_started += 1
            part = vbucket._serve(self._snapshot, max_items)
            self._position = self._snapshot.next_seqno - 1
            if part.is_last_part:
                self._snapshot = self._snapshot.follow_up
            return part

    @property
    def backfilling(self) -> bool:
        """True while the cursor serves, or is about to serve, a disk snapshot."""
        vbucket = self._vbucket
        with vbucket.lock:
            if self._finished or self._generation != vbucket._generation:
                return False
            if self._snapshot is not None:
                return self._snapshot.is_disk
            return self._position < vbucket._memory_low_seqno and self._position < self._end_seqno

    def has_pending(self) -> bool:
        """True if `next_snapshot` would return something now."""
        vbucket = self._vbucket
        with vbucket.lock:
            if self._finished:
                return False
            return (
                self._generation != vbucket._generation
                or self._snapshot is not None
                or self._position >= self._end_seqno
                or self._position < vbucket.high_seqno
            )

    def wait_for_items(self, timeout: float | None = None) -> bool:
        """Block until `has_pending()` or `timeout` seconds pass; returns `has_pending()`."""
        with self._vbucket.lock:
            return self._vbucket.lock.wait_for(self.has_pending, timeout)

    def close(self) -> None:
        """Stop serving (a CLOSE_STREAM): the cursor only returns None from now on."""
        with self._vbucket.lock:
            self._finished = True
            self._snapshot = None

    def _finish(self, reason: StreamEndReason) -> StreamEnd:
        self._finished = True
        self._snapshot = None
        return StreamEnd(self._vbucket.vbucket, reason)


def _revision(item: HistoryItem) -> int:
    return 0 if isinstance(item, SystemEvent) else item.rev_seqno


def _system_xattrs(xattrs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    # A deleted document keeps its system xattrs (names starting with "_"), not user ones.
    return tuple(pair for pair in xattrs if pair[0].startswith("_"))
