"""`CommandProcessor`: one connection's answer to every request, in order, as kv_engine's.

It joins the handler groups (handshake, bucket_queries, dcp_streams) and dispatches each
request by opcode, refusing what an unauthenticated connection or a producer may not send.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from replicator.dcp.protocol.frame import Frame
from replicator.dcp.protocol.opcodes import Opcode, Status
from replicator.errors import ProtocolError
from replicator.sim.commands.bucket_queries import OBSERVE_SEQNO_OPCODE, BucketQueries
from replicator.sim.commands.dcp_streams import DcpCommands
from replicator.sim.commands.handshake import VERSION_OPCODE, HandshakeCommands

log = logging.getLogger(__name__)

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


class CommandProcessor(HandshakeCommands, BucketQueries, DcpCommands):
    """One connection's negotiated state and its answer to every request.

    Not thread-safe: the connection's loop owns it.
    """

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
