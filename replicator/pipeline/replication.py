"""The replication driver: DCP events in, Delta commits out, one vbucket's fate at a time.

Over 500 lines on purpose: `Replication` is one state machine (streams, rollbacks, the commit
in flight, the source checks) driven by one thread; split, its transitions would be spread
over modules that all reach into the same state.

One thread makes every decision: it polls the DCP client, stages events (then acknowledges them
so the producer's flow-control window reopens), plans group commits, and handles rollbacks. The
client's own threads only read sockets.

A planned batch is committed by one background thread while this one goes on streaming and
staging: a commit is mostly the JVM's work, and staging is mostly Python's, so the two overlap
instead of taking turns. At most one commit is in flight; the next is planned only after it
landed. Heartbeats run on that thread too, after a commit or on their own when none is in
flight, so they never make this thread wait. Whatever else touches the store (a rollback, a
resync, a stream that must resume from the committed boundary, the end of the run) first waits
for the commit in flight and takes its outcome, so a rollback never races a commit and always
sees the newest position.

A failover rolls back every vbucket the lost node was active for, and their answers arrive
together: rollbacks are gathered until a poll brings no new one (ROLLBACK_GATHER_S at most)
and handed to the store at once, which rewinds them in one commit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from replicator.dcp.cluster.streams import EndAction, StreamState, stream_end_action
from replicator.dcp.protocol.events import (
    RollbackRequired,
    StreamEnd,
    StreamEndReason,
    StreamEvent,
    StreamOpened,
)
from replicator.errors import ConnectionLostError, ReplicatorError
from replicator.model.mirror import RecoveredMirror, RollbackOutcome, RollbackRequest
from replicator.model.positions import FailoverLog, VbucketPosition
from replicator.pipeline.progress import ProgressReporter, ProgressSnapshot
from replicator.pipeline.watchdog import SourceWatch, StreamWatchdog
from replicator.planning.planner import (
    CommitBatch,
    CommitThresholds,
    CommitTrigger,
    VbucketCommit,
    plan_commit,
    stretched_for_slow_commits,
)
from replicator.staging.stager import StagedSnapshots
from replicator.staging.stream import StreamStager

if TYPE_CHECKING:
    from replicator.dcp.cluster.client import DcpClient

log = logging.getLogger(__name__)

ROLLBACK_STORM_LIMIT = 5
"""Rollbacks of one vbucket to the same seqno in a row before we resync it from 0 instead."""

ROLLBACK_GATHER_S = 1.0
"""Longest a rollback waits for the others of its failover, so that they share one commit."""

ROLLBACK_GATHER_POLL_S = 0.05
"""Poll timeout while rollbacks are gathered: a poll this long with no new one ends the wait."""

COMMIT_WATCH_INTERVAL_S = 0.05
"""Longest poll while a commit is in flight: the next one is planned soon after it lands."""

SOURCE_CHECK_INTERVAL_S = 30.0
"""How often a run asks the producer for its high seqnos (lag, and a source behind the mirror)."""

SOURCE_CHECK_TIMEOUT_S = 5.0
"""Longest wait of a periodic source check for one answer."""

LOST_HISTORY_REASON = "source behind the mirror: lost history"
"""The rollback reason recorded when the producer has less than the mirror on the same history."""


class MirrorStore(Protocol):
    """What the driver needs of the Delta layer (see replicator.delta.store)."""

    def recover(self, vbuckets: tuple[int, ...]) -> RecoveredMirror: ...

    def save_failover_logs(self, logs: Mapping[int, FailoverLog]) -> None: ...

    def commit(self, batch: CommitBatch, *, replace: frozenset[int]) -> int: ...

    def rollback(self, requests: Sequence[RollbackRequest]) -> list[RollbackOutcome]: ...

    def heartbeat(self) -> None: ...


@dataclass
class VbucketProgress:
    """The driver's view of one vbucket."""

    vbucket: int
    committed: VbucketPosition
    failover_log: FailoverLog | None
    target_seqno: int | None = None
    resync: bool = False
    rollbacks: int = 0
    last_rollback_seqno: int | None = None
    same_rollback_streak: int = 0
    streaming: bool = False
    lost_history: bool = False
    """The producer's high seqno fell below the committed one on the same history: the vbucket
    is resynced from 0 as soon as its stream is closed."""
    history_confirmed: bool = False
    """The producer accepted a stream from the committed position since the last rollback.

    Until then even a vbucket at its target is not caught up: a committed seqno at or above the
    producer's high seqno can be exactly the history a failover threw away."""

    @property
    def caught_up(self) -> bool:
        return self.reaches_target(self.committed.seqno)

    def reaches_target(self, seqno: int) -> bool:
        """`seqno` is at or past the run's target on the history the producer confirmed."""
        return (
            self.history_confirmed
            and self.target_seqno is not None
            and seqno >= self.target_seqno
        )


@dataclass
class ReplicationStats:
    items_committed: int = 0
    commits: int = 0
    rollbacks: int = 0
    full_resyncs: int = 0
    started_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True, slots=True)
class ReplicationSummary:
    """What a finished run did, for the operator."""

    vbuckets: int
    items_committed: int
    commits: int
    rollbacks: int
    full_resyncs: int
    seconds: float
    caught_up: bool
    spilled_bytes: int = 0
    peak_buffered_bytes: int = 0

    def describe(self) -> str:
        rate = self.items_committed / self.seconds if self.seconds > 0 else 0.0
        state = "caught up" if self.caught_up else "stopped"
        return (
            f"{state}: {self.items_committed} changes in {self.commits} commits over "
            f"{self.vbuckets} vbuckets in {self.seconds:.1f}s ({rate:,.0f}/s); "
            f"rollbacks {self.rollbacks}, full resyncs {self.full_resyncs}; "
            f"peak staged in memory {self.peak_buffered_bytes / 2**20:.1f} MiB, "
            f"spilled {self.spilled_bytes / 2**20:.1f} MiB"
        )


@dataclass(frozen=True, slots=True)
class CommitInFlight:
    """A claimed batch being committed by the background thread (None: a heartbeat alone);
    `future` gives the commit's duration."""

    batch: CommitBatch | None
    future: Future[float]


class Replication:
    """Mirrors the selected vbuckets of one bucket into one Delta table until told to stop.

    `targets` (vbucket -> high seqno) makes the run stop once every vbucket committed it
    (`--until-caught-up`); without it the run continues until `stop` is set.
    `commit_in_background` False makes every commit on the replication thread, the step that
    plans it waiting for it (streaming and staging pause meanwhile).
    """

    def __init__(
        self,
        *,
        source: DcpClient,
        store: MirrorStore,
        stream_stager: StreamStager,
        vbuckets: tuple[int, ...],
        thresholds: CommitThresholds,
        targets: Mapping[int, int] | None = None,
        progress: ProgressReporter | None = None,
        heartbeat_interval_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        commit_in_background: bool = True,
        source_check_interval_s: float = SOURCE_CHECK_INTERVAL_S,
        source_highs: Mapping[int, int] | None = None,
    ) -> None:
        self._source = source
        self._store = store
        self._staging = stream_stager
        self._vbuckets = vbuckets
        self._thresholds = thresholds
        self._targets = dict(targets) if targets is not None else None
        self._progress = progress
        self._heartbeat_interval = heartbeat_interval_s
        self._clock = clock
        self._state: dict[int, VbucketProgress] = {}
        self._pending_logs: dict[int, FailoverLog] = {}
        self._rollbacks_due: dict[int, tuple[int, str | None]] = {}
        """vbucket -> (rollback seqno, reason) asked for and not yet carried out."""
        self._gathering_since: float | None = None
        self._stored_logs: dict[int, FailoverLog] = {}
        """Per vbucket, the failover log the table is known to hold (recovered or saved)."""
        self._next_batch_id = 0
        self._last_commit_seconds = 0.0
        self._requested_targets: dict[int, int] | None = None
        self._targets_lock = threading.Lock()
        self._step_observers: list[Callable[[Replication], None]] = []
        self._commit_listeners: list[Callable[[CommitBatch, float], None]] = []
        self._committer = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="delta-commit")
            if commit_in_background else None
        )
        self._in_flight: CommitInFlight | None = None
        self._last_heartbeat = clock()
        self._watchdog = StreamWatchdog(clock)
        self._source_watch = SourceWatch(source_check_interval_s, clock)
        self._source_check_failed = False
        self._source_highs_at_start = source_highs
        """The producer's high seqnos as the caller just read them: start does not ask again."""
        self.stats = ReplicationStats()

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Recover committed positions and open a stream per vbucket not yet caught up."""
        recovered = self._store.recover(self._vbuckets)
        self._next_batch_id = recovered.next_batch_id
        self._stored_logs = dict(recovered.failover_logs)
        for vb in self._vbuckets:
            position = recovered.positions.get(vb) or VbucketPosition.beginning(vb)
            state = VbucketProgress(vb, position, recovered.failover_logs.get(vb))
            if self._targets is not None:
                state.target_seqno = self._targets.get(vb, 0)
            self._state[vb] = state
        # A source that lost history the mirror has is found before anything streams.
        lost = self._check_source(known=self._source_highs_at_start)
        for state in self._state.values():
            if state.vbucket in lost:
                self._resync_lost_history(state)
            else:
                self._open(state)

    def after_each_step(self, observer: Callable[[Replication], None]) -> None:
        """Call `observer(self)` on the replication thread after every step (progress readers
        that want a consistent view; register before `run`)."""
        self._step_observers.append(observer)

    def on_commit_landed(self, listener: Callable[[CommitBatch, float], None]) -> None:
        """Call `listener(batch, seconds)` on the replication thread as each data commit lands
        (metrics; register before `run`)."""
        self._commit_listeners.append(listener)

    def source_highs(self) -> dict[int, int]:
        """The producer's high seqnos at its last check, per vbucket of this run."""
        return dict(self._source_watch.highs)

    def request_catch_up(self, targets: Mapping[int, int]) -> None:
        """Ask a continuous run to stop once every vbucket committed `targets` (thread-safe).

        Vbuckets missing from `targets` are held to their current high point, 0 when unknown.
        """
        with self._targets_lock:
            self._requested_targets = dict(targets)

    def _apply_requested_targets(self) -> None:
        with self._targets_lock:
            requested, self._requested_targets = self._requested_targets, None
        if requested is None:
            return
        self._targets = {vb: requested.get(vb, 0) for vb in self._state}
        for vb, state in self._state.items():
            state.target_seqno = self._targets[vb]
            if state.caught_up and state.streaming:
                self._source.close_stream(vb)

    def committed_position(self, vbucket: int) -> tuple[VbucketPosition, FailoverLog | None]:
        """Where a stream resumes after a non-final end: the committed boundary.

        The client calls this from inside `poll`, on this driver's thread, after the StreamEnd
        was handed up; that handler already dropped everything staged above the boundary.
        """
        state = self._state[vbucket]
        return state.committed, state.failover_log

    def run(self, stop: threading.Event) -> ReplicationSummary:
        """Replicate until `stop` is set or, with targets, until every vbucket caught up."""
        try:
            self.start()
            self._last_heartbeat = self._clock()
            while not stop.is_set() and not self.all_caught_up():
                self._apply_requested_targets()
                self.step(poll_timeout=self._poll_timeout())
                for observer in self._step_observers:
                    observer(self)
                if self._source_watch.due():
                    self._close_lost_history(self._check_source(waiting=False))
                if self._heartbeat_due() and self._in_flight is None:
                    self._start_heartbeat()
            # A clean stop commits what is complete (a short commit) and abandons partial
            # snapshots.
            self._commit_if_due(force=True)
            self._save_pending_logs()
        except BaseException:
            self._abandon_commit_in_flight()
            raise
        finally:
            if self._committer is not None:
                self._committer.shutdown(wait=True)
        for state in self._state.values():
            if state.streaming:
                self._source.close_stream(state.vbucket)
        self._report(force=True)
        return self.summary()

    def step(self, *, poll_timeout: float) -> None:
        """One turn: poll, stage and acknowledge, then, when the commit in flight (if any) has
        landed, start the next commit if a threshold is reached."""
        self._reopen_due()
        batch = self._source.poll(timeout=poll_timeout)
        asked = len(self._rollbacks_due)
        for event in batch.events:  # data messages stay columnar runs
            self._handle(event)
        self._source.acknowledge(batch)
        self._roll_back_when_gathered(more_came=len(self._rollbacks_due) > asked)
        self._commit_if_due()
        self._report()

    def all_caught_up(self) -> bool:
        return self._targets is not None and all(s.caught_up for s in self._state.values())

    def summary(self) -> ReplicationSummary:
        return ReplicationSummary(
            vbuckets=len(self._state),
            items_committed=self.stats.items_committed,
            commits=self.stats.commits,
            rollbacks=self.stats.rollbacks,
            full_resyncs=self.stats.full_resyncs,
            seconds=self._clock() - self.stats.started_at,
            caught_up=self.all_caught_up(),
            spilled_bytes=self._staging.stager.spilled_bytes_total,
            peak_buffered_bytes=self._staging.stager.peak_buffered_bytes,
        )

    def positions(self) -> dict[int, VbucketPosition]:
        return {vb: state.committed for vb, state in self._state.items()}

    def staged_up_to(self) -> dict[int, int]:
        """Per vbucket, the end seqno of its newest complete snapshot staged but not committed."""
        return self._staging.staged_up_to()

    # --- events ------------------------------------------------------------------------

    def _handle(self, event: StreamEvent) -> None:
        state = self._state.get(event.vbucket)
        if state is None:
            return  # a vbucket we do not own (a stale event after a map change)
        if isinstance(event, StreamOpened):
            state.failover_log = event.failover_log
            state.history_confirmed = True
            # A restart finds the same logs it stored: saving them again is a commit for nothing.
            if event.failover_log != self._stored_logs.get(event.vbucket):
                self._pending_logs[event.vbucket] = event.failover_log
            self._staging.feed(event)
            if state.resync:
                self._resync_if_producer_empty(state, event.failover_log)
            if state.caught_up:
                self._source.close_stream(event.vbucket)
        elif isinstance(event, RollbackRequired):
            state.streaming = False
            self._ask_rollback(state, event.rollback_seqno)
        elif isinstance(event, StreamEnd):
            if stream_end_action(event.reason) is EndAction.FINAL:
                self._stream_ended(state, event)
            else:
                self._staging.feed(event)
                # The client reopens from committed_position(): drop everything above it so
                # the re-sent snapshots are neither duplicated nor mixed with the old stream.
                # A commit in flight may move that boundary: it lands first.
                self._finish_commit_in_flight()
                log.info("vbucket %d stream ended (%s); resuming from seqno %d",
                         event.vbucket, event.reason.name, state.committed.seqno)
                self._staging.discard(event.vbucket, resume_seqno=state.committed.seqno)
        else:
            self._staging.feed(event)

    def _stream_ended(self, state: VbucketProgress, end: StreamEnd) -> None:
        """A stream ended for good on the client's side (OK, CLOSED, FILTER_EMPTY,
        LOST_PRIVILEGES): expected only when this driver closed it; otherwise reopen it."""
        state.streaming = False
        # Streams are requested open-ended, so an OK end is never "end seqno reached": what
        # a producer stopped sending mid-snapshot must not be committed as a whole snapshot.
        voiding = end if end.reason is not StreamEndReason.OK else StreamEnd(
            end.vbucket, StreamEndReason.CLOSED, end.stream_id
        )
        self._staging.feed(voiding)
        if state.lost_history:
            self._resync_lost_history(state)
        elif end.reason is StreamEndReason.LOST_PRIVILEGES:
            raise ReplicatorError(
                f"vbucket {state.vbucket}: the producer ended its stream because the user lost "
                "its privileges on the bucket: grant it DCP read access (the Data DCP Reader "
                "role) and run again; the mirror stays at its committed position"
            )
        elif not state.caught_up:
            self._watchdog.ended_early(state.vbucket, end.reason, state.committed)

    def _reopen_due(self) -> None:
        """Reopen the streams whose backoff after an unasked end has passed."""
        due = self._watchdog.due()
        if not due:
            return
        # Reopened from the committed boundary: what is staged above it is sent again.
        self._finish_commit_in_flight()
        for vb in due:
            state = self._state[vb]
            if state.streaming or state.caught_up:
                continue
            self._staging.discard(vb, resume_seqno=state.committed.seqno)
            self._open(state)

    def _check_source(
        self, *, waiting: bool = True, known: Mapping[int, int] | None = None
    ) -> set[int]:
        """Fetch the producer's high seqnos (the lag), unless `known`; the vbuckets whose
        producer has less than the mirror committed, on the same history: it lost data without
        a failover.

        Not `waiting`: ask only connected nodes, briefly (the periodic check, on the thread
        that streams, must not stall while a node is down)."""
        timeout = None if waiting else SOURCE_CHECK_TIMEOUT_S
        try:
            highs = (
                dict(known) if known is not None
                else self._source.high_seqnos(timeout=timeout, connected_only=not waiting)
            )
        except ReplicatorError as exc:
            if not self._source_check_failed:
                log.warning("cannot read the producer's high seqnos; lag is unknown until it "
                            "answers: %s", exc)
            self._source_check_failed = True
            self._source_watch.update({})
            return set()
        self._source_check_failed = False
        self._source_watch.update({vb: high for vb, high in highs.items() if vb in self._state})
        lost: set[int] = set()
        for vb in self._source_watch.behind(self.positions()):
            state = self._state[vb]
            try:
                current = self._source.failover_log(vb, timeout=timeout)
            except ReplicatorError as exc:
                log.warning("vbucket %d: cannot read its failover log: %s", vb, exc)
                continue
            if current.newest.vbucket_uuid != state.committed.vbucket_uuid:
                continue  # a new history: the stream request gets the producer's rollback
            log.warning(
                "vbucket %d: the producer's high seqno %d is below the mirror's committed seqno "
                "%d on the same history (uuid %#x): the producer lost changes without a "
                "failover; resyncing the vbucket from 0",
                vb, highs[vb], state.committed.seqno, state.committed.vbucket_uuid,
            )
            lost.add(vb)
        return lost

    def _close_lost_history(self, lost: set[int]) -> None:
        """Close the open streams of vbuckets that lost history; each is resynced at its end."""
        for vb in sorted(lost):
            state = self._state[vb]
            if not state.streaming:
                self._watchdog.forget(vb)
                self._resync_lost_history(state)
            elif self._source.stream_state(vb) is StreamState.OPEN:
                state.lost_history = True
                self._source.close_stream(vb)
            # Otherwise the stream is being (re)opened: the next check finds it again.

    def _resync_lost_history(self, state: VbucketProgress) -> None:
        state.lost_history = False
        self._ask_rollback(state, 0, reason=LOST_HISTORY_REASON)

    def _ask_rollback(
        self, state: VbucketProgress, rollback_seqno: int, *, reason: str | None = None
    ) -> None:
        """Note a rollback to carry out with the others of its failover (see
        `_roll_back_when_gathered`); until then the vbucket is neither committed nor caught up."""
        state.history_confirmed = False
        self._rollbacks_due[state.vbucket] = (rollback_seqno, reason)

    def _roll_back_when_gathered(self, *, more_came: bool) -> None:
        """Carry out the rollbacks asked for, once a poll brought no new one or the oldest has
        waited ROLLBACK_GATHER_S."""
        if not self._rollbacks_due:
            return
        now = self._clock()
        if self._gathering_since is None:
            self._gathering_since = now
        if more_came and now - self._gathering_since < ROLLBACK_GATHER_S:
            return
        due, self._rollbacks_due, self._gathering_since = self._rollbacks_due, {}, None
        self._finish_commit_in_flight()  # it may hold these vbuckets: roll back what it commits
        requests = [
            self._rollback_request(self._state[vb], seqno, reason)
            for vb, (seqno, reason) in sorted(due.items())
        ]
        outcomes = self._store.rollback(requests)
        for request, outcome in zip(requests, outcomes, strict=True):
            self._rolled_back(self._state[request.vbucket], request, outcome)

    def _rollback_request(
        self, state: VbucketProgress, rollback_seqno: int, reason: str | None
    ) -> RollbackRequest:
        vb = state.vbucket
        self.stats.rollbacks += 1
        state.rollbacks += 1
        if rollback_seqno == state.last_rollback_seqno:
            state.same_rollback_streak += 1
        else:
            state.same_rollback_streak = 1
        state.last_rollback_seqno = rollback_seqno
        storm = state.same_rollback_streak >= ROLLBACK_STORM_LIMIT
        if storm:
            log.warning("vbucket %d: %d rollbacks to seqno %d in a row; resyncing it from 0",
                        vb, state.same_rollback_streak, rollback_seqno)
            rollback_seqno = 0
        return RollbackRequest(
            vb, rollback_seqno, state.committed, self._source.failover_log(vb),
            "rollback storm" if storm else reason or "producer requested rollback",
        )

    def _rolled_back(
        self, state: VbucketProgress, request: RollbackRequest, outcome: RollbackOutcome
    ) -> None:
        vb = state.vbucket
        log.info("vbucket %d: rollback to %d (%s); mirror now at seqno %d%s",
                 vb, request.rollback_seqno, request.reason, outcome.position.seqno,
                 " (full resync)" if outcome.full_resync else "")
        state.committed = outcome.position
        state.failover_log = request.failover_log
        if outcome.full_resync:
            self.stats.full_resyncs += 1
            state.resync = True
            state.committed = VbucketPosition.beginning(vb)
            state.same_rollback_streak = 0
        self._staging.discard(vb, resume_seqno=state.committed.seqno)
        self._open(state)

    def _resync_if_producer_empty(self, state: VbucketProgress, failover_log: FailoverLog) -> None:
        """Commit an empty vbucket for a resync the producer has nothing to send for.

        A wiped or flushed vbucket streams nothing from 0, so no snapshot would ever replace
        the rows of the history it lost; its state at seqno 0 is empty, a whole-snapshot state.
        """
        vb = state.vbucket
        try:
            high = self._source.high_seqnos().get(vb)
        except ConnectionLostError as exc:  # the stream itself will fail and be reopened
            log.warning("vbucket %d: cannot learn the producer's high seqno: %s", vb, exc)
            return
        if high != 0:
            return  # the stream brings a snapshot, and its commit replaces the rows
        position = VbucketPosition.at_boundary(vb, failover_log.newest.vbucket_uuid, 0)
        self._finish_commit_in_flight()
        empty = VbucketCommit(
            vbucket=vb, position=position, previous_seqno=0, first_load=True,
            snapshot_start=0, snapshot_count=0, tables=(), spill_files=(), row_count=0,
            byte_count=0, staged_run_ids=(),
        )
        self._save_pending_logs()
        self._store.commit(
            CommitBatch(self._next_batch_id, (empty,), CommitTrigger.FORCED),
            replace=frozenset({vb}),
        )
        log.info("vbucket %d: the producer's copy is empty; removed its rows from the mirror", vb)
        self._next_batch_id += 1
        self.stats.commits += 1
        state.committed = position
        state.resync = False

    def _open(self, state: VbucketProgress) -> None:
        log_for_request = state.failover_log if state.committed.seqno > 0 else None
        self._source.open_stream(state.vbucket, state.committed, log_for_request)
        state.streaming = True

    # --- commits -----------------------------------------------------------------------

    def _poll_timeout(self) -> float:
        from replicator.planning.planner import seconds_until_due

        if self._in_flight is not None:
            # Nothing is planned until it lands; look again soon after it does.
            return 0.0 if self._in_flight.future.done() else COMMIT_WATCH_INTERVAL_S
        if self._rollbacks_due:
            return ROLLBACK_GATHER_POLL_S
        due = seconds_until_due(
            self._staging.stager.ready_snapshots(), self._thresholds_now(), now=self._clock()
        )
        reopen = self._watchdog.seconds_until_due()
        return min([0.5, *(max(0.0, d) for d in (due, reopen) if d is not None)])

    def _commit_if_due(self, *, force: bool = False) -> None:
        """Start the next commit if one is due; `force` waits for it (and any in flight)."""
        if self._in_flight is not None:
            if not (force or self._in_flight.future.done()):
                return
            self._finish_commit_in_flight()
        # Items wait in chunks until a commit may be planned (or the chunks are full): while
        # one is in flight, a flush per poll staged a table per vbucket per few items, which
        # the next commit joined again (0.5 s of 125,000 rows in 9,000 tables, 1.8 s in 125,000).
        self._staging.flush()
        stager = self._staging.stager
        ready = stager.ready_snapshots()
        if self._rollbacks_due:  # what they staged is on a history about to be rewound
            ready = {vb: runs for vb, runs in ready.items() if vb not in self._rollbacks_due}
        batch = plan_commit(
            ready,
            {vb: s.committed for vb, s in self._state.items()},
            {vb: s.failover_log for vb, s in self._state.items() if s.failover_log is not None},
            self._thresholds_now(),
            batch_id=self._next_batch_id,
            now=self._clock(),
            force=force,
            targets_staged=self._targets_staged(ready),
        )
        if batch is None or batch.is_empty:
            return
        # Logs first: a position must never be persisted ahead of the history it is on.
        self._save_pending_logs()
        replace = frozenset(
            c.vbucket for c in batch.commits if self._state[c.vbucket].resync
        )
        stager.claim(batch)

        def commit() -> float:
            started = self._clock()
            self._store.commit(batch, replace=replace)
            seconds = self._clock() - started
            self._heartbeat_if_due()
            return seconds

        if self._committer is None or force:
            self._landed(batch, commit())
            return
        self._in_flight = CommitInFlight(batch, self._committer.submit(commit))

    def _heartbeat_due(self) -> bool:
        return self._clock() - self._last_heartbeat >= self._heartbeat_interval

    def _heartbeat_if_due(self) -> None:
        """Renew the claim when due (on the thread that commits, never while a commit runs)."""
        if self._heartbeat_due():
            self._store.heartbeat()
            self._last_heartbeat = self._clock()

    def _start_heartbeat(self) -> None:
        """A heartbeat with no commit in flight: in the background, as a commit would be."""
        def heartbeat() -> float:
            self._heartbeat_if_due()
            return 0.0

        if self._committer is None:
            heartbeat()
            return
        self._in_flight = CommitInFlight(None, self._committer.submit(heartbeat))

    def _finish_commit_in_flight(self) -> None:
        """Wait for the commit in flight, if any, and take its outcome (or raise its error)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            self._landed(in_flight.batch, in_flight.future.result())

    def _abandon_commit_in_flight(self) -> None:
        """The run is failing: let the commit in flight end (no write may outlive the run), and
        keep its outcome out of the way of the error already on its way up."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        error = in_flight.future.exception()
        if error is not None:
            batch = in_flight.batch
            what = "the heartbeat" if batch is None else f"batch {batch.batch_id}"
            log.warning("%s did not complete either: %s", what, error)

    def _landed(self, batch: CommitBatch | None, seconds: float) -> None:
        """The batch is committed (in `seconds`): drop its staged rows, move its positions."""
        if batch is None:
            return  # a heartbeat alone
        stager = self._staging.stager
        self._last_commit_seconds = seconds
        stager.release(batch)
        self._next_batch_id = batch.batch_id + 1
        self.stats.commits += 1
        self.stats.items_committed += batch.row_count
        self._source.note_progress(commit.vbucket for commit in batch.commits)
        self._watchdog.progressed(commit.vbucket for commit in batch.commits)
        for commit in batch.commits:
            state = self._state[commit.vbucket]
            state.committed = commit.position
            state.resync = False
            state.same_rollback_streak = 0
            if state.caught_up and state.streaming:
                self._source.close_stream(state.vbucket)
                state.streaming = False
        for listener in self._commit_listeners:
            listener(batch, seconds)

    def _targets_staged(self, ready: Mapping[int, Sequence[StagedSnapshots]]) -> bool:
        """A run with targets has every vbucket's target committed or staged: nothing more it
        needs is coming, so its last commits need not wait out the commit interval."""
        if self._targets is None:
            return False
        # Looked up vbucket by vbucket, so the usual answer (some vbucket is not there yet) comes
        # after a few lookups rather than after indexing every vbucket's ready runs.
        for vb, state in self._state.items():
            runs = ready.get(vb)
            staged = runs[-1].end_seqno if runs else 0
            if not state.reaches_target(max(state.committed.seqno, staged)):
                return False
        return True

    def _thresholds_now(self) -> CommitThresholds:
        return stretched_for_slow_commits(self._thresholds, self._last_commit_seconds)

    def _save_pending_logs(self) -> None:
        if self._pending_logs:
            self._store.save_failover_logs(dict(self._pending_logs))
            self._stored_logs.update(self._pending_logs)
            self._pending_logs.clear()

    def _report(self, *, force: bool = False) -> None:
        if self._progress is None or not (force or self._progress.due()):
            return
        target_total = sum(s.target_seqno or s.committed.seqno for s in self._state.values())
        committed_total = sum(s.committed.seqno for s in self._state.values())
        if self._targets is None:
            # A continuous run: lag against what the producer had at the last check.
            target_total = committed_total + self._source_watch.lag(self.positions())
        snapshot = ProgressSnapshot(
            items_committed=self.stats.items_committed,
            seqnos_committed=committed_total,
            seqnos_target=max(target_total, committed_total),
            commits=self.stats.commits,
            rollbacks=self.stats.rollbacks,
            vbuckets_caught_up=sum(1 for s in self._state.values() if s.caught_up),
            vbuckets_total=len(self._state),
            lag_seqnos=max(0, target_total - committed_total),
            reopening=self._watchdog.waiting,
            early_ends=self._watchdog.early_ends_total,
        )
        if force:
            self._progress.finish(snapshot)
        else:
            self._progress.update(snapshot)
