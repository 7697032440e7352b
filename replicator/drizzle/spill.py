"""A segment store that spills: open transactions' segments in memory up to a budget, beyond
it in files (Drizzle's own log framing, checksummed), so a bulk transaction that stays open
while thousands of segments arrive does not hold them all in memory.

When the segments in memory pass the budget, the open transaction holding the most memory
moves to a file, and its later segments go straight there. Reading back streams the file.
The files are scratch: after a restart the source gives the segments again.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from replicator.drizzle.log import TransactionLogReader, TransactionLogWriter
from replicator.drizzle.proto.transaction_pb2 import Transaction


class SpillingSegmentStore:
    """A `SegmentStore` (see replicator.drizzle.assembly) bounded by `memory_budget_bytes`.

    >>> store = SpillingSegmentStore(memory_budget_bytes=10)
    >>> message = Transaction(segment_id=1, end_segment=False)
    >>> message.transaction_context.server_id = 1
    >>> message.transaction_context.transaction_id = 5
    >>> message.transaction_context.start_timestamp = 0
    >>> message.transaction_context.end_timestamp = 0
    >>> store.append(5, message); store.append(5, message)
    >>> store.spilled_transactions, len(list(store.segments(5)))
    ((5,), 2)
    >>> store.close()
    """

    def __init__(self, *, memory_budget_bytes: int, directory: Path | str | None = None) -> None:
        if memory_budget_bytes < 0:
            raise ValueError("memory_budget_bytes must not be negative")
        self.memory_budget_bytes = memory_budget_bytes
        self._directory = Path(tempfile.mkdtemp(prefix="replicator-drizzle-spill-", dir=directory))
        self._memory: dict[int, list[Transaction]] = {}
        self._memory_sizes: dict[int, int] = {}
        self._files: dict[int, TransactionLogWriter] = {}
        self.memory_bytes = 0
        self.spilled_bytes = 0

    @property
    def spilled_transactions(self) -> tuple[int, ...]:
        return tuple(sorted(self._files))

    def is_spilled(self, transaction_id: int) -> bool:
        return transaction_id in self._files

    def _path(self, transaction_id: int) -> Path:
        return self._directory / f"transaction-{transaction_id}.segments"

    def append(self, transaction_id: int, segment: Transaction) -> None:
        writer = self._files.get(transaction_id)
        if writer is not None:
            before = writer.offset
            writer.append(segment)
            self.spilled_bytes += writer.offset - before
            return
        size = segment.ByteSize()
        self._memory.setdefault(transaction_id, []).append(segment)
        self._memory_sizes[transaction_id] = self._memory_sizes.get(transaction_id, 0) + size
        self.memory_bytes += size
        while self.memory_bytes > self.memory_budget_bytes and self._memory:
            largest = max(self._memory_sizes, key=lambda tid: self._memory_sizes[tid])
            self._spill(largest)

    def _spill(self, transaction_id: int) -> None:
        writer = TransactionLogWriter(self._path(transaction_id))
        for segment in self._memory.pop(transaction_id):
            writer.append(segment)
        self.memory_bytes -= self._memory_sizes.pop(transaction_id)
        self.spilled_bytes += writer.offset
        self._files[transaction_id] = writer

    def segments(self, transaction_id: int) -> Iterable[Transaction]:
        writer = self._files.get(transaction_id)
        if writer is None:
            return tuple(self._memory.get(transaction_id, ()))
        return self._read(transaction_id)

    def _read(self, transaction_id: int) -> Iterator[Transaction]:
        reader = TransactionLogReader(self._path(transaction_id), require_complete=True)
        for entry in reader:
            yield entry.transaction

    def drop(self, transaction_id: int) -> None:
        if transaction_id in self._memory:
            del self._memory[transaction_id]
            self.memory_bytes -= self._memory_sizes.pop(transaction_id)
        writer = self._files.pop(transaction_id, None)
        if writer is not None:
            self.spilled_bytes -= writer.offset
            writer.close()
            self._path(transaction_id).unlink(missing_ok=True)

    def close(self) -> None:
        """Forget everything and remove the spill directory."""
        for writer in self._files.values():
            writer.close()
        self._files.clear()
        self._memory.clear()
        self._memory_sizes.clear()
        self.memory_bytes = self.spilled_bytes = 0
        shutil.rmtree(self._directory, ignore_errors=True)
