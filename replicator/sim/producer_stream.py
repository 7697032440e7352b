"""One open DCP stream on a simulated producer: pulls snapshots from a cursor, encodes frames.

Everything that depends on what the connection negotiated is decided here, once per item:
marker version (v1, v2.0, v2.2), expirations as EXPIRATION or DELETION, v1 or v2 deletions,
LEB128 key prefixes and system events only on collection-aware connections, xattrs, JSON and
snappy datatype bits, SEQNO_ADVANCED where the end of a snapshot was not sent, and the stream's
collection filter. No sockets here: the server moves the encoded frames.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, replace

from replicator.dcp.protocol.codec import encode_dcp_message
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures
from replicator.dcp.protocol.document_messages import INITIAL_NRU
from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    SeqnoAdvanced,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
    SystemEvent,
    SystemEventType,
)
from replicator.dcp.protocol.frame import with_stream_id
from replicator.dcp.protocol.opcodes import Datatype, Magic, Opcode
from replicator.dcp.protocol.values import compress_value, encode_leb128, encode_xattrs
from replicator.sim.dcp_controls import MarkerVersion
from replicator.sim.history_items import expiration_as_deletion
from replicator.sim.vbucket import ServedSnapshot, StreamCursor

DEFAULT_SNAPPY_MIN_SIZE = 128
"""Values shorter than this go uncompressed even when SNAPPY was negotiated."""

_MUTATION_HEAD = struct.Struct(">BBHBBHIIQQQIIIHB")
"""Header (24 bytes) and mutation extras (31 bytes) packed in one go: the serving hot path."""
_MUTATION_EXTRAS_SIZE = 31
_REQUEST = int(Magic.REQUEST)
_MUTATION = int(Opcode.DCP_MUTATION)
_JSON = int(Datatype.JSON)
_SNAPPY = int(Datatype.SNAPPY)
_XATTR = int(Datatype.XATTR)
_COLLECTION_EVENTS = frozenset(
    {
        SystemEventType.COLLECTION_CREATED,
        SystemEventType.COLLECTION_DROPPED,
        SystemEventType.COLLECTION_FLUSHED,
        SystemEventType.COLLECTION_CHANGED,
    }
)


@dataclass(frozen=True, slots=True)
class StreamEncoding:
    """How a connection wants its stream messages encoded (from HELLO, DCP_OPEN and controls)."""

    collections: bool = False
    delete_times: bool = False
    expiry_opcode: bool = False
    include_xattrs: bool = False
    no_value: bool = False
    underlying_datatype: bool = False
    json: bool = False
    snappy: bool = False
    force_compression: bool = False
    marker_version: MarkerVersion = MarkerVersion.V1
    snappy_min_size: int = DEFAULT_SNAPPY_MIN_SIZE

    @property
    def features(self) -> ConnectionFeatures:
        """What the codec needs to know to encode for this connection."""
        return ConnectionFeatures(collections=self.collections, delete_times=self.delete_times)


@dataclass(frozen=True, slots=True)
class StreamFilter:
    """Which collections a stream carries.

    A connection without collections sees the default collection only and no system events.
    A collection-aware stream sees everything unless it asked for a set of collections or a
    scope (the stream-request JSON value).
    """

    collection_ids: frozenset[int] | None = None
    scope_id: int | None = None
    legacy: bool = False

    def __post_init__(self) -> None:
        if self.collection_ids is not None and self.scope_id is not None:
            raise ValueError("a stream filters by collections or by a scope, not both")

    @property
    def is_filtered(self) -> bool:
        return self.collection_ids is not None or self.scope_id is not None


class ProducerStream:
    """A vbucket stream of one connection: its cursor, encoding, filter and unsent frames.

    `pull()` turns the cursor's next snapshot part into frames in `pending`; the server sends
    them as flow control allows. Not thread-safe: one connection's loop owns it.
    """

    def __init__(
        self,
        vbucket: int,
        opaque: int,
        cursor: StreamCursor,
        encoding: StreamEncoding,
        stream_filter: StreamFilter,
        *,
        scope_collections: frozenset[int] = frozenset(),
        stream_id: int | None = None,
    ) -> None:
        self.vbucket = vbucket
        self.opaque = opaque
        self.stream_id = stream_id
        """Set with enable_stream_id: every message of the stream is framed with it."""
        self.pending: deque[bytes] = deque()
        self._cursor = cursor
        self._encoding = encoding
        self._features = encoding.features
        self._filter = stream_filter
        self._collections: set[int] | None = (
            set(stream_filter.collection_ids) if stream_filter.collection_ids is not None else None
        )
        if stream_filter.scope_id is not None:
            self._collections = set(scope_collections)
        self._finished = False
        self._end_queued = False
        self._marker: SnapshotMarker | None = None  # held until something of it is sent
        self._marker_sent = False
        self._backfill_tail = False  # the frames in `pending` are of a disk snapshot
        self._last_sent_seqno = 0
        self._key_prefixes: dict[int, bytes] = {}
        # Per-item decisions hoisted out of the hot path.
        self._prefix_keys = encoding.collections
        self._json = encoding.json
        self._xattrs = encoding.include_xattrs
        self._plain_values = not (encoding.no_value or encoding.snappy)

    @property
    def finished(self) -> bool:
        """True once the stream's STREAM_END is queued (or the stream was dropped)."""
        return self._finished

    @property
    def backfilling(self) -> bool:
        """True while the cursor is in (or before) a disk snapshot, or the frames of its last
        part are still unsent."""
        if self._finished:
            return False
        return (self._backfill_tail and bool(self.pending)) or self._cursor.backfilling

    def pull(self, max_items: int) -> bool:
        """Encode the cursor's next part into `pending`; False when the cursor is caught up."""
        if self._finished:
            return False
        served = self._cursor.next_snapshot(max_items)
        if served is None:
            return False
        if isinstance(served, StreamEnd):
            self._queue_end(served.reason)
            return True
        self._backfill_tail = served.from_disk
        self._encode_part(served)
        return True

    def end(self, reason: StreamEndReason) -> None:
        """End the stream now: drop unsent data, queue STREAM_END with `reason`."""
        if self._finished:
            return
        self._cursor.close()
        self.pending.clear()
        self._queue_end(reason)

    def drop(self) -> None:
        """Forget the stream without a STREAM_END (client close without the control)."""
        self._cursor.close()
        self.pending.clear()
        self._finished = True

    # -- encoding ---------------------------------------------------------------------

    def _queue_end(self, reason: StreamEndReason) -> None:
        self._finished = True
        if not self._end_queued:
            self._end_queued = True
            self._queue_frames([self._encode(StreamEnd(self.vbucket, reason))])

    def _queue_frames(self, frames: list[bytes]) -> None:
        """Add frames to send, each framed with the stream id when the stream has one."""
        if self.stream_id is None:
            self.pending.extend(frames)
        else:
            self.pending.extend(with_stream_id(frame, self.stream_id) for frame in frames)

    def _encode_part(self, part: ServedSnapshot) -> None:
        if part.marker is not None:
            self._marker = part.marker
            self._marker_sent = False
        marker = self._marker
        if marker is None:
            raise RuntimeError(f"vbucket {self.vbucket}: snapshot items arrived without a marker")
        frames: list[bytes] = []
        append = frames.append
        mutation_frame = self._mutation_frame
        legacy = self._filter.legacy
        last_seqno = 0
        filter_empty = False
        # The hot loop of a backfill: mutations take the short way.
        for item in part.items:
            if type(item) is Mutation:
                collections = self._collections
                collection_id = item.collection_id
                if (
                    (collection_id != 0)
                    if legacy
                    else (collections is not None and collection_id not in collections)
                ):
                    continue
                append(mutation_frame(item))
            else:
                frame = self._item_frame(item)
                if frame is None:
                    continue
                append(frame)
                if isinstance(item, SystemEvent) and self._filter_emptied_by(item):
                    last_seqno = item.by_seqno
                    filter_empty = True
                    break
            last_seqno = item.by_seqno
        if frames:
            if not self._marker_sent:
                self._queue_frames([self._marker_frame(marker)])
                self._marker_sent = True
            self._queue_frames(frames)
            self._last_sent_seqno = last_seqno
        if filter_empty:
            self._cursor.close()
            self._queue_end(StreamEndReason.FILTER_EMPTY)
            return
        if part.is_last_part:
            if part.prologue:
                # The deduplicated part before a HISTORY snapshot: kv_engine sends its marker
                # only with an item, and the HISTORY marker (same range) follows at once.
                self._marker = None
                return
            self._finish_snapshot(marker)

    def _finish_snapshot(self, marker: SnapshotMarker) -> None:
        collection_aware = self._encoding.collections
        # When nothing of the snapshot passed the filter, kv_engine still sends a disk
        # snapshot's marker, and tells collection-aware streams where the seqno went.
        if not self._marker_sent and (marker.is_disk or collection_aware):
            self._queue_frames([self._marker_frame(marker)])
            self._marker_sent = True
        if collection_aware and self._marker_sent and self._last_sent_seqno < marker.end_seqno:
            self._queue_frames([self._encode(SeqnoAdvanced(self.vbucket, marker.end_seqno))])
            self._last_sent_seqno = marker.end_seqno
        self._marker = None

    def _marker_frame(self, marker: SnapshotMarker) -> bytes:
        version = self._encoding.marker_version
        if version is MarkerVersion.V1:
            wire = SnapshotMarker(self.vbucket, marker.start_seqno, marker.end_seqno, marker.flags)
        else:
            max_visible = marker.max_visible_seqno
            wire = SnapshotMarker(
                self.vbucket,
                marker.start_seqno,
                marker.end_seqno,
                marker.flags,
                max_visible_seqno=marker.end_seqno if max_visible is None else max_visible,
                high_completed_seqno=marker.high_completed_seqno or 0,
            )
            if version is MarkerVersion.V2_2:
                wire = replace(
                    wire,
                    purge_seqno=marker.purge_seqno or 0,
                    high_prepared_seqno=marker.high_prepared_seqno or 0,
                )
        return self._encode(wire)

    def _item_frame(self, item: Mutation | Deletion | Expiration | SystemEvent) -> bytes | None:
        if isinstance(item, SystemEvent):
            return self._system_event_frame(item)
        if not self._admits(item.collection_id):
            return None
        if isinstance(item, Mutation):
            return self._mutation_frame(item)
        if isinstance(item, Expiration):
            if self._encoding.expiry_opcode:
                return self._encode(item)
            item = expiration_as_deletion(item)
        return self._deletion_frame(item)

    def _admits(self, collection_id: int) -> bool:
        if self._filter.legacy:
            return collection_id == 0
        return self._collections is None or collection_id in self._collections

    def _system_event_frame(self, event: SystemEvent) -> bytes | None:
        if self._filter.legacy:
            return None
        scope_id = self._filter.scope_id
        if scope_id is not None:
            if event.scope_id != scope_id:
                return None
            created = event.collection_id
            if event.event is SystemEventType.COLLECTION_CREATED and created is not None:
                self._collections = (self._collections or set()) | {created}
        elif self._collections is not None and (
            event.collection_id is None or event.collection_id not in self._collections
        ):
            return None
        return self._encode(event)

    def _filter_emptied_by(self, event: SystemEvent) -> bool:
        """Update the filter after a sent event; True when nothing it selects is left."""
        if self._filter.scope_id is not None:
            return event.event is SystemEventType.SCOPE_DROPPED
        if self._collections is None or event.event is not SystemEventType.COLLECTION_DROPPED:
            return False
        self._collections.discard(event.collection_id or 0)
        return not self._collections

    def _deletion_frame(self, deletion: Deletion) -> bytes:
        encoding = self._encoding
        if not encoding.delete_times and deletion.delete_time:
            deletion = replace(deletion, delete_time=0)  # a v1 deletion has no delete time
        return encode_dcp_message(
            deletion,
            opaque=self.opaque,
            features=self._features,
            compress=encoding.force_compression,
            include_xattrs=encoding.include_xattrs,
        )

    def _mutation_frame(self, mutation: Mutation) -> bytes:
        key = mutation.key
        if self._prefix_keys:
            prefix = self._key_prefixes.get(mutation.collection_id)
            if prefix is None:
                prefix = encode_leb128(mutation.collection_id)
                self._key_prefixes[mutation.collection_id] = prefix
            key = prefix + key
        if self._plain_values:
            value = mutation.value
            datatype = _JSON if mutation.is_json and self._json else 0
            if mutation.xattrs and self._xattrs:
                value = encode_xattrs(mutation.xattrs) + value
                datatype |= _XATTR
        else:
            value, datatype = self._mutation_value(mutation)
        key_len = len(key)
        head = _MUTATION_HEAD.pack(
            _REQUEST,
            _MUTATION,
            key_len,
            _MUTATION_EXTRAS_SIZE,
            datatype,
            mutation.vbucket,
            _MUTATION_EXTRAS_SIZE + key_len + len(value),
            self.opaque,
            mutation.cas,
            mutation.by_seqno,
            mutation.rev_seqno,
            mutation.flags,
            mutation.expiration,
            mutation.lock_time,
            0,
            INITIAL_NRU,  # the simulator keeps no access statistics
        )
        return b"".join((head, key, value))

    def _mutation_value(self, mutation: Mutation) -> tuple[bytes, int]:
        """Value and datatype when values are dropped or may be compressed."""
        encoding = self._encoding
        datatype = 0
        if encoding.no_value:
            value = b""
            if mutation.is_json and encoding.json and encoding.underlying_datatype:
                datatype = _JSON
        else:
            value = mutation.value
            if mutation.is_json and encoding.json:
                datatype = _JSON
        if mutation.xattrs and encoding.include_xattrs:
            value = encode_xattrs(mutation.xattrs) + value
            datatype |= _XATTR
        if (
            encoding.snappy
            and value
            and (encoding.force_compression or len(value) >= encoding.snappy_min_size)
        ):
            compressed = compress_value(value)
            if encoding.force_compression or len(compressed) < len(value):
                value = compressed
                datatype |= _SNAPPY
        return value, datatype

    def _encode(
        self, message: SnapshotMarker | StreamEnd | SeqnoAdvanced | SystemEvent | Expiration
    ) -> bytes:
        return encode_dcp_message(message, opaque=self.opaque, features=self._features)
