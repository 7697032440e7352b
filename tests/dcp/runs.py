"""Typed events shaped as a connection hands them up: data messages in DocumentChanges runs."""

from __future__ import annotations

from collections.abc import Iterable

from replicator.dcp.codec import ConnectionFeatures, encode_dcp_message
from replicator.dcp.columnar import DocumentColumns, DocumentRun
from replicator.dcp.events import Deletion, DocumentChanges, Expiration, Mutation
from replicator.dcp.frame import FrameReader

WIRE_FEATURES = ConnectionFeatures(collections=True, delete_times=True)


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
