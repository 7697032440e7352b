"""Encodings inside keys and values: LEB128 collection ids, xattr sections, snappy.

With the collections HELLO feature every document key starts with its collection id as
unsigned LEB128. A value's datatype says whether it is JSON, snappy-compressed (the whole
value, xattrs included) and whether it starts with an xattr section:
u32 total length, then pairs of {u32 pair length, key, 0x00, value, 0x00}.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import cramjam

from replicator.dcp.protocol.opcodes import KNOWN_DATATYPE_BITS, Datatype
from replicator.errors import ProtocolError

MAX_COLLECTION_ID = 0xFFFFFFFF
MAX_LEB128_BYTES = 5
"""A u32 needs at most 5 LEB128 bytes (7 bits each)."""

DEFAULT_MAX_VALUE_SIZE = 21 * 1024 * 1024
"""Largest decompressed value accepted: kv_engine's 20 MiB body limit plus 1 MiB of xattrs."""

_U32 = struct.Struct(">I")
_JSON = int(Datatype.JSON)
_SNAPPY = int(Datatype.SNAPPY)
_XATTR = int(Datatype.XATTR)
_UNKNOWN_DATATYPE_BITS = 0xFF & ~int(KNOWN_DATATYPE_BITS)

Xattrs = tuple[tuple[str, str], ...]
"""Extended attributes as (key, value) pairs, in wire order."""


# --- LEB128 collection ids -------------------------------------------------------------------


def encode_leb128(value: int) -> bytes:
    """Unsigned LEB128 of a collection id (0 .. 2**32-1).

    >>> encode_leb128(0x08).hex(), encode_leb128(300).hex()
    ('08', 'ac02')
    """
    if not 0 <= value <= MAX_COLLECTION_ID:
        raise ValueError(f"collection id {value} is not a u32")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def decode_leb128(data: bytes, offset: int = 0, *, opcode: int | None = None) -> tuple[int, int]:
    """Read one unsigned LEB128 u32 at `offset`; return (value, offset after it).

    Strict: ProtocolError when truncated, longer than 5 bytes, beyond u32, or not in its
    shortest form (a trailing 0x00 group), since the server only writes canonical encodings.
    """
    result = 0
    shift = 0
    pos = offset
    end = len(data)
    while True:
        if pos >= end:
            raise ProtocolError("truncated LEB128 collection id", opcode=opcode)
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if pos - offset >= MAX_LEB128_BYTES:
            raise ProtocolError(
                f"LEB128 collection id longer than {MAX_LEB128_BYTES} bytes", opcode=opcode
            )
    if byte == 0 and pos - offset > 1:
        raise ProtocolError("LEB128 collection id not in shortest form", opcode=opcode)
    if result > MAX_COLLECTION_ID:
        raise ProtocolError(f"LEB128 collection id {result} exceeds u32", opcode=opcode)
    return result, pos


def split_collection_key(key: bytes, *, opcode: int | None = None) -> tuple[int, bytes]:
    """Split a collections-enabled document key into (collection id, key without prefix)."""
    if key and key[0] < 0x80:
        # One-byte ids (every collection below 128, the default collection 0): fast path.
        return key[0], key[1:]
    collection_id, pos = decode_leb128(key, opcode=opcode)
    return collection_id, key[pos:]


def join_collection_key(collection_id: int, key: bytes) -> bytes:
    """Prefix a document key with its LEB128 collection id."""
    return encode_leb128(collection_id) + key


# --- xattrs ----------------------------------------------------------------------------------


def encode_xattrs(xattrs: Sequence[tuple[str, str]]) -> bytes:
    """Encode an xattr section (u32 total length included) to put before a document body.

    Keys must be non-empty; neither keys nor values may contain NUL.
    """
    parts: list[bytes] = []
    for key, value in xattrs:
        if not key:
            raise ValueError("an xattr key must not be empty")
        if "\x00" in key or "\x00" in value:
            raise ValueError(f"xattr {key!r}: key and value must not contain NUL")
        pair = key.encode() + b"\x00" + value.encode() + b"\x00"
        parts.append(_U32.pack(len(pair)) + pair)
    section = b"".join(parts)
    return _U32.pack(len(section)) + section


def decode_xattrs(data: bytes, *, opcode: int | None = None) -> tuple[Xattrs, bytes]:
    """Split a value that starts with an xattr section into (xattrs, document body)."""
    if len(data) < 4:
        raise ProtocolError(
            f"xattr section truncated: {len(data)} bytes, no room for its length", opcode=opcode
        )
    total = _U32.unpack_from(data, 0)[0]
    end = 4 + total
    if end > len(data):
        raise ProtocolError(
            f"xattr section claims {total} bytes, value has {len(data) - 4}", opcode=opcode
        )
    pairs: list[tuple[str, str]] = []
    pos = 4
    while pos < end:
        if end - pos < 4:
            raise ProtocolError("xattr pair length truncated", opcode=opcode)
        pair_len = _U32.unpack_from(data, pos)[0]
        pos += 4
        pair_end = pos + pair_len
        if pair_end > end:
            raise ProtocolError(
                f"xattr pair of {pair_len} bytes overruns the section", opcode=opcode
            )
        pair = data[pos:pair_end]
        key_end = pair.find(b"\x00")
        if key_end <= 0 or pair[-1] != 0 or pair.count(b"\x00") != 2:
            raise ProtocolError(
                "xattr pair is not key NUL value NUL with a non-empty key", opcode=opcode
            )
        try:
            key = pair[:key_end].decode()
            value = pair[key_end + 1 : -1].decode()
        except UnicodeDecodeError:
            raise ProtocolError("xattr pair is not UTF-8", opcode=opcode) from None
        pairs.append((key, value))
        pos = pair_end
    return tuple(pairs), data[end:]


# --- snappy ----------------------------------------------------------------------------------


def compress_value(data: bytes) -> bytes:
    """Snappy raw-format compression (what datatype SNAPPY means)."""
    return bytes(cramjam.snappy.compress_raw(data))


def _varint_preamble(data: bytes, opcode: int | None) -> int:
    claimed = 0
    shift = 0
    for pos in range(min(len(data), 5)):
        byte = data[pos]
        claimed |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return claimed
        shift += 7
    raise ProtocolError("bad snappy value: truncated length preamble", opcode=opcode)


def decompress_value(
    data: bytes, *, max_size: int = DEFAULT_MAX_VALUE_SIZE, opcode: int | None = None
) -> bytes:
    """Snappy raw-format decompression, refusing to inflate beyond `max_size` bytes."""
    return bytes(decompress_value_buffer(data, max_size=max_size, opcode=opcode))


def decompress_value_buffer(
    data: bytes, *, max_size: int = DEFAULT_MAX_VALUE_SIZE, opcode: int | None = None
) -> cramjam.Buffer:
    """`decompress_value` without the copy into `bytes` (for Arrow, which copies anyway)."""
    # The raw format starts with the uncompressed length (varint): check it before the
    # library allocates that much. One and two bytes (up to 16 KiB) are read without a loop.
    if len(data) >= 2 and not data[1] & 0x80:
        claimed = data[0] if data[0] < 0x80 else (data[0] & 0x7F) | data[1] << 7
    else:
        claimed = _varint_preamble(data, opcode)
    if claimed > max_size:
        raise ProtocolError(
            f"snappy value inflates to {claimed} bytes, limit {max_size}", opcode=opcode
        )
    try:
        return cramjam.snappy.decompress_raw(data)
    except cramjam.DecompressionError as exc:
        raise ProtocolError(f"bad snappy value: {exc}", opcode=opcode) from None


# --- whole values ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DocumentValue:
    """A value as the layers above see it: body without xattrs, decompressed."""

    is_json: bool
    body: bytes
    xattrs: Xattrs = ()


@dataclass(frozen=True, slots=True)
class EncodedValue:
    """A value ready for the wire with the datatype that describes it."""

    datatype: int
    raw: bytes


def decode_value(
    datatype: int,
    raw: bytes,
    *,
    max_size: int = DEFAULT_MAX_VALUE_SIZE,
    opcode: int | None = None,
) -> DocumentValue:
    """Turn a (datatype, wire value) pair into body, is_json and xattrs."""
    if datatype & _UNKNOWN_DATATYPE_BITS:
        raise ProtocolError(f"unknown datatype bits 0x{datatype:02x}", opcode=opcode)
    if datatype & _SNAPPY:
        raw = decompress_value(raw, max_size=max_size, opcode=opcode)
    xattrs: Xattrs = ()
    if datatype & _XATTR:
        xattrs, raw = decode_xattrs(raw, opcode=opcode)
    return DocumentValue(bool(datatype & _JSON), raw, xattrs)


def encode_value(
    body: bytes,
    *,
    is_json: bool,
    xattrs: Sequence[tuple[str, str]] = (),
    include_xattrs: bool = True,
    compress: bool = False,
) -> EncodedValue:
    """Build the wire value and datatype; xattrs go first when included, snappy covers all."""
    datatype = _JSON if is_json else 0
    raw = body
    if xattrs and include_xattrs:
        raw = encode_xattrs(xattrs) + body
        datatype |= _XATTR
    if compress:
        raw = compress_value(raw)
        datatype |= _SNAPPY
    return EncodedValue(datatype, raw)
