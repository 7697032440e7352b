"""Measurement 1: the producer's serve rate alone (a client that only counts bytes)."""

from __future__ import annotations

from dataclasses import dataclass

from replicator.sim.serve_bench import measure_serve_rate


@dataclass(frozen=True, slots=True)
class ServeResult:
    """A backfill of every vbucket drained by a counting client; the producer ran apart."""

    messages: int
    bytes: int
    seconds: float
    messages_per_second: float
    megabytes_per_second: float


def measure_serve(docs: int, doc_size: int, vbuckets: int) -> ServeResult:
    """Load `docs` documents into a simulator process and time a counting client draining it."""
    rate = measure_serve_rate(docs, doc_size, vbuckets=vbuckets, separate_process=True)
    return ServeResult(
        messages=rate.messages,
        bytes=rate.bytes,
        seconds=rate.seconds,
        messages_per_second=rate.messages_per_second,
        megabytes_per_second=rate.megabytes_per_second,
    )
