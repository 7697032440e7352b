"""Measurement 2: the protocol layer's drain rate: every message decoded, nothing kept.

`DcpClient` (connections, codec, stream state, flow control) streams every vbucket's backfill
from a producer in its own process; the events are counted and acknowledged, not staged.
`measure_drain_side_by_side` alternates it with Couchbase's Java DCP client on the same
producer, the reference the goals compare against.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from replicator.bench.reference_drain import (
    DocumentRates,
    ReferenceDrain,
    ReferenceUnavailable,
    build_reference_client,
    measure_reference_drain,
)
from replicator.dcp.cluster.client import DcpClient
from replicator.dcp.protocol.decode_bench import measure_decode_rate
from replicator.dcp.protocol.events import (
    DocumentChanges,
    Mutation,
    StreamEnd,
    StreamEndReason,
    StreamOpened,
)
from replicator.dcp.transport.auth import Credentials
from replicator.errors import ProtocolError
from replicator.model.positions import VbucketPosition


@dataclass(frozen=True, slots=True)
class DrainResult(DocumentRates):
    """What the protocol layer handed up while draining the backfills.

    `messages` counts every DCP message decoded into an event (markers, documents, stream
    ends); `cpu_seconds` is this process's CPU time (its I/O threads included) over the drain.
    `codec_messages_per_cpu_second` is the codec alone on pre-encoded 1 KiB mutations. Over
    several `rounds` the counts and times are sums. `reference` is the Java client's drain of the
    same producer over as many rounds, alternating with these; `reference_unavailable` says why
    there is none.
    """

    messages: int
    documents: int
    bytes: int
    seconds: float
    cpu_seconds: float
    messages_per_second: float
    megabytes_per_second: float
    codec_messages_per_cpu_second: float
    rounds: int = 1
    reference: ReferenceDrain | None = None
    reference_unavailable: str | None = None


log = logging.getLogger(__name__)


def measure_drain_side_by_side(
    connection_string: str,
    credentials: Credentials,
    *,
    expected_documents: int,
    rounds: int = 2,
    timeout_s: float = 900.0,
    build_reference: Callable[[], str] = build_reference_client,
) -> DrainResult:
    """`measure_drain` and the Java client's drain in turn, `rounds` times each, summed.

    Alternating on one producer lets both see the same machine load. When the reference cannot
    run (no Java or Maven, a failed build or drain), the Python figures stand alone and
    `reference_unavailable` says why.
    """
    try:
        class_path: str | None = build_reference()
        unavailable = None
    except ReferenceUnavailable as exc:
        class_path, unavailable = None, f"not run: {exc}"
    ours: list[DrainResult] = []
    theirs: list[ReferenceDrain] = []
    for _ in range(rounds):
        ours.append(
            measure_drain(
                connection_string,
                credentials,
                expected_documents=expected_documents,
                timeout_s=timeout_s,
                codec_messages=0,
            )
        )
        if class_path is None:
            continue
        try:
            reference = measure_reference_drain(
                class_path, connection_string, credentials, timeout_s=timeout_s
            )
        except ReferenceUnavailable as exc:
            log.warning("reference drain failed: %s", exc)
            class_path, unavailable = None, str(exc)
            continue
        if reference.documents < expected_documents:
            class_path = None
            unavailable = (
                f"the Java drain got {reference.documents:,} documents, "
                f"expected {expected_documents:,}"
            )
            continue
        theirs.append(reference)
    summed = _sum_rounds(ours)
    return dataclasses.replace(
        summed,
        codec_messages_per_cpu_second=measure_decode_rate(200_000, 1024),
        reference=_sum_references(theirs) if unavailable is None and theirs else None,
        reference_unavailable=unavailable,
    )


def _sum_rounds(results: list[DrainResult]) -> DrainResult:
    seconds = sum(r.seconds for r in results)
    messages = sum(r.messages for r in results)
    received = sum(r.bytes for r in results)
    return DrainResult(
        messages=messages,
        documents=sum(r.documents for r in results),
        bytes=received,
        seconds=seconds,
        cpu_seconds=sum(r.cpu_seconds for r in results),
        messages_per_second=messages / seconds,
        megabytes_per_second=received / seconds / 1e6,
        codec_messages_per_cpu_second=0.0,
        rounds=len(results),
    )


def _sum_references(results: list[ReferenceDrain]) -> ReferenceDrain:
    return ReferenceDrain(
        client=results[0].client,
        messages=sum(r.messages for r in results),
        documents=sum(r.documents for r in results),
        bytes=sum(r.bytes for r in results),
        seconds=sum(r.seconds for r in results),
        cpu_seconds=sum(r.cpu_seconds for r in results),
    )


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
            for event in batch.events:  # data messages as columnar runs, as the stager takes them
                if isinstance(event, DocumentChanges):
                    messages += len(event)
                    documents += event.summary.mutations
                    continue
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
        codec_messages_per_cpu_second=(
            measure_decode_rate(codec_messages, 1024) if codec_messages else 0.0
        ),
    )
