"""Fuzz: hostile bytes through FrameReader + every decoder raise ProtocolError or decode.

No other exception type may escape (struct.error, UnicodeDecodeError, cramjam errors, ...).
"""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replicator.dcp.protocol.codec import encode_dcp_message, encode_request
from replicator.dcp.protocol.frame import HEADER_SIZE, FrameReader
from replicator.dcp.protocol.fuzz import decode_everything, feed_chunks, fuzz_frames
from replicator.dcp.protocol.pushes import encode_server_request
from replicator.dcp.protocol.responses import Response, encode_response
from tests.dcp import strategies as gen

FUZZ = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(st.lists(st.binary(max_size=120), max_size=4))
def test_random_bytes(chunks: list[bytes]) -> None:
    feed_chunks(chunks)


@FUZZ
@given(st.binary(min_size=HEADER_SIZE - 4, max_size=200), st.sampled_from([0x80, 0x81, 0x08, 0x82]))
def test_random_bodies_behind_a_known_magic(data: bytes, magic: int) -> None:
    feed_chunks([bytes((magic,)) + data])


@st.composite
def _valid_wire(draw: st.DrawFn) -> bytes:
    negotiated = draw(gen.features)
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return encode_request(draw(gen.client_requests))
    if kind == 1:
        return encode_response(draw(gen.responses))
    if kind == 2:
        return encode_server_request(draw(gen.clustermap_notifications))
    message = draw(gen.producer_messages(negotiated))
    return encode_dcp_message(message, features=negotiated, compress=draw(st.booleans()))


@st.composite
def _mutated_wire(draw: st.DrawFn) -> bytes:
    wire = bytearray(draw(_valid_wire()))
    for _ in range(draw(st.integers(1, 3))):
        mutation = draw(st.sampled_from(["flip", "truncate", "length", "byte", "splice"]))
        if mutation == "flip" and wire:
            pos = draw(st.integers(0, len(wire) - 1))
            wire[pos] ^= 1 << draw(st.integers(0, 7))
        elif mutation == "truncate":
            del wire[draw(st.integers(0, len(wire))) :]
        elif mutation == "length" and len(wire) >= HEADER_SIZE:
            field = draw(st.sampled_from(["key", "extras", "body", "framing"]))
            if field == "key":
                wire[2:4] = struct.pack(">H", draw(st.integers(0, 0xFFFF)))
            elif field == "extras":
                wire[4] = draw(st.integers(0, 0xFF))
            elif field == "body":
                body = len(wire) - HEADER_SIZE + draw(st.integers(-40, 40))
                wire[8:12] = struct.pack(">I", max(body, 0))
            else:
                wire[2] = draw(st.integers(0, 0xFF))
        elif mutation == "byte" and len(wire) > HEADER_SIZE:
            pos = draw(st.integers(HEADER_SIZE, len(wire) - 1))
            wire[pos] = draw(st.integers(0, 0xFF))
        elif mutation == "splice":
            pos = draw(st.integers(0, len(wire)))
            wire[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return bytes(wire)


@FUZZ
@given(_mutated_wire(), st.integers(1, 64))
def test_mutated_valid_frames(wire: bytes, piece: int) -> None:
    feed_chunks([wire[i : i + piece] for i in range(0, len(wire), piece)])


@settings(FUZZ, max_examples=120)
@given(st.lists(_mutated_wire(), min_size=2, max_size=4))
def test_mutated_frames_back_to_back(wires: list[bytes]) -> None:
    feed_chunks([b"".join(wires)])


def test_fuzz_harness_sees_decoding_succeed_on_valid_frames() -> None:
    # Guard against a harness that would pass because nothing ever decodes.
    wire = encode_response(Response(0x53, 0x23, 1, value=b"\x00" * 8))
    (frame,) = FrameReader().feed(wire)
    assert decode_everything(frame) == 3


def test_seeded_fuzz_feeds_thousands_of_corrupted_frames_without_a_stray_exception() -> None:
    report = fuzz_frames(3_000, seed=20)

    assert report.inputs == 3_000
    # Guards against a fuzzer whose inputs never reach the decoders or never break them.
    assert report.decoded > 100
    assert report.rejected > 1_000


def test_seeded_fuzz_is_reproducible() -> None:
    assert fuzz_frames(300, seed=7) == fuzz_frames(300, seed=7)
    assert fuzz_frames(300, seed=7) != fuzz_frames(300, seed=8)
