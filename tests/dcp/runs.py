"""Typed events shaped as a connection hands them up: data messages in DocumentChanges runs."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from replicator.dcp.protocol.codec import encode_dcp_message
from replicator.dcp.protocol.columnar import DocumentColumns, DocumentRun
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures
from replicator.dcp.protocol.events import (
    MUTATION_OPCODE,
    Deletion,
    DocumentChanges,
    Expiration,
    Mutation,
    RunSummary,
)
from replicator.dcp.protocol.frame import FrameReader

WIRE_FEATURES = ConnectionFeatures(collections=True, delete_times=True)


def summarised_alone(run: DocumentChanges) -> RunSummary:
    """The run's summary computed from its own rows (the reader computes it read-wide)."""
    columns = run.columns
    seqnos = columns.column("by_seqno").to_pylist()
    data_bytes = sum(len(v) for name in ("key", "value") for v in columns.column(name).to_pylist())
    return RunSummary(
        first_seqno=seqnos[0],
        last_seqno=seqnos[-1],
        low_seqno=min(seqnos),
        high_seqno=max(seqnos),
        ascending=all(a < b for a, b in itertools.pairwise(seqnos)),
        mutations=columns.column("opcode").to_pylist().count(MUTATION_OPCODE),
        data_bytes=data_bytes,
    )


def read_runs(messages: Iterable[Mutation | Deletion | Expiration]) -> list[DocumentChanges]:
    """The messages through the wire encoding and the columnar reader, as one read."""
    raw = b"".join(encode_dcp_message(m, opaque=1, features=WIRE_FEATURES) for m in messages)
    columns = DocumentColumns(WIRE_FEATURES)
    entries: list[object] = list(FrameReader(sink=columns).feed(raw))
    columns.finish()
    return [e.changes for e in entries if isinstance(e, DocumentRun) and e.changes is not None]


def as_runs(items: Iterable[object]) -> list[object]:
    """Consecutive data messages become runs (one per vbucket); other events stay in place."""
    shaped: list[object] = []
    pending: list[Mutation | Deletion | Expiration] = []
    for item in items:
        if isinstance(item, Mutation | Deletion | Expiration):
            pending.append(item)
            continue
        shaped.extend(read_runs(pending))
        pending.clear()
        shaped.append(item)
    shaped.extend(read_runs(pending))
    return shaped
