"""Memcached binary framing: the 24-byte header, flexible framing extras, and a frame reader.

A frame is header + body, body = [framing extras] extras, key, value. Classic magics (0x80/0x81)
carry a 16-bit key length in bytes 2-3; flexible magics (0x08/0x18) carry the framing-extras
length in byte 2 and an 8-bit key length in byte 3. Everything is big-endian.

`FrameReader` turns a byte stream into whole frames. It checks each header before waiting for
the body, so a hostile length can neither allocate unboundedly nor desynchronise the stream
silently: it raises `ProtocolError` and stays failed.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from replicator.dcp.protocol.opcodes import FrameInfoId, Magic
from replicator.errors import ProtocolError

HEADER_SIZE = 24
DEFAULT_MAX_BODY_SIZE = 20 * 1024 * 1024
"""Largest body the reader accepts by default: kv_engine's document limit is 20 MiB."""

_HEADER = struct.Struct(">BBHBBHIIQ")
_U16 = struct.Struct(">H")

_CLASSIC_MAGICS = frozenset(
    {Magic.REQUEST, Magic.RESPONSE, Magic.SERVER_REQUEST, Magic.SERVER_RESPONSE}
)
_FLEX_MAGICS = frozenset({Magic.FLEX_REQUEST, Magic.FLEX_RESPONSE})
_KNOWN_MAGICS = _CLASSIC_MAGICS | _FLEX_MAGICS
_FLEX_MAGIC_VALUES = frozenset(int(m) for m in _FLEX_MAGICS)
_KNOWN_MAGIC_VALUES = frozenset(int(m) for m in _KNOWN_MAGICS)
_STREAM_ID_INFO_TAG = (int(FrameInfoId.DCP_STREAM_ID) << 4) | 2
_PRODUCER_REQUEST_MAGICS = frozenset({int(Magic.REQUEST), int(Magic.FLEX_REQUEST)})
_DATA_OPCODES = frozenset({0x57, 0x58, 0x59})  # DCP_MUTATION, DCP_DELETION, DCP_EXPIRATION


class Frame(NamedTuple):
    """One whole memcached-binary frame as it was on the wire (lengths implied by the parts).

    `vbucket_or_status` is the header's bytes 6-7: the vbucket of a request, the status of a
    response; read it through `vbucket` or `status`.

    A NamedTuple rather than a frozen dataclass: one is built per wire message on the decode
    hot path, and a frozen dataclass's __init__ costs several times more.
    """

    magic: int
    opcode: int
    datatype: int
    vbucket_or_status: int
    opaque: int
    cas: int
    framing_extras: bytes
    extras: bytes
    key: bytes
    value: bytes

    def __repr__(self) -> str:
        # The value is shown by length only: it may be a document, or a SASL_AUTH password.
        return (
            f"Frame(magic=0x{self.magic:02x}, opcode=0x{self.opcode:02x}, "
            f"datatype=0x{self.datatype:02x}, vbucket_or_status={self.vbucket_or_status}, "
            f"opaque=0x{self.opaque:08x}, cas=0x{self.cas:x}, "
            f"framing_extras={self.framing_extras!r}, extras={self.extras!r}, "
            f"key={self.key!r}, value=<{len(self.value)} bytes>)"
        )

    @property
    def vbucket(self) -> int:
        return self.vbucket_or_status

    @property
    def status(self) -> int:
        return self.vbucket_or_status

    @property
    def is_flexible(self) -> bool:
        return self.magic in _FLEX_MAGIC_VALUES

    @property
    def is_request(self) -> bool:
        """A client-initiated request, or a DCP producer's message to its consumer."""
        return self.magic == Magic.REQUEST or self.magic == Magic.FLEX_REQUEST

    @property
    def is_response(self) -> bool:
        return self.magic == Magic.RESPONSE or self.magic == Magic.FLEX_RESPONSE

    @property
    def body_size(self) -> int:
        return len(self.framing_extras) + len(self.extras) + len(self.key) + len(self.value)

    @property
    def size(self) -> int:
        """Header plus body: what a DCP BUFFER_ACK counts for this frame."""
        return HEADER_SIZE + self.body_size

    @property
    def stream_id(self) -> int | None:
        """The DCP stream id from the flexible framing extras, None when there is none."""
        if not self.framing_extras:
            return None
        return stream_id_of(self.framing_extras, opcode=self.opcode)

    def encode(self) -> bytes:
        """The frame's wire bytes."""
        return encode_frame(
            self.magic,
            self.opcode,
            datatype=self.datatype,
            vbucket_or_status=self.vbucket_or_status,
            opaque=self.opaque,
            cas=self.cas,
            framing_extras=self.framing_extras,
            extras=self.extras,
            key=self.key,
            value=self.value,
        )


def encode_frame(
    magic: int,
    opcode: int,
    *,
    datatype: int = 0,
    vbucket_or_status: int = 0,
    opaque: int = 0,
    cas: int = 0,
    framing_extras: bytes = b"",
    extras: bytes = b"",
    key: bytes = b"",
    value: bytes = b"",
) -> bytes:
    """Build a frame's wire bytes.

    Framing extras need a flexible magic (0x08/0x18), which limits the key to 255 bytes.

    >>> encode_frame(Magic.REQUEST, 0x0A, opaque=7).hex()[:8]
    '800a0000'
    """
    if magic not in _KNOWN_MAGIC_VALUES:
        raise ValueError(f"unknown magic 0x{magic:02x}")
    framing_len = len(framing_extras)
    key_len = len(key)
    if magic in _FLEX_MAGIC_VALUES:
        if framing_len > 0xFF:
            raise ValueError(f"framing extras of {framing_len} bytes exceed 255")
        if key_len > 0xFF:
            raise ValueError(f"key of {key_len} bytes exceeds 255 with flexible framing")
        length_field = (framing_len << 8) | key_len
    else:
        if framing_len:
            raise ValueError(f"framing extras need a flexible magic, not 0x{magic:02x}")
        if key_len > 0xFFFF:
            raise ValueError(f"key of {key_len} bytes exceeds 65535")
        length_field = key_len
    if len(extras) > 0xFF:
        raise ValueError(f"extras of {len(extras)} bytes exceed 255")
    body_len = framing_len + len(extras) + key_len + len(value)
    try:
        header = _HEADER.pack(
            magic,
            opcode,
            length_field,
            len(extras),
            datatype,
            vbucket_or_status,
            body_len,
            opaque,
            cas,
        )
    except struct.error as exc:
        raise ValueError(f"opcode 0x{opcode:02x}: header field out of range ({exc})") from None
    return b"".join((header, framing_extras, extras, key, value))


@dataclass(frozen=True, slots=True)
class FrameInfo:
    """One flexible-framing entry: an object id and its data."""

    id: int
    data: bytes


def encode_frame_infos(infos: Iterable[FrameInfo]) -> bytes:
    """Encode entries with the nibble-and-escape scheme of BinaryProtocol.md."""
    out = bytearray()
    for info in infos:
        size = len(info.data)
        if not 0 <= info.id <= 15 + 0xFF:
            raise ValueError(f"frame info id {info.id} out of range")
        if size > 15 + 0xFF:
            raise ValueError(f"frame info data of {size} bytes is too long")
        id_nibble = min(info.id, 15)
        len_nibble = min(size, 15)
        out.append((id_nibble << 4) | len_nibble)
        if id_nibble == 15:
            out.append(info.id - 15)
        if len_nibble == 15:
            out.append(size - 15)
        out += info.data
    return bytes(out)


def decode_frame_infos(
    framing_extras: bytes, *, opcode: int | None = None
) -> tuple[FrameInfo, ...]:
    """Split flexible framing extras into entries; raises ProtocolError when truncated."""
    infos: list[FrameInfo] = []
    pos = 0
    end = len(framing_extras)
    while pos < end:
        tag = framing_extras[pos]
        pos += 1
        info_id = tag >> 4
        size = tag & 0x0F
        if info_id == 15:
            if pos >= end:
                raise ProtocolError("framing extras truncated in an escaped id", opcode=opcode)
            info_id += framing_extras[pos]
            pos += 1
        if size == 15:
            if pos >= end:
                raise ProtocolError("framing extras truncated in an escaped length", opcode=opcode)
            size += framing_extras[pos]
            pos += 1
        if pos + size > end:
            raise ProtocolError(
                f"frame info {info_id} claims {size} bytes, {end - pos} left", opcode=opcode
            )
        infos.append(FrameInfo(info_id, framing_extras[pos : pos + size]))
        pos += size
    return tuple(infos)


def stream_id_frame_info(stream_id: int) -> bytes:
    """Framing extras carrying a DCP stream id (`id 2 len 2`, u16)."""
    if not 0 <= stream_id <= 0xFFFF:
        raise ValueError(f"stream id {stream_id} is not a u16")
    return bytes((_STREAM_ID_INFO_TAG,)) + _U16.pack(stream_id)


def with_stream_id(frame: bytes, stream_id: int) -> bytes:
    """A classic request frame re-framed flexibly with a DCP stream id (key under 256 bytes)."""
    if frame[0] != Magic.REQUEST:
        raise ValueError(f"magic 0x{frame[0]:02x}: only classic requests take a stream id")
    key_length = _U16.unpack_from(frame, 2)[0]
    if key_length > 0xFF:
        raise ValueError(f"a key of {key_length} bytes does not fit flexible framing")
    info = stream_id_frame_info(stream_id)
    body_length = struct.unpack_from(">I", frame, 8)[0] + len(info)
    return b"".join(
        (
            bytes((Magic.FLEX_REQUEST, frame[1], len(info), key_length)),
            frame[4:8],
            struct.pack(">I", body_length),
            frame[12:HEADER_SIZE],
            info,
            frame[HEADER_SIZE:],
        )
    )


def stream_id_of(framing_extras: bytes, *, opcode: int | None = None) -> int | None:
    """The DCP stream id in framing extras, None when absent; ProtocolError when malformed."""
    if len(framing_extras) == 3 and framing_extras[0] == _STREAM_ID_INFO_TAG:
        # The only entry a DCP producer sends: skip the general parse.
        return int(_U16.unpack_from(framing_extras, 1)[0])
    for info in decode_frame_infos(framing_extras, opcode=opcode):
        if info.id == FrameInfoId.DCP_STREAM_ID:
            if len(info.data) != 2:
                raise ProtocolError(
                    f"stream-id frame info has {len(info.data)} bytes, expected 2", opcode=opcode
                )
            return int(_U16.unpack(info.data)[0])
    return None


def parse_frame(data: bytes, *, max_body_size: int = DEFAULT_MAX_BODY_SIZE) -> Frame:
    """Parse exactly one whole frame; ProtocolError when truncated or followed by extra bytes."""
    reader = FrameReader(max_body_size=max_body_size)
    frames = reader.feed(data)
    if not frames:
        reader.finish()
        raise ProtocolError("no frame in input")  # finish() raised unless input was empty
    if len(frames) > 1 or reader.buffered_bytes:
        raise ProtocolError(
            f"{len(data) - frames[0].size} bytes follow the frame", opcode=frames[0].opcode
        )
    return frames[0]


class DataMessageSink(Protocol):
    """Where a FrameReader puts DCP data messages instead of making frames of them
    (`replicator.dcp.protocol.columnar.DocumentColumns`)."""

    def begin(self, buf: bytes) -> None:
        """The reader is about to parse `buf`."""

    def add(
        self,
        buf: bytes,
        pos: int,
        frame_end: int,
        out: list[object],
        magic: int,
        opcode: int,
        key_length: int,
        extras_length: int,
        datatype: int,
        vbucket: int,
        opaque: int,
    ) -> None:
        """Take the data message at buf[pos:frame_end]; may append an entry to `out`."""

    def end_vbucket(self, vbucket: int) -> None:
        """A producer message of another kind came for the vbucket."""

    def end_all(self) -> None:
        """A message that is not a producer request came."""


class FrameReader:
    """Incremental reader: feed it bytes as they arrive, get back every frame completed.

    Each header is validated as soon as its 24 bytes are in: magic known, framing extras +
    extras + key <= body length, body length <= `max_body_size`. After a ProtocolError the
    stream position is lost, so the reader refuses further input with the same error.

    With a `sink`, producer data messages go to the sink (which may put its own entries among
    the frames), and a ProtocolError found after some frames were complete is not raised at
    once: `feed` returns those frames, `failure` tells, and the next `feed` raises. The caller
    hands up what came before the bad frame, then stops.
    """

    __slots__ = ("_chunks", "_failure", "_max_body_size", "_needed", "_pending_bytes", "sink")

    def __init__(
        self, *, max_body_size: int = DEFAULT_MAX_BODY_SIZE, sink: DataMessageSink | None = None
    ) -> None:
        if max_body_size < 0:
            raise ValueError("max_body_size must not be negative")
        self.sink = sink
        self._max_body_size = max_body_size
        self._chunks: list[bytes] = []
        self._pending_bytes = 0
        # Bytes needed before parsing can make progress: avoids re-joining a partial large
        # frame on every small read (quadratic copying).
        self._needed = HEADER_SIZE
        self._failure: ProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return self._pending_bytes

    @property
    def failure(self) -> ProtocolError | None:
        """The error that stopped the reader, if any."""
        return self._failure

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add received bytes; return the frames they complete, in order (with a sink, the
        sink's entries too: the list then holds objects of both kinds)."""
        if self._failure is not None:
            raise self._failure
        if data:
            self._chunks.append(bytes(data))
            self._pending_bytes += len(data)
        if self._pending_bytes < self._needed:
            return []
        buf = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        frames: list[Frame] = []
        try:
            pos = self._parse(buf, frames)
        except ProtocolError as exc:
            self._failure = exc
            self._chunks = []
            self._pending_bytes = 0
            if self.sink is not None and frames:
                return frames
            raise
        rest = buf[pos:] if pos else buf
        self._chunks = [rest] if rest else []
        self._pending_bytes = len(rest)
        return frames

    def finish(self) -> None:
        """Declare the stream ended; ProtocolError if it stopped in the middle of a frame."""
        if self._failure is not None:
            raise self._failure
        if self._pending_bytes:
            buf = b"".join(self._chunks)
            opcode = buf[1] if len(buf) > 1 else None
            raise ProtocolError(
                f"truncated frame: stream ended with {self._pending_bytes} of {self._needed} bytes",
                opcode=opcode,
            )

    def _parse(self, buf: bytes, frames: list[Frame]) -> int:
        """Append the whole frames in `buf` to `frames`; return the offset of the rest."""
        pos = 0
        end = len(buf)
        unpack = _HEADER.unpack_from
        flex_magics = _FLEX_MAGIC_VALUES
        known_magics = _KNOWN_MAGIC_VALUES
        max_body = self._max_body_size
        append = frames.append
        # tuple.__new__ directly: skips the NamedTuple's Python-level __new__ per frame.
        new_frame = tuple.__new__
        sink = self.sink
        producer_magics = _PRODUCER_REQUEST_MAGICS
        data_opcodes = _DATA_OPCODES
        out: list[object] = frames  # type: ignore[assignment]  # the sink adds its own entries
        if sink is not None:
            sink.begin(buf)
        while end - pos >= HEADER_SIZE:
            magic, opcode, key_len, ext_len, datatype, vbs, body_len, opaque, cas = unpack(buf, pos)
            if magic in flex_magics:
                framing_len = key_len >> 8
                key_len &= 0xFF
            elif magic in known_magics:
                framing_len = 0
            else:
                raise ProtocolError(f"bad magic 0x{magic:02x}", opcode=opcode)
            if body_len > max_body:
                raise ProtocolError(
                    f"body length {body_len} exceeds the limit of {max_body} bytes",
                    opcode=opcode,
                )
            if framing_len + ext_len + key_len > body_len:
                raise ProtocolError(
                    f"lengths do not add up: framing extras {framing_len} + extras {ext_len}"
                    f" + key {key_len} > body {body_len}",
                    opcode=opcode,
                )
            frame_end = pos + HEADER_SIZE + body_len
            if frame_end > end:
                self._needed = HEADER_SIZE + body_len
                return pos
            if sink is not None:
                if magic in producer_magics:
                    if opcode in data_opcodes:
                        sink.add(
                            buf, pos, frame_end, out, magic, opcode, key_len, ext_len, datatype,
                            vbs, opaque,
                        )  # fmt: skip
                        pos = frame_end
                        continue
                    sink.end_vbucket(vbs)
                else:
                    sink.end_all()
            p = pos + HEADER_SIZE
            if framing_len:
                framing = buf[p : p + framing_len]
                p += framing_len
            else:
                framing = b""
            k = p + ext_len
            v = k + key_len
            append(
                new_frame(
                    Frame,
                    (
                        magic,
                        opcode,
                        datatype,
                        vbs,
                        opaque,
                        cas,
                        framing,
                        buf[p:k],
                        buf[k:v],
                        buf[v:frame_end],
                    ),
                )
            )
            pos = frame_end
        self._needed = HEADER_SIZE
        return pos
