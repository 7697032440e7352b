"""What one connection negotiated, and the reply helpers every command handler shares.

`ConnectionState` is the base of the handler groups (handshake, bucket_queries, dcp_streams);
`DcpState` is what DCP_OPEN and DCP_CONTROL set; `ConnectionHooks` is what the session that
owns the connection provides.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from replicator.dcp.protocol.frame import Frame
from replicator.dcp.protocol.opcodes import Datatype, DcpOpenFlags, HelloFeature, Status
from replicator.dcp.protocol.responses import Response, encode_response
from replicator.sim.dcp_controls import ProducerSettings
from replicator.sim.node_context import ClusterContext
from replicator.sim.producer_stream import ProducerStream
from replicator.sim.sasl_server import SaslExchange

_JSON = int(Datatype.JSON)


StreamKey = tuple[int, int]
"""(vbucket, stream id): the stream id is 0 on a connection without enable_stream_id."""


@dataclass(slots=True)
class DcpState:
    """What DCP_OPEN and DCP_CONTROL set on a connection, and its open streams.

    `streams` are keyed by (vbucket, stream id): with enable_stream_id a vbucket may have
    several. `ready` lists, round-robin, the streams that may have something to send.
    With backfill_order=sequential, `backfills` queues the backfilling streams in the order
    their backfills started, and only the first of them is served (in-memory streams go on).
    """

    name: str
    flags: DcpOpenFlags
    settings: ProducerSettings = field(default_factory=ProducerSettings)
    streams: dict[StreamKey, ProducerStream] = field(default_factory=dict)
    ready: deque[StreamKey] = field(default_factory=deque)
    ready_set: set[StreamKey] = field(default_factory=set)
    unacked_bytes: int = 0
    any_stream_opened: bool = False
    backfills: deque[StreamKey] = field(default_factory=deque)
    _by_vbucket: dict[int, set[StreamKey]] = field(default_factory=dict)
    _queued_backfills: set[StreamKey] = field(default_factory=set)

    def mark_ready(self, key: StreamKey) -> None:
        """Queue the stream for the next turn of serving (once)."""
        if key not in self.ready_set:
            self.ready_set.add(key)
            self.ready.append(key)

    def pop_ready(self) -> None:
        """Take the first stream off `ready`."""
        self.ready_set.discard(self.ready.popleft())

    def backfill_turn(self, key: StreamKey, stream: ProducerStream) -> bool:
        """May `stream` pull its next part now? Yes unless backfills are sequential, it is
        backfilling, and an older backfill is not finished; then it is queued behind it."""
        if not self.settings.sequential_backfill or not stream.backfilling:
            return True
        if key not in self._queued_backfills:
            self._queued_backfills.add(key)
            self.backfills.append(key)
        return self.current_backfill() == key

    def served(self, key: StreamKey) -> None:
        """The stream had its turn: if it was the current backfill and finished it, the next
        backfill's turn comes."""
        if self.backfills and self.backfills[0] == key:
            self.current_backfill()

    def current_backfill(self) -> StreamKey | None:
        """The oldest stream still backfilling. Finished or closed backfills leave the queue,
        and the stream whose turn comes is queued to serve (it may have been passed over)."""
        queue = self.backfills
        while queue:
            head = queue[0]
            stream = self.streams.get(head)
            if stream is not None and stream.backfilling:
                return head
            queue.popleft()
            self._queued_backfills.discard(head)
            if queue:
                self.mark_ready(queue[0])
        return None

    def add_stream(self, key: StreamKey, stream: ProducerStream) -> None:
        self.streams[key] = stream
        self._by_vbucket.setdefault(key[0], set()).add(key)

    def remove_stream(self, key: StreamKey) -> None:
        del self.streams[key]
        keys = self._by_vbucket.get(key[0])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_vbucket[key[0]]
        if self.backfills and self.backfills[0] == key:
            self.current_backfill()

    def clear_streams(self) -> None:
        self.streams.clear()
        self._by_vbucket.clear()
        self.backfills.clear()
        self._queued_backfills.clear()

    def keys_of(self, vbucket: int) -> tuple[StreamKey, ...]:
        """The vbucket's open streams (one, or several with stream ids)."""
        return tuple(self._by_vbucket.get(vbucket, ()))

    def vbuckets(self) -> frozenset[int]:
        """The vbuckets with at least one open stream."""
        return frozenset(self._by_vbucket)


class ConnectionHooks(Protocol):
    """What the processor needs from the connection that owns it."""

    def queue(self, data: bytes) -> None:
        """Send `data` after everything queued before it."""
        ...

    def claim_dcp_name(self, name: str) -> None:
        """Take the DCP connection name; an older connection with it is closed."""
        ...

    def streams_changed(self) -> None:
        """The set of open streams changed."""
        ...


class ConnectionState:
    """One connection's negotiated state and the helpers its command handlers reply with.

    Not thread-safe: the connection's loop owns it.
    """

    def __init__(self, cluster: ClusterContext, node: int, hooks: ConnectionHooks) -> None:
        self._cluster = cluster
        self._options = cluster.options
        self._node = node
        self._hooks = hooks
        self._sasl = SaslExchange(cluster.credentials, offered=self._options.sasl_mechanisms)
        self._agent = ""
        self.features: frozenset[int] = frozenset()
        self._known_config: tuple[int, int] | None = None
        """The (epoch, revision) of the newest cluster map this connection was sent."""
        self.user: str | None = None
        self.bucket_selected = False
        self.dcp: DcpState | None = None
        self.refused_opcodes: frozenset[int] = frozenset()
        """Commands answered UNKNOWN_COMMAND, as by a server without them (a fault mode)."""

    def _respond(
        self,
        frame: Frame,
        status: int = Status.SUCCESS,
        value: bytes = b"",
        *,
        datatype: int = 0,
        extras: bytes = b"",
        context: str | None = None,
    ) -> None:
        xerror = HelloFeature.XERROR in self.features
        if context is not None and status != Status.SUCCESS and xerror:
            value = json.dumps({"error": {"context": context}}).encode()
            datatype = _JSON if HelloFeature.JSON in self.features else 0
        self._hooks.queue(
            encode_response(
                Response(
                    frame.opcode,
                    status,
                    frame.opaque,
                    value=value,
                    extras=extras,
                    datatype=datatype,
                )
            )
        )

    def _json_datatype(self) -> int:
        return _JSON if HelloFeature.JSON in self.features else 0

    @property
    def snappy(self) -> bool:
        """Values may go snappy-compressed: SNAPPY, or SNAPPY_EVERYWHERE (which implies it)."""
        features = self.features
        return HelloFeature.SNAPPY in features or HelloFeature.SNAPPY_EVERYWHERE in features

    @property
    def clustermap_notifications(self) -> str | None:
        """"full" or "brief" when the connection asked for cluster-map pushes, else None."""
        if HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF in self.features:
            return "brief"
        if HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION in self.features:
            return "full"
        return None

    def config_sent(self, epoch: int, revision: int) -> None:
        """The connection was sent the cluster map of this version (dedupes NOT_MY_VBUCKET)."""
        known = self._known_config
        if known is None or (epoch, revision) > known:
            self._known_config = (epoch, revision)

    def _need_bucket(self, frame: Frame) -> bool:
        if not self.bucket_selected:
            self._respond(frame, Status.NO_BUCKET, context="No bucket selected")
            return False
        return True

    def _owns(self, vbucket: int) -> bool:
        return 0 <= vbucket < self._cluster.bucket.num_vbuckets and self._cluster.owns(
            self._node, vbucket
        )

    def _not_my_vbucket(self, frame: Frame) -> None:
        # kv_engine puts the current cluster map in the body so the client can re-route, but
        # leaves it out for a client that dedupes them and was already sent this version.
        version = self._cluster.config_revision()
        known = self._known_config
        if (
            HelloFeature.DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP in self.features
            and known is not None
            and known >= version
        ):
            self._respond(frame, Status.NOT_MY_VBUCKET)
            return
        self.config_sent(*version)
        self._respond(
            frame,
            Status.NOT_MY_VBUCKET,
            self._cluster.config_json(self._node),
            datatype=self._json_datatype(),
        )

    def _need_dcp(self, frame: Frame) -> DcpState | None:
        dcp = self.dcp
        if dcp is None:
            self._respond(frame, Status.EINVAL, context="Not a DCP connection (send DCP_OPEN)")
        return dcp
