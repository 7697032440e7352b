"""Replies to client requests: the one generic `Response` type, its encoder and decoder, and per
request the reader of a reply's value beside the encoder of that value.

The consumer decodes responses and reads them (`failover_log_of`, `rollback_seqno_of`, ...);
the embedded producer builds the values (`encode_failover_log`, ...) and encodes the response.
Readers raise only `ProtocolError`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from replicator.dcp.protocol.frame import Frame, encode_frame
from replicator.dcp.protocol.opcodes import Magic, Opcode, Status
from replicator.dcp.protocol.requests import decode_hello_features
from replicator.dcp.protocol.values import decompress_value
from replicator.dcp.protocol.wire import SNAPPY_BIT, U64, UNKNOWN_DATATYPE_BITS, decode_text
from replicator.errors import ProtocolError
from replicator.model.positions import FailoverLog

_FAILOVER_ENTRY = struct.Struct(">QQ")
_VBUCKET_SEQNO = struct.Struct(">HQ")


@dataclass(frozen=True, slots=True)
class Response:
    """A reply to a client request. `status` is a `Status` member when the code is known.

    The value is kept as sent (possibly snappy); the readers below decompress where needed.
    """

    opcode: int
    status: int
    opaque: int = 0
    value: bytes = b""
    extras: bytes = b""
    key: bytes = b""
    cas: int = 0
    datatype: int = 0
    framing_extras: bytes = b""

    @property
    def succeeded(self) -> bool:
        return self.status == Status.SUCCESS

    @property
    def status_name(self) -> str:
        """The status's name, or its hex code when this codec does not know it."""
        return self.status.name if isinstance(self.status, Status) else f"0x{self.status:04x}"


def _status_code(code: int) -> int:
    try:
        return Status(code)
    except ValueError:
        return code


def encode_response(response: Response) -> bytes:
    """Wire bytes of a response (flexible magic when it has framing extras)."""
    magic = Magic.FLEX_RESPONSE if response.framing_extras else Magic.RESPONSE
    return encode_frame(
        magic,
        response.opcode,
        datatype=response.datatype,
        vbucket_or_status=response.status,
        opaque=response.opaque,
        cas=response.cas,
        framing_extras=response.framing_extras,
        extras=response.extras,
        key=response.key,
        value=response.value,
    )


def decode_response(frame: Frame) -> Response:
    """Decode any response (magic 0x81 or 0x18) into the generic `Response`."""
    if not frame.is_response:
        raise ProtocolError(f"magic 0x{frame.magic:02x} is not a response", opcode=frame.opcode)
    if frame.datatype & UNKNOWN_DATATYPE_BITS:
        raise ProtocolError(f"unknown datatype bits 0x{frame.datatype:02x}", opcode=frame.opcode)
    return Response(
        opcode=frame.opcode,
        status=_status_code(frame.vbucket_or_status),
        opaque=frame.opaque,
        value=frame.value,
        extras=frame.extras,
        key=frame.key,
        cas=frame.cas,
        datatype=frame.datatype,
        framing_extras=frame.framing_extras,
    )


def dcp_noop_reply(opaque: int) -> Response:
    """The consumer's reply to a producer's DCP_NOOP: a success response, same opaque."""
    return Response(Opcode.DCP_NOOP, Status.SUCCESS, opaque)


def _plain_value(response: Response) -> bytes:
    if response.datatype & SNAPPY_BIT:
        return decompress_value(response.value, opcode=response.opcode)
    return response.value


def _expect_status(response: Response, status: Status, what: str) -> None:
    if response.status != status:
        raise ProtocolError(
            f"{what} needs status {status.name}, got {response.status_name}",
            opcode=response.opcode,
        )


# --- STREAM_REQ, GET_FAILOVER_LOG


def failover_log_of(response: Response) -> FailoverLog:
    """The failover log of a successful STREAM_REQ or GET_FAILOVER_LOG reply, newest first."""
    _expect_status(response, Status.SUCCESS, "a failover log")
    value = _plain_value(response)
    if not value or len(value) % _FAILOVER_ENTRY.size:
        raise ProtocolError(
            f"failover log of {len(value)} bytes is not a non-empty list of 16-byte entries",
            opcode=response.opcode,
        )
    return FailoverLog.of(_FAILOVER_ENTRY.iter_unpack(value))


def encode_failover_log(log: FailoverLog) -> bytes:
    """The value of a failover-log reply: (vb_uuid, seqno) u64 pairs, newest first."""
    return b"".join(_FAILOVER_ENTRY.pack(e.vbucket_uuid, e.seqno) for e in log.entries)


def rollback_seqno_of(response: Response) -> int:
    """The seqno a ROLLBACK reply asks to roll back to: a u64 in the VALUE (extras are empty)."""
    _expect_status(response, Status.ROLLBACK, "a rollback seqno")
    value = _plain_value(response)
    if len(value) != 8:
        raise ProtocolError(
            f"rollback value of {len(value)} bytes, expected an 8-byte seqno",
            opcode=response.opcode,
        )
    return int(U64.unpack(value)[0])


def encode_rollback_seqno(seqno: int) -> bytes:
    """The value of a ROLLBACK reply."""
    return U64.pack(seqno)


# --- GET_ALL_VB_SEQNOS


@dataclass(frozen=True, slots=True)
class VbucketSeqno:
    """One record of a GET_ALL_VB_SEQNOS reply: a vbucket and its high seqno."""

    vbucket: int
    seqno: int


def vbucket_seqnos_of(response: Response) -> tuple[VbucketSeqno, ...]:
    """The (vbucket, high seqno) records of a GET_ALL_VB_SEQNOS reply."""
    _expect_status(response, Status.SUCCESS, "vbucket seqnos")
    value = _plain_value(response)
    if len(value) % _VBUCKET_SEQNO.size:
        raise ProtocolError(
            f"vbucket seqnos of {len(value)} bytes are not whole 10-byte records",
            opcode=response.opcode,
        )
    return tuple(VbucketSeqno(vb, seqno) for vb, seqno in _VBUCKET_SEQNO.iter_unpack(value))


def encode_vbucket_seqnos(records: Iterable[VbucketSeqno]) -> bytes:
    """The value of a GET_ALL_VB_SEQNOS reply."""
    return b"".join(_VBUCKET_SEQNO.pack(r.vbucket, r.seqno) for r in records)


# --- HELLO, NOT_MY_VBUCKET, SASL_LIST_MECHS


def hello_features_of(response: Response) -> tuple[int, ...]:
    """The features a HELLO reply agreed to (HelloFeature members where known)."""
    _expect_status(response, Status.SUCCESS, "HELLO features")
    try:
        return decode_hello_features(response.value)
    except ValueError as exc:
        raise ProtocolError(str(exc), opcode=response.opcode) from None


def not_my_vbucket_config_of(response: Response) -> bytes | None:
    """The cluster map JSON a NOT_MY_VBUCKET reply may carry; None when it carries none."""
    _expect_status(response, Status.NOT_MY_VBUCKET, "a NOT_MY_VBUCKET config")
    value = _plain_value(response)
    return value or None


def sasl_mechanisms_of(response: Response) -> tuple[str, ...]:
    """The mechanisms of a SASL_LIST_MECHS reply (space-separated in the value)."""
    _expect_status(response, Status.SUCCESS, "SASL mechanisms")
    try:
        return tuple(decode_text(response.value, "SASL mechanism list").split())
    except ValueError as exc:
        raise ProtocolError(str(exc), opcode=response.opcode) from None


def encode_sasl_mechanisms(mechanisms: Iterable[str]) -> bytes:
    """The value of a SASL_LIST_MECHS reply: the names separated by spaces."""
    names = tuple(mechanisms)
    for name in names:
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"SASL mechanism name {name!r} is empty or contains a space")
    return " ".join(names).encode()
