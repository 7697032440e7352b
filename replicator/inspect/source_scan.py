"""`replicator verify`'s source side: each vbucket streamed from 0 to its high seqno, reduced to
the last state of each document.

The stream goes through the same snapshot assembly and row conversion as replication (deletions
remove, expired mutations remove), so the same rules decide what a change means on both sides.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from replicator.dcp.protocol.events import (
    Deletion,
    DocumentChanges,
    Expiration,
    ItemEvent,
    Mutation,
    RollbackRequired,
    StreamEnd,
    StreamEndReason,
    StreamEvent,
    SystemEvent,
)
from replicator.errors import ProtocolError, ReplicatorError
from replicator.inspect.fingerprints import RowColumns
from replicator.model.aliases import DocumentKey
from replicator.model.positions import VbucketPosition
from replicator.staging.assembly import SnapshotAssembler
from replicator.staging.rows import DELETE, ChangeRowConverter

if TYPE_CHECKING:
    import pyarrow as pa

    from replicator.dcp.cluster.client import DcpClient

log = logging.getLogger(__name__)

MAX_STREAM_RESTARTS = 5


class VerifyInterrupted(ReplicatorError):
    """The source stream of a vbucket could not be read to its end."""


class SourceDocument(NamedTuple):
    """A document's last change in the source stream: live (fingerprint), deleted or expired."""

    seqno: int
    fingerprint: int | None
    expired: bool = False

    @property
    def live(self) -> bool:
        return self.fingerprint is not None


@dataclass
class SourceVbucketScan:
    """Reduces one vbucket's bounded stream to the last state of each document.

    Events go through SnapshotAssembler (ordering checks, snapshot completion) and items
    through ChangeRowConverter in chunks, so the same rules as replication decide what a change
    means. `feed` returns True once the stream ended OK.
    """

    vbucket: int
    converter: ChangeRowConverter
    chunk_rows: int = 4096
    documents: dict[DocumentKey, SourceDocument] = field(default_factory=dict)
    names: dict[int, tuple[str, str]] = field(default_factory=dict)
    restarts: int = 0

    def __post_init__(self) -> None:
        self._assembler = SnapshotAssembler(keep_items=False)
        self._chunk: list[ItemEvent | DocumentChanges] = []
        self._chunk_rows = 0

    def feed(self, event: StreamEvent) -> bool:
        """Take the next event of the vbucket's stream; True when the stream is complete."""
        if isinstance(event, RollbackRequired):
            raise ProtocolError(
                f"vbucket {self.vbucket}: the producer asked a stream from seqno 0 to roll back "
                f"to {event.rollback_seqno}"
            )
        if isinstance(event, StreamEnd) and event.reason is not StreamEndReason.OK:
            self._restart(event.reason)
            return False
        completed = self._assembler.feed(event)
        if isinstance(event, DocumentChanges | Mutation | Deletion | Expiration | SystemEvent):
            self._chunk.append(event)
            self._chunk_rows += len(event) if isinstance(event, DocumentChanges) else 1
            if self._chunk_rows >= self.chunk_rows:
                self._flush()
        if completed is not None:
            self._flush()
            for collection_id in completed.dropped_collection_ids:
                # DCP sends no deletions for a dropped collection's documents.
                for key in [k for k in self.documents if k[0] == collection_id]:
                    del self.documents[key]
        if isinstance(event, StreamEnd):
            self._flush()
            return True
        return False

    def live_fingerprints(self, excluded: Iterable[DocumentKey] = ()) -> dict[DocumentKey, int]:
        """Fingerprints of the live, unexpired documents, without the `excluded` keys."""
        skip = set(excluded)
        return {
            key: doc.fingerprint
            for key, doc in self.documents.items()
            if doc.fingerprint is not None and key not in skip
        }

    def expired_keys(self) -> set[DocumentKey]:
        return {key for key, doc in self.documents.items() if doc.expired}

    def _restart(self, reason: StreamEndReason) -> None:
        # The client reopens the stream from 0 (committed_position says so): start over.
        self.restarts += 1
        if self.restarts > MAX_STREAM_RESTARTS:
            raise VerifyInterrupted(
                f"vbucket {self.vbucket}: the source stream ended {self.restarts} times "
                f"({reason.name}) before its end; try again when the cluster is stable"
            )
        log.info("vbucket %d: source stream ended (%s); reading it again from 0",
                 self.vbucket, reason.name)
        self.documents.clear()
        self._chunk.clear()
        self._chunk_rows = 0
        self._assembler.discard(self.vbucket)

    def _flush(self) -> None:
        if not self._chunk:
            return
        rows = self.converter.convert(self._chunk)
        self._chunk = []
        self._chunk_rows = 0
        self._absorb(rows)

    def _absorb(self, rows: pa.RecordBatch) -> None:
        columns = RowColumns.of(rows)
        for index, key_text in enumerate(columns.key):
            collection_id = int(columns.collection_id[index])
            key = (collection_id, key_text)
            seqno = int(columns.seqno[index])
            known = self.documents.get(key)
            if known is not None and known.seqno >= seqno:
                continue  # an older version (OSO backfills arrive in key order)
            self.names.setdefault(
                collection_id, (columns.scope[index], columns.collection[index])
            )
            if columns.op[index] == DELETE:
                # A delete row with an expiry is a mutation already past it.
                expired = columns.expiry_us[index] is not None
                self.documents[key] = SourceDocument(seqno, None, expired=expired)
                continue
            self.documents[key] = SourceDocument(seqno, columns.fingerprint(index))


def scan_source(
    client: DcpClient,
    vbuckets: list[int],
    highs: Mapping[int, int],
    converter: ChangeRowConverter,
    judge: Callable[[SourceVbucketScan], None],
    *,
    parallel_streams: int,
    idle_timeout_s: float,
) -> None:
    """Stream each vbucket from 0 to its high seqno, `parallel_streams` at a time."""
    waiting = collections.deque(vbuckets)
    active: dict[int, SourceVbucketScan] = {}
    last_event = time.monotonic()
    while waiting or active:
        while waiting and len(active) < parallel_streams:
            vb = waiting.popleft()
            scan = SourceVbucketScan(vb, converter)
            high = highs.get(vb, 0)
            if high == 0:
                judge(scan)  # nothing was ever written: the mirror must hold nothing
                continue
            client.open_stream(vb, VbucketPosition.beginning(vb), None, end=high)
            active[vb] = scan
        if not active:
            break
        batch = client.poll(timeout=0.5)
        for event in batch.events:  # data messages in columnar runs, as the converter takes them
            reading = active.get(event.vbucket)
            if reading is not None and reading.feed(event):
                del active[event.vbucket]
                judge(reading)
        client.acknowledge(batch)
        now = time.monotonic()
        if batch:
            last_event = now
        elif now - last_event > idle_timeout_s:
            raise VerifyInterrupted(
                f"no data from the source for {idle_timeout_s:.0f}s while reading vbuckets "
                f"{sorted(active)}; verify again"
            )
