"""The serve-rate helper counts what a backfill really sends (its speed is not asserted)."""

from __future__ import annotations

from replicator.sim.serve_bench import measure_serve_rate


def test_measure_serve_rate_drains_every_vbucket() -> None:
    docs, size, vbuckets = 2000, 256, 8
    rate = measure_serve_rate(docs, size, vbuckets=vbuckets, snappy=True, window=64 * 1024)
    # Every document, and per vbucket at least a marker and a STREAM_END.
    assert rate.messages >= docs + 2 * vbuckets
    assert rate.bytes > docs * 100  # snappy shrinks the padded bodies, never to nothing
    assert rate.seconds > 0 and rate.messages_per_second > 0
