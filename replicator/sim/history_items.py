"""What a vbucket's history holds and what is written into it: the item types, their dedup
identity and retention size, and the document writes a bucket hands its vbuckets."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from replicator.dcp.protocol.events import Deletion, Expiration, Mutation, SystemEvent

HistoryItem = Mutation | Deletion | Expiration | SystemEvent
"""An item of a vbucket's history: what a stream serves, in the events' own types."""

ItemIdentity = tuple[int, bytes]
"""What deduplication groups by: (collection id, key) for documents; system events use
negative namespaces so that a collection's drop replaces its creation."""

_COLLECTION_EVENTS = -1
_SCOPE_EVENTS = -2

DocumentItem = Mutation | Deletion | Expiration
"""A revision of a document (what `VBucket.history_revisions` lists)."""


class DocumentNotFoundError(LookupError):
    """A delete, touch or expire named a document that does not exist (status 0x01)."""

    def __init__(self, vbucket: int, collection_id: int, key: bytes) -> None:
        super().__init__(
            f"vbucket {vbucket}: no document {key!r} in collection 0x{collection_id:x}"
        )
        self.vbucket = vbucket
        self.collection_id = collection_id
        self.key = key


class WriteKind(enum.Enum):
    UPSERT = "upsert"
    DELETE = "delete"
    TOUCH = "touch"
    EXPIRE = "expire"


@dataclass(frozen=True, slots=True)
class DocumentWrite:
    """One document change for `VBucket.apply_writes`; the bucket builds these from its ops.

    TOUCH keeps the body and sets `expiry`; EXPIRE writes an expiration now, as a read of an
    expired document or the expiry pager would.
    """

    kind: WriteKind
    collection_id: int
    key: bytes
    value: bytes = b""
    is_json: bool = True
    flags: int = 0
    expiry: int = 0
    xattrs: tuple[tuple[str, str], ...] = ()


def history_item_size(item: HistoryItem) -> int:
    """What an item counts against a history retention by bytes: its key, value and xattrs
    (for a system event, its name), in bytes."""
    if isinstance(item, SystemEvent):
        return len(item.name.encode())
    size = len(item.key)
    if isinstance(item, Expiration):
        return size
    if isinstance(item, Mutation):
        size += len(item.value)
    for name, value in item.xattrs:
        size += len(name.encode()) + len(value.encode())
    return size


def expiration_as_deletion(expiration: Expiration) -> Deletion:
    """What a consumer without the expiry opcode receives for an expiration."""
    return Deletion(
        vbucket=expiration.vbucket,
        by_seqno=expiration.by_seqno,
        rev_seqno=expiration.rev_seqno,
        cas=expiration.cas,
        collection_id=expiration.collection_id,
        key=expiration.key,
        delete_time=expiration.delete_time,
        stream_id=expiration.stream_id,
    )


def item_identity(item: HistoryItem) -> ItemIdentity:
    """The dedup key of a history item."""
    if isinstance(item, SystemEvent):
        if item.collection_id is not None:
            return (_COLLECTION_EVENTS, item.collection_id.to_bytes(4, "big"))
        return (_SCOPE_EVENTS, item.scope_id.to_bytes(4, "big"))
    return (item.collection_id, item.key)
