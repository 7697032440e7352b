"""A simulated node's answers to client requests: one connection's protocol state machine.

`CommandProcessor` holds what a connection negotiated (HELLO features, the authenticated user,
the selected bucket, DCP_OPEN flags and controls, open streams) and answers each request as
kv_engine does: bootstrap commands (HELLO, SASL, SELECT_BUCKET, GET_CLUSTER_CONFIG,
GET_ERROR_MAP, VERSION ...), then DCP_OPEN, DCP_CONTROL, STREAM_REQ with its rollback decision,
CLOSE_STREAM, BUFFER_ACK. It writes replies through `ConnectionHooks`; moving bytes, flow
control and noops are the session's (replicator.sim.server).
"""

from __future__ import annotations

import json
import logging
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from replicator.dcp.protocol.codec import (
    BufferAck,
    CloseStream,
    DcpControl,
    DcpOpen,
    GetAllVbSeqnos,
    GetFailoverLog,
    Hello,
    Response,
    SaslAuth,
    SaslStep,
    SelectBucket,
    StreamRequest,
    VbucketSeqno,
    decode_request,
    encode_failover_log,
    encode_hello_features,
    encode_response,
    encode_rollback_seqno,
    encode_sasl_mechanisms,
    encode_vbucket_seqnos,
)
from replicator.dcp.protocol.events import StreamEndReason, SystemEvent
from replicator.dcp.protocol.frame import Frame
from replicator.dcp.protocol.opcodes import (
    Datatype,
    DcpOpenFlags,
    HelloFeature,
    Opcode,
    Status,
    StreamRequestFlags,
    VbucketState,
)
from replicator.errors import ProtocolError
from replicator.sim.bucket import SimBucket
from replicator.sim.dcp_controls import ConnectionTraits, ProducerSettings, apply_control
from replicator.sim.error_map import error_map_json
from replicator.sim.failover_table import StreamAccepted, StreamRollback
from replicator.sim.failover_table import StreamRequest as RollbackQuery
from replicator.sim.node_context import ClusterContext
from replicator.sim.producer_stream import ProducerStream, StreamEncoding, StreamFilter
from replicator.sim.sasl_server import SaslExchange, SaslReply

log = logging.getLogger(__name__)

VERSION_OPCODE = 0x0B
OBSERVE_SEQNO_OPCODE = 0x91
NO_BUCKET_NAME = "@no bucket@"

KNOWN_FEATURES = frozenset(range(0x01, HelloFeature.SUBDOC_BINARY_XATTR + 1))
"""Every feature code a 7.6 server knows: its dependency rules look at these (others, unknown
codes, are ignored)."""

SUPPORTED_FEATURES = frozenset(
    {
        HelloFeature.TCP_NODELAY,
        HelloFeature.MUTATION_SEQNO,
        HelloFeature.XATTR,
        HelloFeature.XERROR,
        HelloFeature.SELECT_BUCKET,
        HelloFeature.SNAPPY,
        HelloFeature.JSON,
        HelloFeature.DUPLEX,
        HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION,
        HelloFeature.UNORDERED_EXECUTION,
        HelloFeature.ALT_REQUEST_SUPPORT,
        HelloFeature.SYNC_REPLICATION,
        HelloFeature.COLLECTIONS,
        HelloFeature.SNAPPY_EVERYWHERE,
        HelloFeature.PRESERVE_TTL,
        HelloFeature.VATTR,
        HelloFeature.SUBDOC_CREATE_AS_DELETED,
        HelloFeature.SUBDOC_DOCUMENT_MACRO_SUPPORT,
        HelloFeature.SUBDOC_REPLACE_BODY_WITH_XATTR,
        HelloFeature.NON_BLOCKING_THROTTLING_MODE,
        HelloFeature.SUBDOC_REPLICA_READ,
        HelloFeature.GET_CLUSTER_CONFIG_WITH_KNOWN_VERSION,
        HelloFeature.DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP,
        HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF,
        HelloFeature.SUBDOC_ALLOWS_ACCESS_ON_MULTIPLE_XATTR_KEYS,
        HelloFeature.SUBDOC_BINARY_XATTR,
    }
)
"""HELLO features a simulated node agrees to: what a 7.6 node with default settings agrees to,
but TCP_DELAY (the node always sets TCP_NODELAY), TRACING (no server-duration frames are sent:
as a node with tracing off), REPORT_UNIT_USAGE (serverless only) and the retired PITR. The
informational ones (sync replication, subdoc, PreserveTTL, ...) say what the bucket claims in
its capabilities; docs/simulator.md says what they mean for a node that serves no KV data."""

_NEEDS = (
    (HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION, HelloFeature.DUPLEX,
     "ClustermapChangeNotification needs Duplex"),
    (HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF, HelloFeature.DUPLEX,
     "ClustermapChangeNotificationBrief needs Duplex"),
    (HelloFeature.SUBDOC_DOCUMENT_MACRO_SUPPORT, HelloFeature.XATTR,
     "SubdocDocumentMacroSupport needs XATTR"),
    (HelloFeature.VATTR, HelloFeature.XATTR, "VAttr needs XATTR"),
)  # fmt: skip
"""kv_engine's HELLO dependencies: asking for the first without the second is EINVAL."""

_BEFORE_AUTH = frozenset(
    {
        int(Opcode.HELLO),
        int(Opcode.SASL_LIST_MECHS),
        int(Opcode.SASL_AUTH),
        int(Opcode.SASL_STEP),
        int(Opcode.NOOP),
        int(Opcode.GET_ERROR_MAP),
        VERSION_OPCODE,
    }
)
"""Commands an unauthenticated connection may send; others answer EACCESS."""

_PRODUCER_ONLY_OPCODES = frozenset(
    {
        int(Opcode.DCP_ADD_STREAM),
        int(Opcode.DCP_STREAM_END),
        int(Opcode.DCP_SNAPSHOT_MARKER),
        int(Opcode.DCP_MUTATION),
        int(Opcode.DCP_DELETION),
        int(Opcode.DCP_EXPIRATION),
        int(Opcode.DCP_FLUSH),
        int(Opcode.DCP_SET_VBUCKET_STATE),
        int(Opcode.DCP_NOOP),
        int(Opcode.DCP_SYSTEM_EVENT),
        int(Opcode.DCP_PREPARE),
        int(Opcode.DCP_SEQNO_ACKNOWLEDGED),
        int(Opcode.DCP_COMMIT),
        int(Opcode.DCP_ABORT),
        int(Opcode.DCP_SEQNO_ADVANCED),
        int(Opcode.DCP_OSO_SNAPSHOT),
    }
)
"""Messages only a producer (or a consumer endpoint) takes; a producer answers EINVAL."""

_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_EPOCH_REVISION = struct.Struct(">qq")
_OBSERVE_SEQNO_V0 = struct.Struct(">BHQQQ")
_OBSERVE_SEQNO_V1 = struct.Struct(">BHQQQQQ")
_JSON = int(Datatype.JSON)
_UNDERLYING_DATATYPE = DcpOpenFlags.NO_VALUE_WITH_UNDERLYING_DATATYPE


StreamKey = tuple[int, int]
"""(vbucket, stream id): the stream id is 0 on a connection without enable_stream_id."""


@dataclass(slots=True)
class DcpState:
    """What DCP_OPEN and DCP_CONTROL set on a connection, and its open streams.

    `streams` are keyed by (vbucket, stream id): with enable_stream_id a vbucket may have
    several. `ready` lists, round-robin, the streams that may have something to send.
    """

    name: str
    flags: DcpOpenFlags
    settings: ProducerSettings = field(default_factory=ProducerSettings)
    streams: dict[StreamKey, ProducerStream] = field(default_factory=dict)
    ready: deque[StreamKey] = field(default_factory=deque)
    ready_set: set[StreamKey] = field(default_factory=set)
    unacked_bytes: int = 0
    any_stream_opened: bool = False
    _by_vbucket: dict[int, set[StreamKey]] = field(default_factory=dict)

    def mark_ready(self, key: StreamKey) -> None:
        """Queue the stream for the next turn of serving (once)."""
        if key not in self.ready_set:
            self.ready_set.add(key)
            self.ready.append(key)

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

    def clear_streams(self) -> None:
        self.streams.clear()
        self._by_vbucket.clear()

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


class CommandProcessor:
    """One connection's negotiated state and its answer to every request.

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

    def handle(self, frame: Frame) -> None:
        """Answer one request (magic 0x80 or 0x08) in order, as kv_engine would."""
        opcode = frame.opcode
        handler = self._handlers.get(opcode)
        if opcode in self.refused_opcodes:
            handler = None  # a fault: this node behaves as a server without the command
        if handler is None and opcode not in _PRODUCER_ONLY_OPCODES:
            self._respond(frame, Status.UNKNOWN_COMMAND)
            return
        if self.user is None and opcode not in _BEFORE_AUTH:
            self._respond(frame, Status.EACCESS, context="Not authenticated")
            return
        if handler is None:
            self._respond(frame, Status.EINVAL, context="Not a command a producer takes")
            return
        try:
            handler(self, frame)
        except ProtocolError as exc:
            self._respond(frame, Status.EINVAL, context=str(exc))
        except Exception:
            # A bug here must not take the connection down silently: say so, as kv_engine does.
            log.exception("request 0x%02x failed", opcode)
            self._respond(frame, Status.EINTERNAL, context="Internal error")

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

    def _on_hello(self, frame: Frame) -> None:
        hello = decode_request(frame)
        assert isinstance(hello, Hello)
        asked = {feature for feature in hello.features if feature in KNOWN_FEATURES}
        problem = _hello_problem(asked)
        if problem is not None:
            # kv_engine refuses the whole HELLO and leaves what was negotiated before.
            self._respond(frame, Status.EINVAL, context=problem)
            return
        agreed = asked & SUPPORTED_FEATURES
        if HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF in agreed:
            agreed.discard(HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION)  # brief wins
        if self.dcp is not None:
            agreed.discard(HelloFeature.UNORDERED_EXECUTION)  # never on a DCP connection
        # kv_engine answers in feature-code order (it keeps them in an ordered set).
        ordered = sorted(agreed)
        self.features = frozenset(ordered)
        self._agent = hello.agent[:200]
        self._respond(frame, value=encode_hello_features(ordered))

    def _on_version(self, frame: Frame) -> None:
        self._respond(frame, value=self._options.server_version.encode())

    def _on_noop(self, frame: Frame) -> None:
        self._respond(frame)

    def _on_error_map(self, frame: Frame) -> None:
        if len(frame.value) != 2 or frame.extras or frame.key:
            self._respond(frame, Status.EINVAL, context="Expected a 2-byte version")
            return
        (version,) = _U16.unpack(frame.value)
        try:
            document = error_map_json(version)
        except ValueError as exc:
            self._respond(frame, Status.EINVAL, context=str(exc))
            return
        self._respond(frame, value=document, datatype=self._json_datatype())

    def _on_list_mechs(self, frame: Frame) -> None:
        self._respond(frame, value=encode_sasl_mechanisms(self._sasl.offered))

    def _on_sasl_auth(self, frame: Frame) -> None:
        request = decode_request(frame)
        assert isinstance(request, SaslAuth)
        self._sasl_reply(frame, self._sasl.start(request.mechanism, request.payload))

    def _on_sasl_step(self, frame: Frame) -> None:
        request = decode_request(frame)
        assert isinstance(request, SaslStep)
        self._sasl_reply(frame, self._sasl.step(request.mechanism, request.payload))

    def _sasl_reply(self, frame: Frame, reply: SaslReply) -> None:
        if reply.username is not None:
            self.user = reply.username
        elif reply.status == Status.AUTH_ERROR:
            self.user = None
            self.bucket_selected = False
        context = "Authentication failed" if reply.status == Status.AUTH_ERROR else None
        self._respond(frame, reply.status, reply.payload, context=context)

    def _on_select_bucket(self, frame: Frame) -> None:
        request = decode_request(frame)
        assert isinstance(request, SelectBucket)
        if request.bucket == NO_BUCKET_NAME:
            self.bucket_selected = False
            self._known_config = None
            self._respond(frame)
        elif request.bucket == self._cluster.bucket.name:
            self.bucket_selected = True
            self._known_config = None
            self._respond(frame)
        else:
            # An unknown bucket and a bucket the user may not use look the same, on purpose.
            self._respond(frame, Status.EACCESS, context="No access to bucket")

    def _need_bucket(self, frame: Frame) -> bool:
        if not self.bucket_selected:
            self._respond(frame, Status.NO_BUCKET, context="No bucket selected")
            return False
        return True

    def _on_cluster_config(self, frame: Frame) -> None:
        if not self._need_bucket(frame):
            return
        if frame.key or frame.value or len(frame.extras) not in (0, _EPOCH_REVISION.size):
            self._respond(frame, Status.EINVAL, context="Expected no key or value")
            return
        epoch, revision = self._cluster.config_revision()
        self.config_sent(epoch, revision)
        if frame.extras:
            known = _EPOCH_REVISION.unpack(frame.extras)
            if known >= (epoch, revision):
                self.config_sent(*known)
                self._respond(frame)  # the client already has this map
                return
        self._respond(
            frame,
            value=self._cluster.config_json(self._node),
            datatype=self._json_datatype(),
        )

    def _on_collections_manifest(self, frame: Frame) -> None:
        if not self._need_bucket(frame):
            return
        self._respond(
            frame,
            value=self._cluster.bucket.manifest_json().encode(),
            datatype=self._json_datatype(),
        )

    def _on_all_vb_seqnos(self, frame: Frame) -> None:
        if not self._need_bucket(frame):
            return
        request = decode_request(frame)
        assert isinstance(request, GetAllVbSeqnos)
        state = request.vbucket_state
        if request.collection_id is not None and HelloFeature.COLLECTIONS not in self.features:
            self._respond(frame, Status.EINVAL, context="A collection filter needs collections")
            return
        # Every vbucket of this node is active; it has no replicas, pending or dead ones.
        wanted = state is None or state in (VbucketState.ALIVE, VbucketState.ACTIVE)
        vbuckets = self._cluster.node_vbuckets(self._node) if wanted else ()
        bucket = self._cluster.bucket
        records = []
        with bucket.condition:
            for vb in vbuckets:
                vbucket = bucket.vbucket(vb)
                if request.collection_id is None:
                    seqno = vbucket.high_seqno
                else:
                    seqno = _collection_high_seqno(bucket, vb, request.collection_id)
                records.append(VbucketSeqno(vb, seqno))
        self._respond(frame, value=encode_vbucket_seqnos(records))

    def _on_failover_log(self, frame: Frame) -> None:
        if not self._need_bucket(frame):
            return
        request = decode_request(frame)
        assert isinstance(request, GetFailoverLog)
        if not self._owns(request.vbucket):
            self._not_my_vbucket(frame)
            return
        log_value = encode_failover_log(self._cluster.bucket.failover_log(request.vbucket))
        self._respond(frame, value=log_value)

    def _on_observe_seqno(self, frame: Frame) -> None:
        if not self._need_bucket(frame):
            return
        vb = frame.vbucket
        if len(frame.value) != 8:
            self._respond(frame, Status.EINVAL, context="Expected an 8-byte vbucket uuid")
            return
        if not self._owns(vb):
            self._not_my_vbucket(frame)
            return
        (uuid,) = _U64.unpack(frame.value)
        bucket = self._cluster.bucket
        with bucket.condition:
            vbucket = bucket.vbucket(vb)
            high = vbucket.high_seqno
            entries = vbucket.failover_log().entries
        current = entries[0].vbucket_uuid
        older = [i for i, entry in enumerate(entries) if entry.vbucket_uuid == uuid and i > 0]
        if older:
            # The client's uuid is from before a failover: say where its branch ended.
            branch_end = entries[older[0] - 1].seqno
            value = _OBSERVE_SEQNO_V1.pack(1, vb, current, high, high, uuid, branch_end)
        else:
            value = _OBSERVE_SEQNO_V0.pack(0, vb, current, high, high)
        self._respond(frame, value=value)

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

    def _on_dcp_open(self, frame: Frame) -> None:
        if not self._need_bucket(frame):
            return
        request = decode_request(frame)
        assert isinstance(request, DcpOpen)
        if self.dcp is not None:
            self._respond(frame, Status.EINVAL, context="The connection is already a DCP one")
            return
        flags = request.flags
        if not flags & DcpOpenFlags.PRODUCER:
            self._respond(frame, Status.NOT_SUPPORTED, context="Only producers are simulated")
            return
        if flags & DcpOpenFlags.SKIP_DELETES_IN_INITIAL_BACKFILL:
            reason = "Skipping deletes in backfills is not simulated"
            self._respond(frame, Status.NOT_SUPPORTED, context=reason)
            return
        self.dcp = DcpState(request.name, flags)
        self._hooks.claim_dcp_name(request.name)
        self._respond(frame)

    def _need_dcp(self, frame: Frame) -> DcpState | None:
        dcp = self.dcp
        if dcp is None:
            self._respond(frame, Status.EINVAL, context="Not a DCP connection (send DCP_OPEN)")
        return dcp

    def _on_dcp_control(self, frame: Frame) -> None:
        dcp = self._need_dcp(frame)
        if dcp is None:
            return
        request = decode_request(frame)
        assert isinstance(request, DcpControl)
        traits = ConnectionTraits(
            collections=HelloFeature.COLLECTIONS in self.features,
            snappy=self.snappy,
            delete_times=bool(dcp.flags & DcpOpenFlags.INCLUDE_DELETE_TIMES),
            can_retain_history=self._cluster.bucket.can_retain_history,
        )
        outcome = apply_control(dcp.settings, traits, request.key, request.value)
        dcp.settings = outcome.settings
        self._respond(frame, outcome.status, context=outcome.reason or None)

    def _on_buffer_ack(self, frame: Frame) -> None:
        dcp = self.dcp
        if dcp is None:
            self._respond(frame, Status.EINVAL, context="Not a DCP connection")
            return
        request = decode_request(frame)
        assert isinstance(request, BufferAck)
        dcp.unacked_bytes = max(0, dcp.unacked_bytes - request.acked_bytes)

    def _on_close_stream(self, frame: Frame) -> None:
        dcp = self._need_dcp(frame)
        if dcp is None:
            return
        request = decode_request(frame)
        assert isinstance(request, CloseStream)
        problem = _stream_id_problem(dcp.settings, request.stream_id)
        if problem is not None:
            self._respond(frame, Status.DCP_STREAM_ID_INVALID, context=problem)
            return
        key = (request.vbucket, request.stream_id or 0)
        stream = dcp.streams.get(key)
        if stream is None or stream.finished:
            self._respond(frame, Status.KEY_ENOENT, context="No stream for this vbucket")
            return
        self._respond(frame)
        if dcp.settings.stream_end_on_close:
            stream.end(StreamEndReason.CLOSED)
            dcp.mark_ready(key)
        else:
            stream.drop()
            dcp.remove_stream(key)
            self._hooks.streams_changed()

    def _on_stream_request(self, frame: Frame) -> None:
        dcp = self._need_dcp(frame)
        if dcp is None:
            return
        settings_value = frame.value
        try:
            request = decode_request(
                Frame(
                    frame.magic,
                    frame.opcode,
                    0,
                    frame.vbucket_or_status,
                    frame.opaque,
                    frame.cas,
                    frame.framing_extras,
                    frame.extras,
                    frame.key,
                    b"",
                )
            )
            options = _stream_options(settings_value)
        except (ProtocolError, ValueError) as exc:
            self._respond(frame, Status.EINVAL, context=str(exc))
            return
        assert isinstance(request, StreamRequest)
        vb = request.vbucket
        refusal = _stream_id_problem(dcp.settings, options.stream_id)
        if refusal is not None:
            self._respond(frame, Status.DCP_STREAM_ID_INVALID, context=refusal)
            return
        if not self._owns(vb):
            self._not_my_vbucket(frame)
            return
        key = (vb, options.stream_id or 0)
        existing = dcp.streams.get(key)
        if existing is not None and not existing.finished:
            context = (
                f"Stream id {options.stream_id} is in use on this vbucket"
                if options.stream_id
                else "Stream exists for this vbucket"
            )
            self._respond(frame, Status.KEY_EEXISTS, context=context)
            return
        if existing is not None:
            # The old stream's last messages (its STREAM_END) go before the new stream's.
            for message in existing.pending:
                self._hooks.queue(message)
                dcp.unacked_bytes += len(message)
            existing.pending.clear()
            dcp.remove_stream(key)
        collections = HelloFeature.COLLECTIONS in self.features
        stream_filter, scope_collections, problem = self._stream_filter(options, collections)
        if problem is not None:
            status, reason = problem
            self._respond(frame, status, context=reason)
            return
        bucket = self._cluster.bucket
        flags = request.flags
        with bucket.condition:
            vbucket = bucket.vbucket(vb)
            high = vbucket.high_seqno
            start, end = request.start_seqno, request.end_seqno
            snap_start, snap_end = request.snapshot_start, request.snapshot_end
            if flags & StreamRequestFlags.FROM_LATEST:
                start = snap_start = snap_end = high
            if flags & (StreamRequestFlags.TO_LATEST | StreamRequestFlags.DISK_ONLY):
                end = high
            purge_seqno = vbucket.purge_seqno
            client_purge = options.purge_seqno
            # kv_engine (MB-27800) skips the purge rollback only when the client's purge seqno
            # equals the vbucket's: no purge ran since it last streamed. Any other value,
            # higher included (it saw a purge on a branch since failed over), rolls back.
            ignore_purged = bool(flags & StreamRequestFlags.IGNORE_PURGED_TOMBSTONES) or (
                client_purge is not None and client_purge == purge_seqno
            )
            decision = vbucket.stream_request(
                RollbackQuery(
                    start_seqno=start,
                    end_seqno=end,
                    vbucket_uuid=request.vbucket_uuid,
                    snap_start_seqno=snap_start,
                    snap_end_seqno=snap_end,
                    strict_vb_uuid=bool(flags & StreamRequestFlags.STRICT_VBUUID),
                    ignore_purged_tombstones=ignore_purged,
                )
            )
            if isinstance(decision, StreamAccepted):
                cursor = vbucket.open_cursor(
                    start,
                    end,
                    snap_start_seqno=snap_start,
                    change_streams=dcp.settings.change_streams,
                )
        if isinstance(decision, StreamRollback):
            self._respond(frame, Status.ROLLBACK, encode_rollback_seqno(decision.rollback_seqno))
            return
        if not isinstance(decision, StreamAccepted):
            self._respond(frame, Status.ERANGE, context=decision.reason)
            return
        self._respond(frame, value=encode_failover_log(decision.failover_log))
        settings = dcp.settings
        encoding = StreamEncoding(
            collections=collections,
            delete_times=bool(dcp.flags & DcpOpenFlags.INCLUDE_DELETE_TIMES),
            expiry_opcode=settings.expiry_opcode,
            include_xattrs=bool(dcp.flags & DcpOpenFlags.INCLUDE_XATTRS),
            no_value=bool(dcp.flags & (DcpOpenFlags.NO_VALUE | _UNDERLYING_DATATYPE)),
            underlying_datatype=bool(dcp.flags & _UNDERLYING_DATATYPE),
            json=HelloFeature.JSON in self.features,
            snappy=self.snappy,
            force_compression=settings.force_compression,
            marker_version=settings.marker_version,
            snappy_min_size=self._options.snappy_min_size,
        )
        dcp.add_stream(
            key,
            ProducerStream(
                vb,
                request.opaque,
                cursor,
                encoding,
                stream_filter,
                scope_collections=scope_collections,
                stream_id=options.stream_id,
            ),
        )
        dcp.any_stream_opened = True
        self._hooks.streams_changed()
        dcp.mark_ready(key)

    def _stream_filter(
        self, options: _StreamOptions, collections: bool
    ) -> tuple[StreamFilter, frozenset[int], tuple[Status, str] | None]:
        if not collections:
            if options.collection_ids is not None or options.scope_id is not None:
                return (
                    StreamFilter(legacy=True),
                    frozenset(),
                    (
                        Status.EINVAL,
                        "A collection filter needs the collections HELLO feature",
                    ),
                )
            return StreamFilter(legacy=True), frozenset(), None
        manifest = self._cluster.bucket.manifest
        with self._cluster.bucket.condition:
            live = {spec.collection_id: spec for spec in manifest.collections()}
            scopes = {scope.scope_id for scope in manifest.scopes()}
            uid = manifest.uid
        if options.collection_ids is not None:
            unknown = sorted(options.collection_ids - set(live))
            if unknown:
                return (
                    StreamFilter(),
                    frozenset(),
                    (
                        Status.UNKNOWN_COLLECTION,
                        f"Unknown collection 0x{unknown[0]:x} (manifest uid {uid:x})",
                    ),
                )
            return StreamFilter(collection_ids=options.collection_ids), frozenset(), None
        if options.scope_id is not None:
            if options.scope_id not in scopes:
                return (
                    StreamFilter(),
                    frozenset(),
                    (
                        Status.UNKNOWN_SCOPE,
                        f"Unknown scope 0x{options.scope_id:x} (manifest uid {uid:x})",
                    ),
                )
            members = frozenset(
                cid for cid, spec in live.items() if spec.scope_id == options.scope_id
            )
            return StreamFilter(scope_id=options.scope_id), members, None
        return StreamFilter(), frozenset(), None

    _handlers: dict[int, Callable[[CommandProcessor, Frame], None]] = {}


CommandProcessor._handlers = {
    int(Opcode.HELLO): CommandProcessor._on_hello,
    VERSION_OPCODE: CommandProcessor._on_version,
    int(Opcode.NOOP): CommandProcessor._on_noop,
    int(Opcode.GET_ERROR_MAP): CommandProcessor._on_error_map,
    int(Opcode.SASL_LIST_MECHS): CommandProcessor._on_list_mechs,
    int(Opcode.SASL_AUTH): CommandProcessor._on_sasl_auth,
    int(Opcode.SASL_STEP): CommandProcessor._on_sasl_step,
    int(Opcode.SELECT_BUCKET): CommandProcessor._on_select_bucket,
    int(Opcode.GET_CLUSTER_CONFIG): CommandProcessor._on_cluster_config,
    int(Opcode.GET_COLLECTIONS_MANIFEST): CommandProcessor._on_collections_manifest,
    int(Opcode.GET_ALL_VB_SEQNOS): CommandProcessor._on_all_vb_seqnos,
    int(Opcode.DCP_GET_FAILOVER_LOG): CommandProcessor._on_failover_log,
    OBSERVE_SEQNO_OPCODE: CommandProcessor._on_observe_seqno,
    int(Opcode.DCP_OPEN): CommandProcessor._on_dcp_open,
    int(Opcode.DCP_CONTROL): CommandProcessor._on_dcp_control,
    int(Opcode.DCP_BUFFER_ACK): CommandProcessor._on_buffer_ack,
    int(Opcode.DCP_CLOSE_STREAM): CommandProcessor._on_close_stream,
    int(Opcode.DCP_STREAM_REQ): CommandProcessor._on_stream_request,
}


@dataclass(frozen=True, slots=True)
class _StreamOptions:
    """What a stream request's JSON value asks for (keys kv_engine knows; others ignored)."""

    stream_id: int | None = None
    collection_ids: frozenset[int] | None = None
    scope_id: int | None = None
    purge_seqno: int | None = None


def _hello_problem(asked: set[int]) -> str | None:
    """Why kv_engine refuses this set of HELLO features (EINVAL), if it does."""
    for feature, needed, why in _NEEDS:
        if feature in asked and needed not in asked:
            return why
    if HelloFeature.TCP_NODELAY in asked and HelloFeature.TCP_DELAY in asked:
        return "TCPNODELAY cannot co-exist with TCPDELAY"
    return None


def _stream_id_problem(settings: ProducerSettings, stream_id: int | None) -> str | None:
    """Why a request's stream id (None: none given) is refused on this connection, if it is."""
    if settings.stream_ids and not stream_id:
        return "Stream ids are enabled: the request must name a stream id (1..65535)"
    if not settings.stream_ids and stream_id is not None:
        return "Stream ids are not enabled (DCP_CONTROL enable_stream_id)"
    return None


def _stream_options(value: bytes) -> _StreamOptions:
    """Parse the stream-request JSON value; ValueError naming what is wrong."""
    if not value:
        return _StreamOptions()
    try:
        document = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("Stream request value is not JSON") from None
    if not isinstance(document, dict):
        raise ValueError("Stream request value is not a JSON object")
    if "collections" in document and "scope" in document:
        raise ValueError("Stream request names both collections and a scope")
    stream_id = document.get("sid")
    if stream_id is not None and (type(stream_id) is not int or not 0 < stream_id <= 0xFFFF):
        raise ValueError("Stream request sid is not an integer 1..65535")
    collection_ids: frozenset[int] | None = None
    if "collections" in document:
        raw = document["collections"]
        if not isinstance(raw, list) or not all(isinstance(c, str) for c in raw):
            raise ValueError("Stream request collections is not a list of hex strings")
        collection_ids = frozenset(_hex_id(c, "collection") for c in raw)
    scope_id: int | None = None
    if "scope" in document:
        raw_scope = document["scope"]
        if not isinstance(raw_scope, str):
            raise ValueError("Stream request scope is not a hex string")
        scope_id = _hex_id(raw_scope, "scope")
    if "uid" in document and not isinstance(document["uid"], str):
        raise ValueError("Stream request uid is not a string")
    purge_seqno: int | None = None
    if "purge_seqno" in document:
        raw_purge = document["purge_seqno"]
        if not isinstance(raw_purge, str) or not raw_purge.isascii() or not raw_purge.isdigit():
            raise ValueError("Stream request purge_seqno is not a decimal string")
        purge_seqno = int(raw_purge)
    return _StreamOptions(stream_id, collection_ids, scope_id, purge_seqno)


def _hex_id(text: str, what: str) -> int:
    try:
        number = int(text, 16)
    except ValueError:
        raise ValueError(f"Stream request {what} id {text[:20]!r} is not hex") from None
    if not 0 <= number <= 0xFFFFFFFF:
        raise ValueError(f"Stream request {what} id {text[:20]!r} is not a u32")
    return number


def _collection_high_seqno(bucket: SimBucket, vbucket: int, collection_id: int) -> int:
    """The highest seqno of an item of `collection_id` in a vbucket (0 if none): a scan."""
    vb = bucket.vbucket(vbucket)
    for seqno in range(vb.high_seqno, 0, -1):
        item = vb.item_at(seqno)
        if isinstance(item, SystemEvent):
            if item.collection_id == collection_id:
                return seqno
        elif item.collection_id == collection_id:
            return seqno
    return 0
