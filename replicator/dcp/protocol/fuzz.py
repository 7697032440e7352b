"""Seeded codec fuzzing: hostile bytes through FrameReader, the columnar reader and every decoder.

The only exception a decoder may raise on bad input is ProtocolError; anything else
(struct.error, UnicodeDecodeError, a snappy error, IndexError, ...) escapes `fuzz_frames` and
fails the caller. The property tests use `decode_everything` on frames hypothesis draws; the
soak job calls `fuzz_frames(100_000, seed)` for a long, reproducible run without hypothesis.
"""

from __future__ import annotations

import contextlib
import functools
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass

from replicator.dcp.protocol.codec import (
    ProducerMessage,
    decode_client_frame,
    decode_server_frame,
    encode_dcp_message,
)
from replicator.dcp.protocol.columnar import DocumentColumns, DocumentRun
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures, DcpNoop
from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    SeqnoAdvanced,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
)
from replicator.dcp.protocol.frame import HEADER_SIZE, Frame, FrameReader
from replicator.dcp.protocol.responses import (
    Response,
    encode_response,
    failover_log_of,
    hello_features_of,
    not_my_vbucket_config_of,
    rollback_seqno_of,
    sasl_mechanisms_of,
    vbucket_seqnos_of,
)
from replicator.errors import ProtocolError

MAX_BODY = 4096
"""The readers' body limit: big enough for every generated frame, small enough to trip."""

FEATURE_SETS = (
    ConnectionFeatures(),
    ConnectionFeatures(collections=True, delete_times=True),
)
_READERS = (
    failover_log_of,
    rollback_seqno_of,
    vbucket_seqnos_of,
    hello_features_of,
    not_my_vbucket_config_of,
    sasl_mechanisms_of,
)
_MUTATIONS = ("flip", "truncate", "length", "byte", "splice")


@dataclass(frozen=True, slots=True)
class FuzzReport:
    """What a fuzz run fed: frames, and how many decoded or were rejected with ProtocolError."""

    inputs: int
    frames: int
    decoded: int
    rejected: int


def decode_everything(frame: Frame) -> int:
    """Run every decoder that could see `frame`; returns how many accepted it.

    ProtocolError counts as a rejection; any other exception propagates.
    """
    decoded = 0
    attempts: list[Callable[[], object]] = [
        functools.partial(decode_server_frame, frame, features) for features in FEATURE_SETS
    ]
    attempts.append(functools.partial(decode_client_frame, frame))
    for attempt in attempts:
        try:
            message = attempt()
        except ProtocolError:
            continue
        decoded += 1
        if isinstance(message, Response):
            for reader in _READERS:
                with contextlib.suppress(ProtocolError):
                    reader(message)
    return decoded


def feed_columnar(chunks: list[bytes]) -> None:
    """Feed `chunks` to a columnar reader per feature set (as a connection reads), building
    each read's columns and taking its runs apart: only ProtocolError may escape."""
    for features in FEATURE_SETS:
        columns = DocumentColumns(features)
        reader = FrameReader(max_body_size=MAX_BODY, sink=columns)
        try:
            for chunk in chunks:
                entries: list[object] = list(reader.feed(chunk))
                columns.finish()
                for entry in entries:
                    if isinstance(entry, DocumentRun) and entry.changes is not None:
                        list(entry.changes.events())
                if reader.failure is not None:
                    break
        except ProtocolError as exc:
            if not str(exc):
                raise AssertionError("a ProtocolError must say what is wrong") from exc


def feed_chunks(chunks: list[bytes]) -> tuple[int, int, int]:
    """Feed `chunks` to one FrameReader and decode each frame: (frames, decoded, rejected).

    The same chunks go through the columnar reader too (`feed_columnar`)."""
    feed_columnar(chunks)
    reader = FrameReader(max_body_size=MAX_BODY)
    frames = decoded = rejected = 0
    try:
        for chunk in chunks:
            for frame in reader.feed(chunk):
                frames += 1
                accepted = decode_everything(frame)
                decoded += accepted > 0
                rejected += accepted == 0
        reader.finish()
    except ProtocolError as exc:
        if not str(exc):
            raise AssertionError("a ProtocolError must say what is wrong") from exc
        rejected += 1
    return frames, decoded, rejected


def _producer_message(rng: random.Random, features: ConnectionFeatures) -> ProducerMessage:
    vbucket = rng.randrange(1024)
    seqno = rng.getrandbits(rng.choice((8, 32, 64)))
    collection = rng.getrandbits(32) if features.collections else 0
    key = rng.randbytes(rng.randint(1, 40))
    kind = rng.randrange(7)
    if kind == 0:
        return Mutation(
            vbucket, seqno, rng.getrandbits(64), rng.getrandbits(64), rng.getrandbits(32),
            rng.getrandbits(32), rng.getrandbits(32), collection, key,
            rng.randbytes(rng.randint(0, 200)), rng.random() < 0.5,
            xattrs=(("_sync", '{"rev":1}'),) if rng.random() < 0.3 else (),
        )
    if kind == 1:
        delete_time = rng.getrandbits(32) if features.delete_times else 0
        return Deletion(vbucket, seqno, rng.getrandbits(64), rng.getrandbits(64), collection, key,
                        delete_time)
    if kind == 2:
        return Expiration(vbucket, seqno, rng.getrandbits(64), rng.getrandbits(64), collection,
                          key, rng.getrandbits(32))
    if kind == 3:
        end = seqno + rng.randrange(1000)
        flags = SnapshotFlags(rng.choice((1, 2, 0x21, 0x22)))
        if rng.random() < 0.5:
            return SnapshotMarker(vbucket, seqno, end, flags)
        return SnapshotMarker(vbucket, seqno, end, flags, max_visible_seqno=end,
                              high_completed_seqno=seqno)
    if kind == 4:
        return SeqnoAdvanced(vbucket, seqno)
    if kind == 5:
        return StreamEnd(vbucket, rng.choice(list(StreamEndReason)))
    return DcpNoop(rng.getrandbits(32))


def valid_wire(rng: random.Random) -> bytes:
    """One well-formed frame: a producer message (maybe snappy) or a response."""
    if rng.random() < 0.25:
        return encode_response(
            Response(
                rng.randrange(256), rng.choice((0, 0x23, 0x07, 0x22, rng.randrange(65536))),
                rng.getrandbits(32), value=rng.randbytes(rng.randint(0, 64)),
                extras=rng.randbytes(rng.choice((0, 0, 4, 8))),
            )
        )
    features = rng.choice(FEATURE_SETS)
    return encode_dcp_message(
        _producer_message(rng, features), features=features, compress=rng.random() < 0.3
    )


def mutated_wire(rng: random.Random) -> bytes:
    """A valid frame with one to three corruptions (bit flips, truncation, bad lengths, ...)."""
    wire = bytearray(valid_wire(rng))
    for _ in range(rng.randint(1, 3)):
        mutation = rng.choice(_MUTATIONS)
        if mutation == "flip" and wire:
            wire[rng.randrange(len(wire))] ^= 1 << rng.randrange(8)
        elif mutation == "truncate":
            del wire[rng.randint(0, len(wire)) :]
        elif mutation == "length" and len(wire) >= HEADER_SIZE:
            field = rng.randrange(4)
            if field == 0:
                wire[2:4] = struct.pack(">H", rng.randrange(65536))
            elif field == 1:
                wire[4] = rng.randrange(256)
            elif field == 2:
                body = len(wire) - HEADER_SIZE + rng.randint(-40, 40)
                wire[8:12] = struct.pack(">I", max(body, 0))
            else:
                wire[2] = rng.randrange(256)
        elif mutation == "byte" and len(wire) > HEADER_SIZE:
            wire[rng.randrange(HEADER_SIZE, len(wire))] = rng.randrange(256)
        elif mutation == "splice":
            at = rng.randint(0, len(wire))
            wire[at:at] = rng.randbytes(rng.randint(1, 8))
    return bytes(wire)


def fuzz_frames(count: int, seed: int) -> FuzzReport:
    """Feed `count` fuzzed inputs (mutated frames, sometimes back to back, in random pieces,
    and raw random bytes); raises whatever non-ProtocolError a decoder lets escape."""
    if count < 0:
        raise ValueError(f"count must not be negative, got {count}")
    rng = random.Random(seed)
    frames = decoded = rejected = 0
    for _ in range(count):
        draw = rng.random()
        if draw < 0.1:
            wire = rng.randbytes(rng.randint(0, 120))
        elif draw < 0.25:
            wire = b"".join(mutated_wire(rng) for _ in range(rng.randint(2, 4)))
        else:
            wire = mutated_wire(rng)
        piece = rng.randint(1, 64)
        counts = feed_chunks([wire[i : i + piece] for i in range(0, len(wire), piece)])
        frames += counts[0]
        decoded += counts[1]
        rejected += counts[2]
    return FuzzReport(count, frames, decoded, rejected)
