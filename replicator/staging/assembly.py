"""Per-vbucket snapshot assembly: typed DCP events in, complete snapshots out.

A snapshot [start, end] is complete (NOTES section 4) when an item with seqno == end arrives, or
the next snapshot marker arrives, or the stream ends OK. Its first items may never arrive
(deduplication) and it may end without its last item. An out-of-sequence-order (OSO) backfill
has no marker: OSO start .. OSO end bracket items in key order, and the end completes a snapshot
whose end is the highest seqno seen.

Only whole snapshots are ever persisted, so a partial snapshot is held until complete and
dropped when its stream fails. The assembler is pure state: no I/O, no clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from replicator.dcp.protocol.events import (
    Deletion,
    DocumentChanges,
    Expiration,
    ItemEvent,
    Mutation,
    OsoFlags,
    OsoSnapshot,
    RollbackRequired,
    SeqnoAdvanced,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
    StreamEvent,
    StreamOpened,
    SystemEvent,
    SystemEventType,
)
from replicator.dcp.protocol.opcodes import Opcode
from replicator.errors import ProtocolError

_OPCODES: dict[type, int] = {
    SnapshotMarker: Opcode.DCP_SNAPSHOT_MARKER,
    Mutation: Opcode.DCP_MUTATION,
    Deletion: Opcode.DCP_DELETION,
    Expiration: Opcode.DCP_EXPIRATION,
    SystemEvent: Opcode.DCP_SYSTEM_EVENT,
    SeqnoAdvanced: Opcode.DCP_SEQNO_ADVANCED,
    OsoSnapshot: Opcode.DCP_OSO_SNAPSHOT,
    StreamEnd: Opcode.DCP_STREAM_END,
}


class Completion(enum.Enum):
    """What told the assembler that a snapshot was complete."""

    END_ITEM = "item at the end seqno"
    NEXT_MARKER = "next snapshot marker"
    STREAM_END = "stream end OK"
    OSO_END = "OSO snapshot end"


@dataclass(frozen=True, slots=True)
class CompleteSnapshot:
    """A whole snapshot [start_seqno, end_seqno] of one vbucket, safe to persist.

    `items` holds the accepted items in arrival order when the assembler keeps items, else is
    empty (the caller staged them as they arrived); `item_count` counts them either way.
    `purge_seqno` comes from a v2.2 marker, `manifest_uid` is the vbucket's collections manifest
    uid after the snapshot (from system events; None if none was seen yet), and
    `dropped_collection_ids` lists collections dropped inside the snapshot: DCP sends no
    deletions for their documents, so the mirror must remove them itself.
    """

    vbucket: int
    start_seqno: int
    end_seqno: int
    flags: SnapshotFlags
    items: tuple[ItemEvent, ...] = ()
    item_count: int = 0
    completed_by: Completion = Completion.END_ITEM
    purge_seqno: int | None = None
    manifest_uid: int | None = None
    dropped_collection_ids: tuple[int, ...] = ()
    is_oso: bool = False
    history_from: int | None = None
    """With HISTORY in `flags`: the first seqno of the snapshot's history part (every revision
    from there to the end; a backfill's deduplicated part comes before it)."""


@dataclass(slots=True)
class _OpenSnapshot:
    """The snapshot a vbucket is receiving (mutable, private to the assembler)."""

    start_seqno: int
    end_seqno: int  # for OSO: the highest seqno seen so far
    flags: SnapshotFlags
    is_oso: bool
    purge_seqno: int | None = None
    last_seqno: int | None = None
    min_seqno: int | None = None
    item_count: int = 0
    items: list[ItemEvent] = field(default_factory=list)
    dropped_collection_ids: list[int] = field(default_factory=list)
    history_from: int | None = None


@dataclass(slots=True)
class _VbucketAssembly:
    vbucket: int
    completed_end: int | None = None
    manifest_uid: int | None = None
    open: _OpenSnapshot | None = None


class SnapshotAssembler:
    """Assembles the events of many vbuckets, each fed in its own stream order, into snapshots.

    >>> from replicator.dcp.protocol.events import SnapshotMarker, SnapshotFlags, SeqnoAdvanced
    >>> assembler = SnapshotAssembler()
    >>> assembler.feed(SnapshotMarker(3, 1, 5, SnapshotFlags.MEMORY)) is None
    True
    >>> assembler.feed(SeqnoAdvanced(3, 5)).end_seqno
    5

    With `keep_items=False` the snapshots carry no items: the caller stages each item as `feed`
    accepts it (bounded memory for a backfill that is one snapshot of a whole vbucket). `feed`
    raises `ProtocolError` on an item outside the open snapshot or not after the previous one;
    the event is then not accepted and the assembler's state is unchanged.
    """

    def __init__(self, *, keep_items: bool = True) -> None:
        self._keep_items = keep_items
        self._vbuckets: dict[int, _VbucketAssembly] = {}

    def feed(self, event: StreamEvent) -> CompleteSnapshot | None:
        """Take the vbucket's next event; return the snapshot it completes, if any.

        A `DocumentChanges` run is checked as a whole (the usual case) and only taken apart
        when something is wrong with it: then its items are fed one by one and the
        ProtocolError names the bad one (a snapshot an earlier item of the run completed is
        not returned: the vbucket's stream is reopened from its committed position anyway).
        """
        state = self._state(event.vbucket)
        if type(event) is DocumentChanges:
            return self._accept_run(state, event)
        if isinstance(event, Mutation | Deletion | Expiration | SystemEvent | SeqnoAdvanced):
            return self._accept_item(state, event)
        if isinstance(event, SnapshotMarker):
            return self._open_marker(state, event)
        if isinstance(event, OsoSnapshot):
            return self._oso(state, event)
        if isinstance(event, StreamEnd):
            return self._stream_end(state, event)
        if isinstance(event, StreamOpened):
            # A new stream: whatever a previous stream left half-sent is stale.
            state.open = None
            return None
        if isinstance(event, RollbackRequired):
            # History above the rollback seqno is gone; the caller picks where to resume.
            state.open = None
            state.completed_end = None
            return None
        raise TypeError(f"not a stream event: {type(event).__name__}")

    def discard(self, vbucket: int, *, resume_seqno: int | None = None) -> None:
        """Drop the vbucket's partial snapshot (rollback or reconnect).

        `resume_seqno` is the seqno its stream restarts from (the committed boundary); later
        items must lie above it. Without it the vbucket's ordering history is forgotten too.
        """
        if resume_seqno is not None and resume_seqno < 0:
            raise ValueError(f"vbucket {vbucket}: resume seqno {resume_seqno} is negative")
        state = self._state(vbucket)
        state.open = None
        state.completed_end = resume_seqno

    def high_completed_end(self, vbucket: int) -> int | None:
        """End seqno of the vbucket's last complete snapshot (or its resume seqno), if known."""
        state = self._vbuckets.get(vbucket)
        return None if state is None else state.completed_end

    def has_partial(self, vbucket: int) -> bool:
        """Whether the vbucket has an open snapshot that is not complete yet."""
        state = self._vbuckets.get(vbucket)
        return state is not None and state.open is not None

    def _state(self, vbucket: int) -> _VbucketAssembly:
        state = self._vbuckets.get(vbucket)
        if state is None:
            state = self._vbuckets[vbucket] = _VbucketAssembly(vbucket)
        return state

    def _accept_item(self, state: _VbucketAssembly, item: ItemEvent) -> CompleteSnapshot | None:
        snapshot = state.open
        seqno = item.by_seqno
        if snapshot is None:
            raise _item_error(
                item, f"arrived outside any snapshot (last complete end {state.completed_end})"
            )
        if state.completed_end is not None and seqno <= state.completed_end:
            raise _item_error(
                item,
                f"is not above the vbucket's completed end {state.completed_end} (a stream "
                "reopened from an earlier seqno needs discard(vbucket, resume_seqno=...) first)",
            )
        if snapshot.is_oso:
            snapshot.end_seqno = max(snapshot.end_seqno, seqno)
            if snapshot.min_seqno is None or seqno < snapshot.min_seqno:
                snapshot.min_seqno = seqno
        else:
            if not snapshot.start_seqno <= seqno <= snapshot.end_seqno:
                bounds = f"[{snapshot.start_seqno}, {snapshot.end_seqno}]"
                raise _item_error(item, f"is outside the open snapshot {bounds}")
            if snapshot.last_seqno is not None and seqno <= snapshot.last_seqno:
                raise _item_error(item, f"is not after the previous item's {snapshot.last_seqno}")
        snapshot.last_seqno = seqno
        snapshot.item_count += 1
        if self._keep_items:
            snapshot.items.append(item)
        if isinstance(item, SystemEvent):
            state.manifest_uid = item.manifest_uid
            if item.event is SystemEventType.COLLECTION_DROPPED and item.collection_id is not None:
                snapshot.dropped_collection_ids.append(item.collection_id)
        if not snapshot.is_oso and seqno == snapshot.end_seqno:
            return self._complete(state, Completion.END_ITEM)
        return None

    def _accept_run(self, state: _VbucketAssembly, run: DocumentChanges) -> CompleteSnapshot | None:
        snapshot = state.open
        summary = run.summary
        if snapshot is None or self._keep_items:
            return self._accept_each(run)
        if state.completed_end is not None and summary.low_seqno <= state.completed_end:
            return self._accept_each(run)
        if snapshot.is_oso:
            snapshot.end_seqno = max(snapshot.end_seqno, summary.high_seqno)
            if snapshot.min_seqno is None or summary.low_seqno < snapshot.min_seqno:
                snapshot.min_seqno = summary.low_seqno
        elif (
            not summary.ascending
            or summary.first_seqno < snapshot.start_seqno
            or summary.last_seqno > snapshot.end_seqno
            or (snapshot.last_seqno is not None and summary.first_seqno <= snapshot.last_seqno)
        ):
            return self._accept_each(run)
        snapshot.last_seqno = summary.last_seqno
        snapshot.item_count += len(run)
        if not snapshot.is_oso and summary.last_seqno == snapshot.end_seqno:
            return self._complete(state, Completion.END_ITEM)
        return None

    def _accept_each(self, run: DocumentChanges) -> CompleteSnapshot | None:
        """The run's items one by one (keeps items, or finds the bad one for the error)."""
        completed = None
        for item in run.events():
            done = self.feed(item)
            completed = done if done is not None else completed
        return completed

    def _open_marker(
        self, state: _VbucketAssembly, marker: SnapshotMarker
    ) -> CompleteSnapshot | None:
        if marker.start_seqno > marker.end_seqno:
            raise _marker_error(marker, "starts after its end")
        if state.open is not None and state.open.is_oso:
            raise _marker_error(marker, "arrived inside an OSO snapshot that has not ended")
        floor = state.completed_end
        if state.open is not None:
            floor = state.open.end_seqno
        if floor is not None and marker.end_seqno < floor:
            raise _marker_error(
                marker,
                f"ends before the vbucket's previous snapshot end {floor} (a stream reopened "
                "from an earlier seqno needs discard(vbucket, resume_seqno=...) first)",
            )
        completed = None
        if state.open is not None:
            if _continues_as_history(state.open, marker):
                # A backfill that reaches into the history window: kv_engine sends its
                # deduplicated part, then a HISTORY marker of the same range for the rest.
                state.open.flags |= marker.flags
                last = state.open.last_seqno
                state.open.history_from = marker.start_seqno if last is None else last + 1
                return None
            completed = self._complete(state, Completion.NEXT_MARKER)
        state.open = _OpenSnapshot(
            start_seqno=marker.start_seqno,
            end_seqno=marker.end_seqno,
            flags=marker.flags,
            is_oso=False,
            purge_seqno=marker.purge_seqno,
            history_from=marker.start_seqno if marker.flags & SnapshotFlags.HISTORY else None,
        )
        return completed

    def _oso(self, state: _VbucketAssembly, event: OsoSnapshot) -> CompleteSnapshot | None:
        opcode = _OPCODES[OsoSnapshot]
        if event.flags & OsoFlags.START:
            if state.open is not None:
                kind = "an OSO snapshot" if state.open.is_oso else "a snapshot"
                raise ProtocolError(
                    f"vbucket {event.vbucket}: OSO snapshot start while {kind} is open",
                    opcode=opcode,
                )
            start = state.completed_end if state.completed_end is not None else 0
            state.open = _OpenSnapshot(
                start_seqno=start, end_seqno=start, flags=SnapshotFlags.DISK, is_oso=True
            )
            return None
        if event.flags & OsoFlags.END:
            if state.open is None or not state.open.is_oso:
                raise ProtocolError(
                    f"vbucket {event.vbucket}: OSO snapshot end without an OSO start",
                    opcode=opcode,
                )
            if state.open.item_count == 0:
                # Nothing arrived: no position moved, nothing to persist.
                state.open = None
                return None
            if state.completed_end is None and state.open.min_seqno is not None:
                state.open.start_seqno = state.open.min_seqno
            return self._complete(state, Completion.OSO_END)
        raise ProtocolError(
            f"vbucket {event.vbucket}: OSO snapshot flags {int(event.flags):#x} are neither "
            "start nor end",
            opcode=opcode,
        )

    def _stream_end(self, state: _VbucketAssembly, event: StreamEnd) -> CompleteSnapshot | None:
        if event.reason is not StreamEndReason.OK or state.open is None:
            # Any other end means: reopen from the committed boundary; the partial is void.
            state.open = None
            return None
        if state.open.is_oso:
            raise ProtocolError(
                f"vbucket {event.vbucket}: stream ended OK inside an OSO snapshot",
                opcode=_OPCODES[StreamEnd],
            )
        return self._complete(state, Completion.STREAM_END)

    def _complete(self, state: _VbucketAssembly, completion: Completion) -> CompleteSnapshot:
        snapshot = state.open
        assert snapshot is not None
        state.open = None
        state.completed_end = snapshot.end_seqno
        return CompleteSnapshot(
            vbucket=state.vbucket,
            start_seqno=snapshot.start_seqno,
            end_seqno=snapshot.end_seqno,
            flags=snapshot.flags,
            items=tuple(snapshot.items),
            item_count=snapshot.item_count,
            completed_by=completion,
            purge_seqno=snapshot.purge_seqno,
            manifest_uid=state.manifest_uid,
            dropped_collection_ids=tuple(snapshot.dropped_collection_ids),
            is_oso=snapshot.is_oso,
            history_from=snapshot.history_from,
        )


def _continues_as_history(open_snapshot: _OpenSnapshot, marker: SnapshotMarker) -> bool:
    """The marker starts the history part of the open (not yet ended) snapshot."""
    return (
        bool(marker.flags & SnapshotFlags.HISTORY)
        and not open_snapshot.flags & SnapshotFlags.HISTORY
        and (marker.start_seqno, marker.end_seqno)
        == (open_snapshot.start_seqno, open_snapshot.end_seqno)
        and (open_snapshot.last_seqno is None or open_snapshot.last_seqno < marker.end_seqno)
    )


def _item_error(item: ItemEvent, problem: str) -> ProtocolError:
    return ProtocolError(
        f"vbucket {item.vbucket}: {type(item).__name__} seqno {item.by_seqno} {problem}",
        opcode=_OPCODES[type(item)],
    )


def _marker_error(marker: SnapshotMarker, problem: str) -> ProtocolError:
    return ProtocolError(
        f"vbucket {marker.vbucket}: snapshot marker [{marker.start_seqno}, {marker.end_seqno}] "
        f"{problem}",
        opcode=_OPCODES[SnapshotMarker],
    )
