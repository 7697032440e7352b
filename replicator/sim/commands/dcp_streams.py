"""DCP on a connection: DCP_OPEN, DCP_CONTROL, STREAM_REQ (its rollback decision and
collection filter), CLOSE_STREAM and BUFFER_ACK."""

from __future__ import annotations

import json
from dataclasses import dataclass

from replicator.dcp.protocol.codec import decode_request
from replicator.dcp.protocol.dcp_requests import (
    BufferAck,
    CloseStream,
    DcpControl,
    DcpOpen,
    StreamRequest,
)
from replicator.dcp.protocol.events import StreamEndReason
from replicator.dcp.protocol.frame import Frame
from replicator.dcp.protocol.opcodes import (
    DcpOpenFlags,
    HelloFeature,
    Status,
    StreamRequestFlags,
)
from replicator.dcp.protocol.responses import encode_failover_log, encode_rollback_seqno
from replicator.errors import ProtocolError
from replicator.sim.commands.state import ConnectionState, DcpState
from replicator.sim.dcp_controls import ConnectionTraits, ProducerSettings, apply_control
from replicator.sim.failover_table import StreamAccepted, StreamRollback
from replicator.sim.failover_table import StreamRequest as RollbackQuery
from replicator.sim.producer_stream import ProducerStream, StreamEncoding, StreamFilter

_UNDERLYING_DATATYPE = DcpOpenFlags.NO_VALUE_WITH_UNDERLYING_DATATYPE


class DcpCommands(ConnectionState):
    """The DCP producer's side of a connection: opening it, its controls and its streams."""

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


@dataclass(frozen=True, slots=True)
class _StreamOptions:
    """What a stream request's JSON value asks for (keys kv_engine knows; others ignored)."""

    stream_id: int | None = None
    collection_ids: frozenset[int] | None = None
    scope_id: int | None = None
    purge_seqno: int | None = None


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
