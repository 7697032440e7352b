"""The Drizzle replication loop: messages -> complete transactions -> groups -> Delta commits.

The same shape as DCP's: the assembler hands out only whole transactions; complete ones wait
in a group, cut by count, rows or time (or when the source goes quiet); a group is planned
(`replicator.drizzle.planning`), recorded in the journal (`replicator.delta.journal`), and
committed table by table (`replicator.delta.relational`); only then are its messages settled
(acknowledged on the queue). A restart finishes the journal's last group if it had not landed
everywhere, then goes on: nothing is lost, nothing applied twice.

A transaction the mirror cannot apply (`UnsupportedChange`) or the assembler refuses
(`TransactionStreamError`) stops the run with an error naming it, after committing every
complete transaction before it; its messages stay unsettled, so the source still has them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from replicator.delta.journal import GroupJournal, GroupRecord, PlannedTable
from replicator.delta.relational import RelationalMirror
from replicator.drizzle.assembly import (
    CompletedIds,
    CompletedIdTracker,
    MessageSkipped,
    SegmentBuffered,
    TransactionAssembler,
    TransactionCompleted,
    TransactionRolledBack,
)
from replicator.drizzle.changes import CompleteTransaction
from replicator.drizzle.errors import TransactionStreamError
from replicator.drizzle.planning import GroupPlan, UnsupportedChange, plan_group
from replicator.drizzle.schema import TableDefinition, TableName
from replicator.drizzle.sources import MessageSource, Settlement, SourceMessage
from replicator.drizzle.spill import SpillingSegmentStore
from replicator.errors import ReplicatorError
from replicator.model.aliases import FaultHook

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replicator.config import ReplicatorConfig

log = logging.getLogger(__name__)

APP_ID = "replicator-drizzle"
FAULT_STEPS = ("after_journal", "after_table_commit", "after_group", "after_settle")
"""Where the fault hook is called for each group, in order (`after_table_commit` once per
table): tests stop the run there to check that a restart loses and repeats nothing."""


@dataclass(frozen=True, slots=True)
class DrizzleSettings:
    """How groups are cut, and when a run ends."""

    group_max_transactions: int = 5_000
    group_max_rows: int = 100_000
    group_interval_s: float = 2.0
    poll_s: float = 0.2
    until_caught_up: bool = False
    allow_late_commits: bool = False
    memory_budget_bytes: int = 256 << 20
    """Open transactions' segments held in memory; beyond it they spill to files."""
    spill_dir: str | None = None
    """Where spill files go (default: the system's temporary directory)."""

    def __post_init__(self) -> None:
        if self.group_max_transactions < 1 or self.group_max_rows < 1:
            raise ValueError("a group holds at least one transaction and one row")
        if self.group_interval_s <= 0 or self.poll_s <= 0:
            raise ValueError("group_interval_s and poll_s must be positive")


@dataclass
class DrizzleRunSummary:
    groups: int = 0
    transactions: int = 0
    rows: int = 0
    table_commits: int = 0
    rolled_back: int = 0
    redeliveries_skipped: int = 0
    redone_group: int | None = None
    spilled_transactions: set[int] = field(default_factory=set)
    retired: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    def describe(self) -> str:
        rate = self.transactions / self.elapsed_s if self.elapsed_s > 0 else 0.0
        text = (
            f"committed {self.transactions} transactions ({self.rows} row changes) in "
            f"{self.groups} groups, {self.table_commits} table commits, {self.elapsed_s:.1f}s "
            f"({rate:.0f} transactions/s); {self.rolled_back} rolled back, "
            f"{self.redeliveries_skipped} redelivered messages skipped"
        )
        if self.redone_group is not None:
            text += f"; finished group {self.redone_group} left by the last run"
        if self.spilled_transactions:
            text += f"; {len(self.spilled_transactions)} large transactions spilled to disk"
        if self.retired:
            text += f"; retired {', '.join(self.retired)}"
        return text


@dataclass(frozen=True, slots=True)
class _Start:
    group: int
    completed: CompletedIds | None
    resume_from: int | None
    definitions: Mapping[TableName, TableDefinition]
    redo: GroupRecord | None


class DrizzleReplication:
    """Replicates one Drizzle source into the relational mirror at `target`."""

    def __init__(
        self,
        spark: SparkSession,
        source: MessageSource,
        target: str,
        settings: DrizzleSettings | None = None,
        *,
        fault_hook: FaultHook | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.spark = spark
        self.source = source
        self.settings = settings or DrizzleSettings()
        self.mirror = RelationalMirror(spark, target, app_id=APP_ID)
        self.journal = GroupJournal(spark, target, app_id=APP_ID)
        self.fault_hook = fault_hook
        self.stop = stop or threading.Event()
        self.summary = DrizzleRunSummary()
        self._settlement = Settlement()
        self._ready: dict[int, CompleteTransaction] = {}
        """Complete transactions not committed yet, by id, in arrival order."""
        self._ready_rows = 0
        self._first_ready_at: float | None = None
        self._definitions: Mapping[TableName, TableDefinition] = {}
        self._assembler = TransactionAssembler()
        self._finished = CompletedIdTracker()
        self._redo: GroupRecord | None = None
        self._group = 1
        self._store: SpillingSegmentStore | None = None

    # Start.

    def _recover(self) -> _Start:
        state = self.journal.read()
        last, before = state.last, state.before
        if last is None:
            return _Start(1, None, None, {}, None)
        if self._landed(last):
            return _Start(
                last.group + 1, last.completed, last.resume_from, state.catalog_last, None
            )
        log.info(
            "group %d (%d transactions) had not landed in every table: finishing it first",
            last.group, len(last.transaction_ids),
        )
        return _Start(
            last.group,
            before.completed if before else None,
            before.resume_from if before else None,
            state.catalog_before,
            last,
        )

    def _landed(self, record: GroupRecord) -> bool:
        return group_landed(self.mirror, record)

    # The loop.

    def run(self) -> DrizzleRunSummary:
        started = time.monotonic()
        start = self._recover()
        self._group = start.group
        self._definitions = dict(start.definitions)
        store = SpillingSegmentStore(
            memory_budget_bytes=self.settings.memory_budget_bytes,
            directory=self.settings.spill_dir,
        )
        self._store = store
        # The ids finished for good (applied in a group, or rolled back): what the journal
        # records. The assembler's own set also holds complete transactions not committed yet,
        # which a restart must see again.
        self._finished = CompletedIdTracker(start.completed)
        self._assembler = TransactionAssembler(
            completed=start.completed,
            allow_late_commits=self.settings.allow_late_commits,
            store=store,
        )
        redo = self._redo = start.redo
        self.source.open(start.resume_from)
        try:
            while not self.stop.is_set():
                item = self.source.next(self.settings.poll_s)
                if item is not None:
                    self._feed(item)
                if redo is not None:
                    if self._redo_ready(redo):
                        self._commit_redo(redo)
                        redo = self._redo = None
                    elif item is None and not self._source_can_give_more():
                        missing = sorted(set(redo.transaction_ids) - set(self._ready))
                        raise ReplicatorError(
                            f"the journal's group {redo.group} has not landed in every table, "
                            f"and the source no longer has its transactions {missing[:10]}: "
                            "the source was rewound or truncated; restore it or mirror again"
                        )
                    continue
                if self._ready and self._should_cut(idle=item is None):
                    self._commit(list(self._ready.values()))
                if (
                    self.settings.until_caught_up
                    and item is None
                    and not self._ready
                    and not self._assembler.open_transactions()
                ):
                    break
        finally:
            self.source.close()
            store.close()
            self.summary.elapsed_s = time.monotonic() - started
        return self.summary

    def _source_can_give_more(self) -> bool:
        return not self.source.finite

    def _feed(self, item: SourceMessage) -> None:
        try:
            result = self._assembler.feed(item.message, position=item.position)
        except TransactionStreamError as error:
            self._commit_before_error()
            # Same class, so callers can still tell a gap from an unknown statement.
            raise type(error)(
                error.transaction_id, error.segment_id,
                f"{error.detail} (from {self.source.name}; every complete transaction "
                "before it is committed, nothing of it is)",
            ) from None
        settlement = self._settlement
        if isinstance(result, SegmentBuffered):
            settlement.arrived(item.position, result.transaction_id)
            store = self._store
            if store is not None and store.is_spilled(result.transaction_id):
                self.summary.spilled_transactions.add(result.transaction_id)
        elif isinstance(result, TransactionCompleted):
            transaction = result.transaction
            settlement.arrived(item.position, transaction.transaction_id)
            self._ready[transaction.transaction_id] = transaction
            self._ready_rows += transaction.row_count
            if self._first_ready_at is None:
                self._first_ready_at = time.monotonic()
        elif isinstance(result, TransactionRolledBack):
            settlement.arrived(item.position, result.transaction_id)
            settlement.finish([result.transaction_id])
            self._finished.add(result.transaction_id)
            self.summary.rolled_back += 1
        elif isinstance(result, MessageSkipped):
            settlement.arrived(item.position, None)
            self.summary.redeliveries_skipped += 1

    def _should_cut(self, *, idle: bool) -> bool:
        settings = self.settings
        if idle or len(self._ready) >= settings.group_max_transactions:
            return True
        if self._ready_rows >= settings.group_max_rows:
            return True
        waited = time.monotonic() - (self._first_ready_at or time.monotonic())
        return waited >= settings.group_interval_s

    def _redo_ready(self, redo: GroupRecord) -> bool:
        return all(tid in self._ready for tid in redo.transaction_ids)

    def _commit_redo(self, redo: GroupRecord) -> None:
        transactions = [self._ready[tid] for tid in redo.transaction_ids]
        plan = plan_group(transactions, self._definitions)
        self._apply(transactions, plan, redo.group, record=False)
        self.summary.redone_group = redo.group
        self._group = redo.group + 1

    def _commit_before_error(self) -> None:
        # While the journal's last group waits to be finished, no other group may be committed
        # under its number: stop with nothing more committed, the source keeps the rest.
        if self._ready and self._redo is None:
            self._commit(list(self._ready.values()))

    def _commit(self, transactions: Sequence[CompleteTransaction]) -> None:
        """Commit `transactions` as the next group (those before an unsupported one, then
        raise its error)."""
        try:
            plan = plan_group(transactions, self._definitions)
        except UnsupportedChange as error:
            index = next(
                i for i, t in enumerate(transactions) if t.transaction_id == error.transaction_id
            )
            if index > 0:
                self._commit(transactions[:index])
            raise UnsupportedChange(
                error.transaction_id,
                f"{error.detail}. Every transaction before it is committed; nothing of it or "
                "after it is, and the source still holds them",
            ) from None
        self._apply(transactions, plan, self._group, record=True)
        self._group += 1

    def _apply(
        self,
        transactions: Sequence[CompleteTransaction],
        plan: GroupPlan,
        group: int,
        *,
        record: bool,
    ) -> None:
        ids = [t.transaction_id for t in transactions]
        for transaction_id in ids:
            self._finished.add(transaction_id)
        self._settlement.finish(ids)
        through = self._settlement.settle()
        if record:
            resume_from = None
            if self.source.resumable_by_offset:
                resume_from = self._settlement.oldest_unsettled()
                if resume_from is None:
                    resume_from = self.source.next_position()
            changed = dict(plan.definitions) != dict(self._definitions)
            self.journal.write(GroupRecord(
                group=group,
                source=self.source.name,
                transaction_ids=tuple(ids),
                tables=tuple(PlannedTable(p.table, p.dropped_by) for p in plan.tables),
                resume_from=resume_from,
                completed=self._finished.snapshot(),
                catalog=plan.definitions if changed or group == 1 else None,
            ))
            self._fault("after_journal")
        for table_plan in plan.tables:
            commit = self.mirror.commit(table_plan, group, redo=not record)
            if commit.version >= 0:
                self.summary.table_commits += 1
            if commit.retired_to:
                self.summary.retired.append(f"{table_plan.table} -> {commit.retired_to}")
            self._fault("after_table_commit")
        self._definitions = dict(plan.definitions)
        for transaction_id in ids:
            del self._ready[transaction_id]
        self._ready_rows = sum(t.row_count for t in self._ready.values())
        self._first_ready_at = time.monotonic() if self._ready else None
        self.summary.groups += 1
        self.summary.transactions += len(ids)
        self.summary.rows += sum(t.row_count for t in transactions)
        log.info("group %d: %d transactions, %d tables", group, len(ids), len(plan.tables))
        self._fault("after_group")
        if through is not None:
            self.source.settle(through)
            self._fault("after_settle")

    def _fault(self, step: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(step)


def group_landed(mirror: RelationalMirror, record: GroupRecord) -> bool:
    """Whether every table commit of the journal's `record` landed."""
    return mirror.group_landed(
        [(planned.table, planned.dropped_by) for planned in record.tables], record.group
    )


def open_source(config: ReplicatorConfig) -> MessageSource:
    """The message source `config.source` names (drizzle-log:///PATH or drizzle+amqp://...).

    A log is followed as it grows unless the run stops once caught up. The queue's password
    comes from REPLICATOR_PASSWORD / _FILE when set (the user from the URL), never a flag.
    """
    from replicator.drizzle.amqp.source import AmqpSource
    from replicator.drizzle.sources import LogFileSource, QueueSource, parse_source

    kind, location = parse_source(config.source)
    if kind == "log":
        return LogFileSource(location, follow=not config.until_caught_up)
    password = None
    if config.password is not None or config.password_file:
        password = config.resolved_password().value
    return QueueSource(AmqpSource.parse(location, password=password))


def run_drizzle_replication(
    config: ReplicatorConfig,
    *,
    spark: SparkSession | None = None,
    fault_hook: FaultHook | None = None,
) -> DrizzleRunSummary:
    """`replicator run` for a Drizzle source: until caught up, or until SIGTERM / SIGINT."""
    import signal

    from replicator.runtime.spark import build_session

    config.require_source_and_target()
    source = open_source(config)
    settings = DrizzleSettings(
        group_interval_s=config.commit_interval_s,
        group_max_rows=config.commit_max_rows,
        until_caught_up=config.until_caught_up,
        memory_budget_bytes=config.memory_budget_mb << 20,
        spill_dir=config.staging_dir or None,
    )
    session = spark or build_session("replicator")
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        replication = DrizzleReplication(
            session, source, config.target, settings, fault_hook=fault_hook, stop=stop
        )
        return replication.run()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
