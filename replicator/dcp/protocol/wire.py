"""Low-level pieces every wire-message module shares: integer layouts, body-shape checks, the
request-frame builder and what a decoder turns into `ProtocolError`.

One small module so that requests, responses, producer messages and server pushes share these
without reaching into one another's modules.
"""

from __future__ import annotations

import struct

from replicator.dcp.protocol.frame import Frame, encode_frame, stream_id_frame_info, stream_id_of
from replicator.dcp.protocol.opcodes import KNOWN_DATATYPE_BITS, Datatype, Magic

U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")

JSON_BIT = int(Datatype.JSON)
SNAPPY_BIT = int(Datatype.SNAPPY)
UNKNOWN_DATATYPE_BITS = 0xFF & ~int(KNOWN_DATATYPE_BITS)

DECODE_FAILURES = (struct.error, UnicodeDecodeError, ValueError, OverflowError, IndexError)
"""What malformed input can make the standard library raise; decoders turn it into ProtocolError."""


def decode_text(data: bytes, what: str) -> str:
    """UTF-8 text of a key or value; ValueError naming `what` when it is not UTF-8."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not UTF-8") from None


def expect_no_body(frame: Frame) -> None:
    """Body-shape checks raise ValueError; the decode entry points turn it into ProtocolError."""
    if frame.extras or frame.key or frame.value:
        raise ValueError(
            f"expected no body, got extras {len(frame.extras)}, key {len(frame.key)}, "
            f"value {len(frame.value)} bytes"
        )


def expect_extras(frame: Frame, size: int) -> None:
    if len(frame.extras) != size:
        raise ValueError(f"extras of {len(frame.extras)} bytes, expected {size}")


def expect_no_key(frame: Frame) -> None:
    if frame.key:
        raise ValueError(f"unexpected key of {len(frame.key)} bytes")


def expect_no_value(frame: Frame) -> None:
    if frame.value:
        raise ValueError(f"unexpected value of {len(frame.value)} bytes")


def request_frame(
    opcode: int,
    *,
    opaque: int,
    vbucket: int = 0,
    stream_id: int | None = None,
    extras: bytes = b"",
    key: bytes = b"",
    value: bytes = b"",
    datatype: int = 0,
    cas: int = 0,
) -> bytes:
    """A request's wire bytes; flexible framing carries `stream_id` when one is given.

    The one builder for a client's requests and a producer's messages alike: both are requests.
    """
    return encode_frame(
        Magic.REQUEST if stream_id is None else Magic.FLEX_REQUEST,
        opcode,
        datatype=datatype,
        vbucket_or_status=vbucket,
        opaque=opaque,
        cas=cas,
        framing_extras=b"" if stream_id is None else stream_id_frame_info(stream_id),
        extras=extras,
        key=key,
        value=value,
    )


def frame_stream_id(frame: Frame) -> int | None:
    """The DCP stream id in a frame's framing extras, None when it has none."""
    if not frame.framing_extras:
        return None
    return stream_id_of(frame.framing_extras, opcode=frame.opcode)

