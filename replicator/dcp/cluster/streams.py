"""Per-vbucket DCP streams: building stream requests, reading their outcomes, and stream state.

Pure: no sockets. The cluster client's stream table (stream_table.py) holds one `VbucketStream`
per vbucket, and the router drives it with what the connections receive.

Stream request from a committed position (spec/NOTES.md section 4): start = the committed seqno,
snapshot range = the position's (start..start for a whole-snapshot boundary), vb_uuid = the
failover-log entry for that seqno (newest entry whose seqno <= start; 0 when starting from 0),
end = MAX_SEQNO or a bound. The invariant snap_start <= start <= snap_end is checked before
anything is sent (java-dcp-client#41 lost updates by breaking it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from replicator.dcp.protocol.dcp_requests import StreamRequest
from replicator.dcp.protocol.events import StreamEndReason
from replicator.dcp.protocol.opcodes import Status, StreamRequestFlags
from replicator.dcp.protocol.responses import (
    Response,
    failover_log_of,
    not_my_vbucket_config_of,
    rollback_seqno_of,
)
from replicator.errors import ConfigError, ProtocolError
from replicator.model.backoff import Backoff
from replicator.model.positions import MAX_SEQNO, FailoverLog, VbucketPosition


def plan_stream_request(
    position: VbucketPosition,
    failover_log: FailoverLog | None,
    *,
    end_seqno: int = MAX_SEQNO,
    send_purge_seqno: bool = False,
    opaque: int = 0,
) -> StreamRequest:
    """The STREAM_REQ that resumes `position`; ConfigError when it would be invalid.

    >>> log = FailoverLog.of([(0xB, 50), (0xA, 0)])
    >>> r = plan_stream_request(VbucketPosition.at_boundary(3, 0xB, 40), log)
    >>> (r.start_seqno, r.snapshot_start, r.snapshot_end, hex(r.vbucket_uuid))
    (40, 40, 40, '0xa')
    """
    start = position.seqno
    if not position.snapshot_start <= start <= position.snapshot_end:
        raise ConfigError(
            f"vbucket {position.vbucket}: cannot resume from seqno {start}: it lies outside "
            f"its snapshot [{position.snapshot_start}, {position.snapshot_end}]"
        )
    if start > end_seqno:
        raise ConfigError(
            f"vbucket {position.vbucket}: start seqno {start} is beyond the end {end_seqno}"
        )
    if start == 0:
        uuid = 0  # "any history": the producer never asks a stream from 0 to roll back
    elif failover_log is None:
        raise ConfigError(
            f"vbucket {position.vbucket}: resuming from seqno {start} needs the failover log "
            "persisted with it (fetch it with DcpClient.failover_log)"
        )
    else:
        uuid = failover_log.entry_at(start).vbucket_uuid
    purge = position.purge_seqno if send_purge_seqno and position.purge_seqno > 0 else None
    return StreamRequest(
        vbucket=position.vbucket,
        start_seqno=start,
        end_seqno=end_seqno,
        vbucket_uuid=uuid,
        snapshot_start=position.snapshot_start,
        snapshot_end=position.snapshot_end,
        # Never IGNORE_PURGED_TOMBSTONES: a mirror cannot accept missed deletes.
        flags=StreamRequestFlags.ACTIVE_VB_ONLY,
        purge_seqno=purge,
        opaque=opaque,
    )


class OutcomeKind(enum.Enum):
    """What a STREAM_REQ reply means for the stream."""

    OPENED = "opened"
    ROLLBACK = "rollback"
    OUT_OF_RANGE = "out_of_range"
    RETRY_LATER = "retry_later"
    ALREADY_EXISTS = "already_exists"
    NOT_MY_VBUCKET = "not_my_vbucket"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    """A STREAM_REQ reply, read: the failover log, rollback seqno or new map where relevant."""

    kind: OutcomeKind
    status: int
    failover_log: FailoverLog | None = None
    rollback_seqno: int | None = None
    cluster_config: bytes | None = None


_RETRY_STATUSES = frozenset({Status.ETMPFAIL, Status.EBUSY, Status.ENOMEM})


def read_stream_response(response: Response) -> StreamOutcome:
    """Classify a STREAM_REQ reply; ProtocolError when its value does not fit its status."""
    status = response.status
    if status == Status.SUCCESS:
        return StreamOutcome(OutcomeKind.OPENED, status, failover_log=failover_log_of(response))
    if status == Status.ROLLBACK:
        return StreamOutcome(
            OutcomeKind.ROLLBACK, status, rollback_seqno=rollback_seqno_of(response)
        )
    if status == Status.ERANGE:
        return StreamOutcome(OutcomeKind.OUT_OF_RANGE, status)
    if status in _RETRY_STATUSES:
        return StreamOutcome(OutcomeKind.RETRY_LATER, status)
    if status == Status.KEY_EEXISTS:
        return StreamOutcome(OutcomeKind.ALREADY_EXISTS, status)
    if status == Status.NOT_MY_VBUCKET:
        return StreamOutcome(
            OutcomeKind.NOT_MY_VBUCKET, status, cluster_config=not_my_vbucket_config_of(response)
        )
    return StreamOutcome(OutcomeKind.FAILED, status)


class EndAction(enum.Enum):
    """What to do after a STREAM_END, once the layer above has seen it."""

    FINAL = "final"
    REOPEN = "reopen"
    REFRESH_MAP_AND_REOPEN = "refresh_map_and_reopen"


_END_ACTIONS = {
    StreamEndReason.OK: EndAction.FINAL,
    StreamEndReason.CLOSED: EndAction.FINAL,
    StreamEndReason.STATE_CHANGED: EndAction.REFRESH_MAP_AND_REOPEN,
    StreamEndReason.DISCONNECTED: EndAction.REOPEN,
    StreamEndReason.TOO_SLOW: EndAction.REOPEN,
    StreamEndReason.BACKFILL_FAILED: EndAction.REOPEN,
    StreamEndReason.ROLLBACK: EndAction.REOPEN,
    # We never filter by collection; a lost privilege will not come back by reopening.
    StreamEndReason.FILTER_EMPTY: EndAction.FINAL,
    StreamEndReason.LOST_PRIVILEGES: EndAction.FINAL,
}


def stream_end_action(reason: StreamEndReason) -> EndAction:
    """OK/CLOSED end a stream for good; STATE_CHANGED moves it; others reopen it."""
    return _END_ACTIONS[reason]


class StreamState(enum.Enum):
    """Life of one vbucket's stream on the client side."""

    PENDING = "pending"
    """Wanted open; the request is not sent yet (no connection, retry due later, or waiting
    for the layer above to see the previous stream's end)."""
    REQUESTED = "requested"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class VbucketStream:
    """Client-side state of one vbucket's stream. Not thread-safe: the client's lock guards it.

    A stream is identified on the wire by the opaque of its STREAM_REQ, which the producer
    repeats in every message of the stream; messages with another opaque belong to an older
    stream of the vbucket and are dropped.
    """

    def __init__(
        self,
        vbucket: int,
        *,
        end_seqno: int,
        position: VbucketPosition | None,
        failover_log: FailoverLog | None,
    ) -> None:
        self.vbucket = vbucket
        self.end_seqno = end_seqno
        self.state = StreamState.PENDING
        self.opaque: int | None = None
        self.connection_id: int | None = None
        self.request: StreamRequest | None = None
        # Where to start: given by open_stream; None means "ask committed_position".
        self.position = position
        self.failover_log = failover_log
        self.retries = 0
        self.first_failure_at: float | None = None
        self.not_before = 0.0
        self.awaiting_delivery = False
        """A StreamEnd of this vbucket is queued but not yet handed up: do not reopen yet."""
        self.close_wanted = False
        self.refresh_map_first = False

    def __repr__(self) -> str:
        return (
            f"VbucketStream(vb={self.vbucket}, state={self.state.value}, opaque={self.opaque}, "
            f"connection={self.connection_id})"
        )

    def ready_to_send(self, now: float) -> bool:
        """PENDING, not waiting for a delivery or a retry time."""
        return (
            self.state is StreamState.PENDING
            and not self.awaiting_delivery
            and now >= self.not_before
        )

    def requested(self, request: StreamRequest, opaque: int, connection_id: int) -> None:
        """The STREAM_REQ went out on `connection_id` with `opaque`."""
        self._expect(StreamState.PENDING, "send a stream request")
        self.state = StreamState.REQUESTED
        self.request = request
        self.opaque = opaque
        self.connection_id = connection_id

    def opened(self) -> None:
        """The producer accepted the request; forget the one-shot start position."""
        self._expect(StreamState.REQUESTED, "open")
        self.state = StreamState.OPEN
        self.position = None
        self.failover_log = None
        self.retries = 0
        self.first_failure_at = None

    def closing(self) -> None:
        """CLOSE_STREAM sent; a STREAM_END (CLOSED) will follow."""
        self.state = StreamState.CLOSING

    def closed(self) -> None:
        """Final: no more messages of this stream are accepted."""
        self.state = StreamState.CLOSED
        self.opaque = None
        self.connection_id = None

    def pending(self, *, not_before: float = 0.0, awaiting_delivery: bool = False) -> None:
        """Back to PENDING: to be (re)sent later; drops the old opaque."""
        self.state = StreamState.PENDING
        self.opaque = None
        self.connection_id = None
        self.not_before = not_before
        self.awaiting_delivery = awaiting_delivery

    def failed_attempt(self, now: float, backoff: Backoff) -> float | None:
        """Count a retryable failure; the time of the next attempt, None past the deadline."""
        self.retries += 1
        if self.first_failure_at is None:
            self.first_failure_at = now
        if now - self.first_failure_at > backoff.deadline:
            return None
        return now + backoff.delay(self.retries)

    def accepts(self, opaque: int, connection_id: int) -> bool:
        """Whether a message with this opaque, on this connection, belongs to this stream."""
        return (
            self.state in (StreamState.OPEN, StreamState.CLOSING)
            and self.opaque == opaque
            and self.connection_id == connection_id
        )

    def _expect(self, state: StreamState, action: str) -> None:
        if self.state is not state:
            raise ProtocolError(
                f"vbucket {self.vbucket}: cannot {action} a stream that is {self.state.value}"
            )
