"""Key and value encodings: LEB128 collection ids, xattr sections, snappy, datatypes."""

from __future__ import annotations

import struct

import cramjam
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicator.dcp.protocol.opcodes import Datatype
from replicator.dcp.protocol.values import (
    MAX_COLLECTION_ID,
    DocumentValue,
    compress_value,
    decode_leb128,
    decode_value,
    decode_xattrs,
    decompress_value,
    encode_leb128,
    encode_value,
    encode_xattrs,
    join_collection_key,
    split_collection_key,
)
from replicator.errors import ProtocolError

xattr_text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]))
xattr_pairs = st.lists(st.tuples(xattr_text.filter(bool), xattr_text), max_size=5).map(tuple)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (8, "08"),
        (127, "7f"),
        (128, "8001"),
        (300, "ac02"),
        (0x3FFF, "ff7f"),
        (0x4000, "808001"),
        (MAX_COLLECTION_ID, "ffffffff0f"),
    ],
)
def test_leb128_known_encodings(value: int, encoded: str) -> None:
    assert encode_leb128(value).hex() == encoded
    assert decode_leb128(bytes.fromhex(encoded)) == (value, len(encoded) // 2)


@given(st.integers(0, MAX_COLLECTION_ID), st.binary(max_size=8))
def test_leb128_round_trip_leaves_the_rest(value: int, rest: bytes) -> None:
    encoded = encode_leb128(value)
    assert decode_leb128(encoded + rest) == (value, len(encoded))
    assert split_collection_key(join_collection_key(value, rest)) == (value, rest)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "truncated"),
        (b"\x80", "truncated"),
        (b"\xff\xff", "truncated"),
        (b"\x80\x80\x80\x80\x80\x01", "longer than 5"),
        (b"\xff\xff\xff\xff\x1f", "exceeds u32"),
        (b"\x80\x00", "shortest form"),
        (b"\x81\x80\x00", "shortest form"),
    ],
)
def test_leb128_rejects_malformed_input(data: bytes, problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem) as caught:
        decode_leb128(data, opcode=0x57)
    assert caught.value.opcode == 0x57


def test_leb128_encode_rejects_values_beyond_u32() -> None:
    with pytest.raises(ValueError, match="u32"):
        encode_leb128(MAX_COLLECTION_ID + 1)
    with pytest.raises(ValueError, match="u32"):
        encode_leb128(-1)


def test_split_collection_key_multibyte_id() -> None:
    assert split_collection_key(b"\xac\x02doc") == (300, b"doc")
    with pytest.raises(ProtocolError, match="truncated"):
        split_collection_key(b"\x80")


def test_xattr_section_layout() -> None:
    section = encode_xattrs([("a", "1"), ("bc", '"x"')])
    pair1 = b"a\x001\x00"
    pair2 = b'bc\x00"x"\x00'
    expected_body = struct.pack(">I", 4) + pair1 + struct.pack(">I", 7) + pair2
    assert section == struct.pack(">I", len(expected_body)) + expected_body


@given(xattr_pairs, st.binary(max_size=64))
def test_xattrs_round_trip(pairs: tuple[tuple[str, str], ...], body: bytes) -> None:
    assert decode_xattrs(encode_xattrs(pairs) + body) == (pairs, body)


def test_empty_xattr_section() -> None:
    assert decode_xattrs(b"\x00\x00\x00\x00body") == ((), b"body")


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"\x00\x00\x00", "no room for its length"),
        (b"\x00\x00\x00\x10abc", "claims 16 bytes"),
        (b"\x00\x00\x00\x02\x00\x00", "pair length truncated"),
        (b"\x00\x00\x00\x08\x00\x00\x00\x09a\x00b\x00", "overruns"),
        (b"\x00\x00\x00\x08\x00\x00\x00\x04ab\x00c", "key NUL value NUL"),
        (b"\x00\x00\x00\x08\x00\x00\x00\x04\x00ab\x00", "key NUL value NUL"),
        (b"\x00\x00\x00\x09\x00\x00\x00\x05a\x00b\x00\x00", "key NUL value NUL"),
        (b"\x00\x00\x00\x08\x00\x00\x00\x04\xff\x00b\x00", "not UTF-8"),
    ],
)
def test_malformed_xattr_sections_raise(data: bytes, problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem):
        decode_xattrs(data, opcode=0x57)


def test_encode_xattrs_rejects_what_the_format_cannot_hold() -> None:
    with pytest.raises(ValueError, match="empty"):
        encode_xattrs([("", "v")])
    with pytest.raises(ValueError, match="NUL"):
        encode_xattrs([("k", "a\x00b")])


@given(st.binary(max_size=4096))
def test_snappy_round_trip(data: bytes) -> None:
    assert decompress_value(compress_value(data)) == data


def test_snappy_is_the_raw_format() -> None:
    data = b"abc" * 100
    assert compress_value(data) == bytes(cramjam.snappy.compress_raw(data))
    assert compress_value(data)[:2] == encode_leb128(300)  # raw format: length preamble


def test_bad_snappy_raises_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="bad snappy") as caught:
        decompress_value(b"\x0a\xff\xff\xff", opcode=0x57)
    assert caught.value.opcode == 0x57
    with pytest.raises(ProtocolError, match="bad snappy"):
        decompress_value(b"")
    with pytest.raises(ProtocolError, match="bad snappy"):
        decompress_value(b"\xff\xff\xff\xff\xff\xff")


def test_snappy_inflation_beyond_limit_is_refused_before_decompressing() -> None:
    data = compress_value(b"x" * 1000)
    assert decompress_value(data, max_size=1000) == b"x" * 1000
    with pytest.raises(ProtocolError, match="inflates to 1000 bytes, limit 999"):
        decompress_value(data, max_size=999)
    hostile = b"\xff\xff\xff\xff\x0f" + b"\x00" * 8  # claims 4 GiB
    with pytest.raises(ProtocolError, match="inflates"):
        decompress_value(hostile)


@given(
    st.binary(max_size=512),
    st.booleans(),
    xattr_pairs,
    st.booleans(),
)
def test_value_round_trip(
    body: bytes, is_json: bool, xattrs: tuple[tuple[str, str], ...], compress: bool
) -> None:
    encoded = encode_value(body, is_json=is_json, xattrs=xattrs, compress=compress)
    assert bool(encoded.datatype & Datatype.JSON) == is_json
    assert bool(encoded.datatype & Datatype.XATTR) == bool(xattrs)
    assert bool(encoded.datatype & Datatype.SNAPPY) == compress
    assert decode_value(encoded.datatype, encoded.raw) == DocumentValue(is_json, body, xattrs)


def test_snappy_covers_the_xattr_section_too() -> None:
    encoded = encode_value(b"{}", is_json=True, xattrs=[("k", "v")], compress=True)
    assert encoded.datatype == Datatype.JSON | Datatype.SNAPPY | Datatype.XATTR
    assert decompress_value(encoded.raw) == encode_xattrs([("k", "v")]) + b"{}"


def test_excluded_xattrs_are_not_encoded() -> None:
    encoded = encode_value(b"{}", is_json=True, xattrs=[("k", "v")], include_xattrs=False)
    assert encoded.datatype == Datatype.JSON
    assert encoded.raw == b"{}"


def test_unknown_datatype_bits_raise() -> None:
    with pytest.raises(ProtocolError, match="unknown datatype bits 0x09"):
        decode_value(0x09, b"{}", opcode=0x57)
