"""Measurement 2: the protocol layer's drain rate: every message decoded, nothing kept.

`DcpClient` (connections, codec, stream state, flow control) streams every vbucket's backfill
from a producer in its own process; the events are counted and acknowledged, not staged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from replicator.dcp.auth import Credentials
from replicator.dcp.client import DcpClient
from replicator.dcp.decode_bench import measure_decode_rate
from replicator.dcp.events import Mutation, StreamEnd, StreamEndReason, StreamOpened
from replicator.dcp.positions import VbucketPosition
from replicator.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What the protocol layer handed up while draining the backfills.

    `messages` counts every DCP message decoded into an event (markers, documents, stream
    ends); `cpu_seconds` is this process's CPU time (its I/O threads included) over the drain.
    `codec_messages_per_cpu_second` is the codec alone on pre-encoded 1 KiB mutations.
    """

    messages: int
    documents: int
    bytes: int
    seconds: float
    cpu_seconds: float
    messages_per_second: float
    megabytes_per_second: float
    codec_messages_per_cpu_second: float


def measure_drain(
    connection_string: str,
    credentials: Credentials,
    *,
    expected_documents: int,
    timeout_s: float = 900.0,
    codec_messages: int = 200_000,
) -> DrainResult:
    """Stream every vbucket from 0 to its high seqno through `DcpClient`, counting events.

    Raises ProtocolError when fewer than `expected_documents` mutations arrive or a stream ends
    other than OK (the figure would not be a full drain).
    """
    client = DcpClient(connection_string, credentials)
    try:
        highs = client.high_seqnos()
        wall_started, cpu_started = time.perf_counter(), time.process_time()
        for vbucket, high in sorted(highs.items()):
            client.open_stream(vbucket, VbucketPosition.beginning(vbucket), None, end=high)
        messages = documents = received = ended = 0
        deadline = time.monotonic() + timeout_s
        while ended < len(highs):
            if time.monotonic() > deadline:
                raise ProtocolError(f"drain incomplete after {timeout_s:.0f} s: {ended} streams")
            batch = client.poll(timeout=1.0)
            for event in batch:
                if isinstance(event, StreamOpened):
                    continue
                messages += 1
                if isinstance(event, Mutation):
                    documents += 1
                elif isinstance(event, StreamEnd):
                    if event.reason is not StreamEndReason.OK:
                        raise ProtocolError(
                            f"vbucket {event.vbucket} stream ended {event.reason.name}"
                        )
                    ended += 1
            received += batch.receipt.total_bytes
            client.acknowledge(batch)
        seconds = time.perf_counter() - wall_started
        cpu_seconds = time.process_time() - cpu_started
    finally:
        client.close()
    if documents < expected_documents:
        raise ProtocolError(f"drained {documents} documents, expected {expected_documents}")
    return DrainResult(
        messages=messages,
        documents=documents,
        bytes=received,
        seconds=seconds,
        cpu_seconds=cpu_seconds,
        messages_per_second=messages / seconds,
        megabytes_per_second=received / seconds / 1e6,
        codec_messages_per_cpu_second=measure_decode_rate(codec_messages, 1024),
    )
