"""Framing: header layout, flexible framing extras, and the incremental FrameReader."""

from __future__ import annotations

import struct

import pytest

from replicator.dcp.protocol.frame import (
    DEFAULT_MAX_BODY_SIZE,
    HEADER_SIZE,
    Frame,
    FrameInfo,
    FrameReader,
    decode_frame_infos,
    encode_frame,
    encode_frame_infos,
    parse_frame,
    stream_id_frame_info,
    stream_id_of,
)
from replicator.dcp.protocol.opcodes import Magic
from replicator.errors import ProtocolError


def _frame(**overrides: object) -> Frame:
    fields: dict[str, object] = {
        "magic": Magic.REQUEST,
        "opcode": 0x57,
        "datatype": 1,
        "vbucket_or_status": 874,
        "opaque": 0xDEADBEEF,
        "cas": 0x15C7C2B955AB0000,
        "framing_extras": b"",
        "extras": b"E" * 31,
        "key": b"\x08doc",
        "value": b'{"a":1}',
    }
    fields.update(overrides)
    return Frame(**fields)  # type: ignore[arg-type]


def test_classic_header_layout() -> None:
    wire = _frame().encode()
    magic, opcode, key_len, ext_len, datatype, vb, body_len, opaque, cas = struct.unpack(
        ">BBHBBHIIQ", wire[:HEADER_SIZE]
    )
    assert (magic, opcode, key_len, ext_len, datatype, vb) == (0x80, 0x57, 4, 31, 1, 874)
    assert body_len == 31 + 4 + 7 == len(wire) - HEADER_SIZE
    assert (opaque, cas) == (0xDEADBEEF, 0x15C7C2B955AB0000)
    assert wire[HEADER_SIZE:] == b"E" * 31 + b"\x08doc" + b'{"a":1}'


def test_flexible_header_puts_framing_length_in_byte_2_and_key_length_in_byte_3() -> None:
    frame = _frame(magic=Magic.FLEX_REQUEST, framing_extras=stream_id_frame_info(7))
    wire = frame.encode()
    assert wire[0] == 0x08
    assert wire[2] == 3 and wire[3] == 4
    assert struct.unpack(">I", wire[8:12])[0] == 3 + 31 + 4 + 7
    assert wire[HEADER_SIZE : HEADER_SIZE + 3] == b"\x22\x00\x07"
    decoded = parse_frame(wire)
    assert decoded == frame
    assert decoded.stream_id == 7
    assert decoded.is_flexible and decoded.is_request and not decoded.is_response


def test_frame_size_counts_header_and_body() -> None:
    frame = _frame(magic=Magic.FLEX_REQUEST, framing_extras=b"\x00")
    assert frame.size == len(frame.encode()) == HEADER_SIZE + 1 + 31 + 4 + 7


def test_response_reads_status_from_bytes_6_7() -> None:
    wire = encode_frame(Magic.RESPONSE, 0x53, vbucket_or_status=0x23, value=b"\x00" * 8)
    frame = parse_frame(wire)
    assert frame.status == 0x23 and frame.is_response and not frame.is_request


def test_encode_rejects_framing_extras_without_flexible_magic() -> None:
    with pytest.raises(ValueError, match="flexible magic"):
        encode_frame(Magic.REQUEST, 0x57, framing_extras=b"\x00")


def test_encode_rejects_long_key_with_flexible_framing() -> None:
    with pytest.raises(ValueError, match="255"):
        encode_frame(Magic.FLEX_REQUEST, 0x57, key=b"k" * 256)
    assert len(encode_frame(Magic.REQUEST, 0x57, key=b"k" * 256)) == HEADER_SIZE + 256


def test_encode_rejects_unknown_magic_and_out_of_range_fields() -> None:
    with pytest.raises(ValueError, match="magic"):
        encode_frame(0x42, 0x57)
    with pytest.raises(ValueError, match="out of range"):
        encode_frame(Magic.REQUEST, 0x57, vbucket_or_status=0x10000)


def test_frame_infos_round_trip_including_escaped_ids_and_lengths() -> None:
    infos = (
        FrameInfo(0, b""),
        FrameInfo(2, b"\x00\x09"),
        FrameInfo(14, b"x" * 14),
        FrameInfo(15, b"y" * 15),
        FrameInfo(40, b"z" * 200),
    )
    encoded = encode_frame_infos(infos)
    assert encoded[0] == 0x00
    assert encoded[1:4] == b"\x22\x00\x09"
    assert decode_frame_infos(encoded) == infos


@pytest.mark.parametrize(
    "framing",
    [b"\xf2", b"\x2f", b"\x23\x00\x01", b"\xff\x01"],
    ids=["escaped-id-cut", "escaped-len-cut", "data-short", "both-escapes-cut"],
)
def test_truncated_frame_infos_raise(framing: bytes) -> None:
    with pytest.raises(ProtocolError, match=r"framing extras|claims"):
        decode_frame_infos(framing, opcode=0x57)


def test_stream_id_found_after_other_frame_infos() -> None:
    framing = encode_frame_infos([FrameInfo(0, b""), FrameInfo(2, b"\x01\x02")])
    assert stream_id_of(framing) == 0x0102
    assert stream_id_of(encode_frame_infos([FrameInfo(0, b"")])) is None


def test_stream_id_frame_info_of_wrong_size_raises() -> None:
    with pytest.raises(ProtocolError, match="stream-id"):
        stream_id_of(b"\x21\x05", opcode=0x57)


def test_reader_yields_frames_fed_one_byte_at_a_time() -> None:
    frames = [_frame(opaque=i, value=b"v" * i) for i in range(5)]
    stream = b"".join(f.encode() for f in frames)
    reader = FrameReader()
    out: list[Frame] = []
    for i in range(len(stream)):
        out += reader.feed(stream[i : i + 1])
    assert out == frames
    assert reader.buffered_bytes == 0
    reader.finish()


def test_reader_yields_every_frame_of_one_feed_and_keeps_the_partial_rest() -> None:
    frames = [_frame(opaque=i) for i in range(3)]
    stream = b"".join(f.encode() for f in frames)
    reader = FrameReader()
    assert reader.feed(stream[:-5]) == frames[:2]
    assert reader.buffered_bytes == len(frames[2].encode()) - 5
    assert reader.feed(stream[-5:]) == frames[2:]


def test_reader_accepts_memoryview_and_bytearray() -> None:
    wire = _frame().encode()
    reader = FrameReader()
    assert reader.feed(memoryview(wire)[:10]) == []
    assert reader.feed(bytearray(wire[10:])) == [_frame()]


def test_large_frame_arriving_in_small_chunks() -> None:
    big = _frame(value=b"x" * 300_000)
    wire = big.encode()
    reader = FrameReader()
    out: list[Frame] = []
    for i in range(0, len(wire), 1000):
        out += reader.feed(wire[i : i + 1000])
    assert out == [big]


def test_bad_magic_raises_before_body_arrives() -> None:
    wire = bytearray(_frame().encode())
    wire[0] = 0x42
    with pytest.raises(ProtocolError, match="bad magic 0x42") as caught:
        FrameReader().feed(bytes(wire[:HEADER_SIZE]))
    assert caught.value.opcode == 0x57


def test_lengths_that_do_not_add_up_raise() -> None:
    header = struct.pack(">BBHBBHIIQ", 0x80, 0x57, 10, 31, 0, 0, 20, 0, 0)
    with pytest.raises(ProtocolError, match="do not add up"):
        FrameReader().feed(header)


def test_flexible_framing_length_counts_toward_the_body() -> None:
    # framing 3 + extras 20 + key 0 = 23 > body 22
    header = struct.pack(">BBBBBBHIIQ", 0x08, 0x56, 3, 0, 20, 0, 0, 22, 0, 0)
    with pytest.raises(ProtocolError, match="framing extras 3"):
        FrameReader().feed(header)


def test_body_beyond_default_cap_raises_without_waiting_for_it() -> None:
    header = struct.pack(">BBHBBHIIQ", 0x80, 0x57, 0, 0, 0, 0, DEFAULT_MAX_BODY_SIZE + 1, 0, 0)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        FrameReader().feed(header)
    hostile = struct.pack(">BBHBBHIIQ", 0x80, 0x57, 0, 0, 0, 0, 0xFFFFFFFF, 0, 0)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        FrameReader().feed(hostile)


def test_body_cap_is_configurable() -> None:
    wire = _frame(value=b"x" * 100).encode()
    body = len(wire) - HEADER_SIZE
    assert FrameReader(max_body_size=body).feed(wire) == [_frame(value=b"x" * 100)]
    with pytest.raises(ProtocolError, match=f"limit of {body - 1} bytes"):
        FrameReader(max_body_size=body - 1).feed(wire)


def test_reader_stays_failed_after_a_protocol_error() -> None:
    reader = FrameReader()
    with pytest.raises(ProtocolError):
        reader.feed(b"\x42" + b"\x00" * 23)
    with pytest.raises(ProtocolError, match="bad magic"):
        reader.feed(_frame().encode())


def test_finish_reports_a_frame_cut_short() -> None:
    reader = FrameReader()
    reader.feed(_frame().encode()[:30])
    with pytest.raises(ProtocolError, match="truncated frame") as caught:
        reader.finish()
    assert caught.value.opcode == 0x57


def test_parse_frame_rejects_truncated_and_trailing_input() -> None:
    wire = _frame().encode()
    with pytest.raises(ProtocolError, match="truncated"):
        parse_frame(wire[:-1])
    with pytest.raises(ProtocolError, match="truncated"):
        parse_frame(wire[:10])
    with pytest.raises(ProtocolError, match="follow the frame"):
        parse_frame(wire + b"\x80")
    with pytest.raises(ProtocolError, match="no frame"):
        parse_frame(b"")


def test_repr_shows_the_value_by_length_only() -> None:
    frame = parse_frame(encode_frame(Magic.REQUEST, 0x21, key=b"PLAIN", value=b"\x00u\x00hunter2"))
    text = repr(frame)
    assert "hunter2" not in text
    assert "value=<10 bytes>" in text and "key=b'PLAIN'" in text and "opcode=0x21" in text
