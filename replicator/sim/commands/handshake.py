"""Bootstrap commands: HELLO and its feature rules, SASL, SELECT_BUCKET, VERSION, NOOP and
GET_ERROR_MAP."""

from __future__ import annotations

import struct

from replicator.dcp.protocol.codec import decode_request
from replicator.dcp.protocol.frame import Frame
from replicator.dcp.protocol.opcodes import HelloFeature, Status
from replicator.dcp.protocol.requests import (
    Hello,
    SaslAuth,
    SaslStep,
    SelectBucket,
    encode_hello_features,
)
from replicator.dcp.protocol.responses import encode_sasl_mechanisms
from replicator.sim.commands.state import ConnectionState
from replicator.sim.error_map import error_map_json
from replicator.sim.sasl_server import SaslReply

VERSION_OPCODE = 0x0B
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

_U16 = struct.Struct(">H")


class HandshakeCommands(ConnectionState):
    """HELLO, SASL, SELECT_BUCKET and the commands an unauthenticated connection may send."""

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


def _hello_problem(asked: set[int]) -> str | None:
    """Why kv_engine refuses this set of HELLO features (EINVAL), if it does."""
    for feature, needed, why in _NEEDS:
        if feature in asked and needed not in asked:
            return why
    if HelloFeature.TCP_NODELAY in asked and HelloFeature.TCP_DELAY in asked:
        return "TCPNODELAY cannot co-exist with TCPDELAY"
    return None
