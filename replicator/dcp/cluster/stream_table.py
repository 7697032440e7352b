"""The client's streams by vbucket, and which of them may be due for a stream request.

Only bookkeeping: routing (routing.py) decides what happens to a stream, this table keeps it
and its place in the set of PENDING vbuckets. The caller holds the client's lock.
"""

from __future__ import annotations

from replicator.dcp.cluster.streams import StreamState, VbucketStream


class StreamTable:
    """One `VbucketStream` per vbucket that streams or waits to."""

    __slots__ = ("_pending", "_streams")

    def __init__(self) -> None:
        self._streams: dict[int, VbucketStream] = {}
        self._pending: set[int] = set()
        """Vbuckets whose stream may be PENDING: `StreamRouter.service`, run by every poll,
        looks at these only (scanning all 1024 streams per poll cost about a tenth of the
        consumer thread)."""

    def get(self, vbucket: int) -> VbucketStream | None:
        return self._streams.get(vbucket)

    def streams(self) -> list[VbucketStream]:
        return list(self._streams.values())

    def add(self, stream: VbucketStream) -> None:
        """A new PENDING stream, replacing any PENDING one of its vbucket."""
        self._streams[stream.vbucket] = stream
        self._pending.add(stream.vbucket)

    def finish(self, stream: VbucketStream) -> None:
        """The stream is over: forget it (unless its vbucket already has another)."""
        stream.closed()
        if self._streams.get(stream.vbucket) is stream:
            del self._streams[stream.vbucket]

    def pending_vbuckets(self) -> list[int]:
        """A copy of the vbuckets that may be PENDING (callers drop those that are not)."""
        return list(self._pending)

    def not_pending(self, vbucket: int) -> None:
        self._pending.discard(vbucket)

    def retry(self, stream: VbucketStream, *, not_before: float = 0.0) -> None:
        """Request the stream again (from the same position), not before `not_before`."""
        stream.pending(not_before=not_before)
        self._pending.add(stream.vbucket)

    def resume_from_committed(self, stream: VbucketStream) -> None:
        """Reopen the stream at the layer above's committed position, once the StreamEnd
        handed up for it was taken by `poll` (see `release`)."""
        stream.pending(awaiting_delivery=True)
        self._pending.add(stream.vbucket)
        stream.position = None
        stream.failover_log = None

    def release(self, vbucket: int) -> None:
        """The StreamEnd of a stream to reopen was handed up: it may be requested now."""
        stream = self._streams.get(vbucket)
        if stream is not None and stream.state is StreamState.PENDING:
            stream.awaiting_delivery = False

    def due_times(self, now: float) -> list[float]:
        """When PENDING streams waiting out a retry delay become due."""
        return [
            s.not_before
            for s in map(self._streams.get, self._pending)
            if s is not None and s.state is StreamState.PENDING and s.not_before > now
        ]

    def state_of(self, vbucket: int) -> StreamState | None:
        stream = self._streams.get(vbucket)
        return None if stream is None else stream.state

    def connection_of(self, vbucket: int) -> int | None:
        """The id of the connection the vbucket's stream was last requested on."""
        stream = self._streams.get(vbucket)
        return None if stream is None else stream.connection_id
