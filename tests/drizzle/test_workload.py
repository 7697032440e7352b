"""The embedded producer: deterministic, realistic, and mirrored exactly by assembly."""

from __future__ import annotations

import io
import random
from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from replicator.drizzle.assembly import (
    MessageSkipped,
    TransactionAssembler,
    TransactionCompleted,
    TransactionRolledBack,
)
from replicator.drizzle.changes import AlterTable, DropTable, TruncateTable
from replicator.drizzle.log import TransactionLogReader, read_transaction_log
from replicator.drizzle.proto.transaction_pb2 import Statement, Transaction
from replicator.drizzle.state import SourceDatabase
from replicator.drizzle.workload import TransactionKind, Workload, WorkloadSettings

SETTINGS = WorkloadSettings(seed=11, segment_bytes=2048, bulk_rows=60, ddl_share=0.1)
COUNT = 150


def mirror(messages: list[Transaction]) -> tuple[SourceDatabase, Counter[str]]:
    """Assemble and apply, as a replica would; count what became of the messages."""
    assembler = TransactionAssembler()
    database = SourceDatabase()
    outcomes: Counter[str] = Counter()
    for message in messages:
        result = assembler.feed(message)
        outcomes[type(result).__name__] += 1
        if isinstance(result, TransactionCompleted):
            database.apply(result.transaction)
    assert assembler.open_transactions() == ()
    return database, outcomes


def test_the_same_seed_makes_the_same_bytes() -> None:
    first = list(Workload(SETTINGS).serialized(COUNT))
    second = list(Workload(SETTINGS).serialized(COUNT))
    other = list(Workload(WorkloadSettings(seed=12, segment_bytes=2048)).serialized(COUNT))
    assert first == second
    assert first != other


def test_the_stream_has_every_kind_of_transaction() -> None:
    workload = Workload(SETTINGS)
    produced = list(workload.transactions(400))
    kinds = Counter(transaction.kind for transaction in produced)
    assert set(kinds) == set(TransactionKind)
    bulk = [t for t in produced if t.kind is TransactionKind.BULK]
    assert max(len(t.messages) for t in bulk) > 2
    rolled_back = [t for t in produced if not t.committed]
    # A rolled-back transaction sends nothing unless it had already sent segments (a bulk
    # one, or a small one over the segment size): then a ROLLBACK follows them.
    assert any(t.messages == () for t in rolled_back)
    sent = [t for t in rolled_back if t.messages]
    assert any(t.kind is TransactionKind.BULK_ROLLED_BACK for t in sent)
    assert all(t.messages[-1].statement[0].type == Statement.ROLLBACK for t in sent)
    assert all(len(t.messages) > 1 for t in sent)
    statement_types = {
        statement.type for t in produced for m in t.messages for statement in m.statement
    }
    assert {
        Statement.CREATE_SCHEMA,
        Statement.CREATE_TABLE,
        Statement.ALTER_TABLE,
        Statement.TRUNCATE_TABLE,
        Statement.INSERT,
        Statement.UPDATE,
        Statement.DELETE,
        Statement.ROLLBACK,
        Statement.ROLLBACK_STATEMENT,
    } <= statement_types
    ids = [t.transaction_id for t in produced]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_segments_of_bulk_transactions_interleave_with_others() -> None:
    messages = list(Workload(SETTINGS).messages(COUNT))
    open_ids: set[int] = set()
    interleaved = False
    for message in messages:
        transaction_id = message.transaction_context.transaction_id
        if open_ids - {transaction_id}:
            interleaved = True
        if message.end_segment:
            open_ids.discard(transaction_id)
        else:
            open_ids.add(transaction_id)
    assert interleaved and not open_ids


def test_a_mirror_of_the_messages_equals_the_producers_state() -> None:
    workload = Workload(SETTINGS)
    database, outcomes = mirror(list(workload.messages(COUNT)))
    assert database.differences(workload.database) == []
    assert outcomes["TransactionRolledBack"] > 0 and outcomes["SegmentBuffered"] > 0
    assert sum(len(rows) for rows in database.snapshot().values()) > 100
    retired = [(r.definition, r.row_count) for r in workload.database.retired]
    assert retired and [(r.definition, r.row_count) for r in database.retired] == retired


def test_a_mirror_of_the_transaction_log_equals_the_producers_state(tmp_path: Path) -> None:
    workload = Workload(SETTINGS)
    path = tmp_path / "transaction.log"
    written = workload.write_log(path, COUNT)
    entries = list(read_transaction_log(path))
    assert len(entries) == written.entries and entries[-1].end_offset == written.bytes
    database, _ = mirror([entry.transaction for entry in entries])
    assert database.differences(workload.database) == []


def test_a_log_cut_anywhere_mirrors_a_prefix_of_whole_transactions(tmp_path: Path) -> None:
    workload = Workload(SETTINGS)
    path = tmp_path / "transaction.log"
    workload.write_log(path, 60)
    data = path.read_bytes()
    expected = SourceDatabase()
    states = {0: expected.snapshot()}
    # The producer's state after each transaction, by the offset where its last entry ends.
    assembler = TransactionAssembler()
    for entry in read_transaction_log(path):
        result = assembler.feed(entry.transaction)
        if isinstance(result, TransactionCompleted):
            expected.apply(result.transaction)
        if isinstance(result, TransactionCompleted | TransactionRolledBack):
            states[entry.end_offset] = expected.snapshot()
    rng = random.Random(5)
    for cut in sorted(rng.sample(range(len(data)), 25)):
        reader = TransactionLogReader(io.BytesIO(data[:cut]))
        database, _ = _mirror_prefix([entry.transaction for entry in reader])
        assert reader.truncated_tail is None or reader.truncated_tail.offset == reader.end_offset
        last_whole = max(offset for offset in states if offset <= cut)
        assert database.snapshot() == states[last_whole], cut


def _mirror_prefix(messages: list[Transaction]) -> tuple[SourceDatabase, int]:
    assembler = TransactionAssembler()
    database = SourceDatabase()
    for message in messages:
        result = assembler.feed(message)
        if isinstance(result, TransactionCompleted):
            database.apply(result.transaction)
    return database, len(assembler.open_transactions())


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), redeliveries=st.integers(1, 40))
def test_redelivered_messages_are_applied_once(seed: int, redeliveries: int) -> None:
    """AMQP redelivery: after a consumer's channel drops, the broker sends again the messages
    it had not acknowledged (here: the last few before a random point), in their order."""
    workload = Workload(WorkloadSettings(seed=seed, segment_bytes=2048, bulk_rows=40))
    messages = list(workload.messages(60))
    rng = random.Random(seed)
    stream = list(messages)
    for _ in range(redeliveries):
        point = rng.randrange(1, len(stream))
        back = rng.randint(1, 5)
        stream[point:point] = stream[max(0, point - back) : point]
    assembler = TransactionAssembler()
    database = SourceDatabase()
    skipped = 0
    for message in stream:
        result = assembler.feed(message)
        skipped += isinstance(result, MessageSkipped)
        if isinstance(result, TransactionCompleted):
            database.apply(result.transaction)
    assert skipped == len(stream) - len(messages)
    assert database.differences(workload.database) == []


def test_ddl_reaches_the_mirror_as_typed_events() -> None:
    workload = Workload(SETTINGS)
    assembler = TransactionAssembler()
    events = Counter()
    for message in workload.messages(400):
        result = assembler.feed(message)
        if isinstance(result, TransactionCompleted):
            for change in result.transaction.changes:
                events[type(change).__name__] += 1
    assert events[AlterTable.__name__] and events[TruncateTable.__name__]
    assert events[DropTable.__name__] >= 1
