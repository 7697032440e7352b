"""The spilling segment store: memory bounded, segments back in order, files removed."""

from __future__ import annotations

from pathlib import Path

from replicator.drizzle.assembly import (
    MemorySegmentStore,
    TransactionAssembler,
    TransactionCompleted,
    TransactionRolledBack,
)
from replicator.drizzle.changes import CompleteTransaction
from replicator.drizzle.proto.transaction_pb2 import Transaction
from replicator.drizzle.spill import SpillingSegmentStore
from tests.drizzle.messages import insert_messages, rollback_message, setup_messages


def _complete(store: object, messages: list[Transaction]) -> list[CompleteTransaction]:
    assembler = TransactionAssembler(store=store)  # type: ignore[arg-type]
    return [
        r.transaction for m in messages
        if isinstance(r := assembler.feed(m), TransactionCompleted)
    ]


def test_a_large_transaction_spills_and_comes_back_equal(tmp_path: Path) -> None:
    bulk = list(insert_messages(3, range(1, 2000), segment_bytes=4096))
    small = list(insert_messages(4, range(5000, 5003)))
    assert len(bulk) > 10
    # The small transaction commits while the bulk one is open, as Drizzle interleaves them.
    messages = [*setup_messages(), *bulk[:-1], *small, bulk[-1]]
    store = SpillingSegmentStore(memory_budget_bytes=20_000, directory=tmp_path)
    expected = _complete(MemorySegmentStore(), messages)
    peak = 0
    assembler = TransactionAssembler(store=store)
    spilled: list[int] = []
    completed = []
    for message in messages:
        result = assembler.feed(message)
        peak = max(peak, store.memory_bytes)
        spilled.extend(store.spilled_transactions)
        if isinstance(result, TransactionCompleted):
            completed.append(result.transaction)
    assert completed == expected
    assert 3 in spilled
    assert peak <= 20_000 + max(m.ByteSize() for m in messages)
    assert store.spilled_bytes == 0 and store.memory_bytes == 0
    assert list(tmp_path.glob("*/*")) == [], "completed transactions leave no file"
    store.close()
    assert list(tmp_path.iterdir()) == []


def test_a_rolled_back_spilled_transaction_removes_its_file(tmp_path: Path) -> None:
    bulk = list(insert_messages(3, range(1, 2000), segment_bytes=4096))
    store = SpillingSegmentStore(memory_budget_bytes=10_000, directory=tmp_path)
    assembler = TransactionAssembler(store=store)
    for message in [*setup_messages(), *bulk[:-1]]:
        assembler.feed(message)
    assert store.spilled_transactions == (3,)
    assert len(list(tmp_path.glob("*/*"))) == 1
    result = assembler.feed(rollback_message(3, len(bulk)))
    assert isinstance(result, TransactionRolledBack)
    assert not store.spilled_transactions
    assert list(tmp_path.glob("*/*")) == []
    store.close()
