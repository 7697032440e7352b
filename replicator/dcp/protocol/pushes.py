"""Requests the server initiates (magic 0x82): only the cluster-map change notification.

A consumer that sent HELLO CLUSTERMAP_CHANGE_NOTIFICATION receives these unasked on any
connection; the embedded producer sends them when its map changes. No reply is expected.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from replicator.dcp.protocol.frame import Frame, encode_frame
from replicator.dcp.protocol.opcodes import Magic, ServerOpcode
from replicator.dcp.protocol.values import decompress_value
from replicator.dcp.protocol.wire import DECODE_FAILURES, JSON_BIT, SNAPPY_BIT, U32, decode_text
from replicator.errors import ProtocolError

_CLUSTERMAP_EPOCH_REVISION = struct.Struct(">qq")


@dataclass(frozen=True, slots=True)
class ClustermapChangeNotification:
    """Server push (magic 0x82, opcode 0x01): a bucket's cluster map changed.

    `epoch` is None for the 4-byte-extras form (revision only). `config` is the map JSON, empty
    for brief notifications. No reply is expected.
    """

    bucket: str
    revision: int
    epoch: int | None = None
    config: bytes = b""


def encode_server_request(notification: ClustermapChangeNotification) -> bytes:
    """Wire bytes of a cluster-map change notification."""
    try:
        if notification.epoch is None:
            extras = U32.pack(notification.revision)
        else:
            extras = _CLUSTERMAP_EPOCH_REVISION.pack(notification.epoch, notification.revision)
    except struct.error as exc:
        raise ValueError(f"ClustermapChangeNotification: field out of range ({exc})") from None
    return encode_frame(
        Magic.SERVER_REQUEST,
        ServerOpcode.CLUSTERMAP_CHANGE_NOTIFICATION,
        datatype=JSON_BIT if notification.config else 0,
        extras=extras,
        key=notification.bucket.encode(),
        value=notification.config,
    )


def decode_server_request(frame: Frame) -> ClustermapChangeNotification:
    """Decode a server-initiated request; only cluster-map change notifications are known."""
    if frame.magic != Magic.SERVER_REQUEST:
        raise ProtocolError(
            f"magic 0x{frame.magic:02x} is not a server request", opcode=frame.opcode
        )
    if frame.opcode != ServerOpcode.CLUSTERMAP_CHANGE_NOTIFICATION:
        raise ProtocolError("unsupported server request", opcode=frame.opcode)
    try:
        epoch: int | None
        if len(frame.extras) == 4:
            epoch, revision = None, U32.unpack(frame.extras)[0]
        elif len(frame.extras) == 16:
            epoch, revision = _CLUSTERMAP_EPOCH_REVISION.unpack(frame.extras)
            if revision < 0:
                raise ValueError(f"negative revision {revision}")
        else:
            raise ValueError(f"extras of {len(frame.extras)} bytes, expected 4 or 16")
        config = frame.value
        if frame.datatype & SNAPPY_BIT:
            config = decompress_value(config, opcode=frame.opcode)
        return ClustermapChangeNotification(
            decode_text(frame.key, "bucket name"), revision, epoch, config
        )
    except DECODE_FAILURES as exc:
        raise ProtocolError(
            f"malformed cluster-map change notification: {exc}", opcode=frame.opcode
        ) from None
