"""Delta checkpoints of versions the replicator committed without Spark, written off the commit
thread.

Spark checkpoints a table's log after its own commits whose version is a multiple of
DELTA_CHECKPOINT_INTERVAL; after versions committed without it (Arrow appends, deletion-vector
merges, compactions) the replicator asks Delta for that checkpoint itself, or every reader would
replay a growing log. The checkpoint is a Spark job over the whole log state: 2 to 5 s of the
commit thread every ten versions on the 1,000,000-document mirror at 20,000 changes/s, the
longest gaps between its commits (README, "The steady writer in a process of its own"). A
checkpoint only summarises versions that have landed, so it need not hold up the next one: it is
written here, on a thread of its own per table, while commits go on. Requests made while one
is written are folded into one more, of the newest version then; `wait_for_checkpoints` lets a
run's end (and a test) wait for the one in flight.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from replicator.delta.table import (
    DELTA_CHECKPOINT_INTERVAL,
    checkpoint_delta_log,
    engine_error_summary,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class _Checkpointer:
    """The checkpoint thread of one table."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._pending: tuple[SparkSession, int] | None = None
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None

    def request(self, spark: SparkSession, version: int) -> None:
        with self._lock:
            self._pending = (spark, version)
            self._idle.clear()
            self._wake.set()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="delta-checkpoints", daemon=True
                )
                self._thread.start()

    def wait(self, timeout_s: float) -> bool:
        return self._idle.wait(timeout_s)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            with self._lock:
                job, self._pending = self._pending, None
                self._wake.clear()
            if job is not None:
                spark, version = job
                try:
                    checkpoint_delta_log(spark, self.path)
                except Exception as exc:
                    log.warning(
                        "Delta checkpoint after version %d failed (the version stands): %s",
                        version, engine_error_summary(exc),
                    )  # fmt: skip
            with self._lock:
                if self._pending is None:
                    self._idle.set()


_CHECKPOINTERS: dict[str, _Checkpointer] = {}
_REGISTRY_LOCK = threading.Lock()


def _checkpointer(path: str) -> _Checkpointer:
    with _REGISTRY_LOCK:
        found = _CHECKPOINTERS.get(path)
        if found is None:
            found = _CHECKPOINTERS[path] = _Checkpointer(path)
        return found


def checkpoint_if_due(spark: SparkSession, path: str, version: int) -> None:
    """Ask for Delta's checkpoint after `version`, committed without Spark, when Spark would
    have written one (every DELTA_CHECKPOINT_INTERVAL versions); written on the table's
    checkpoint thread. The version has landed: a failure there is logged, and the next
    interval tries again."""
    if version % DELTA_CHECKPOINT_INTERVAL == 0:
        _checkpointer(path).request(spark, version)


def wait_for_checkpoints(path: str, timeout_s: float = 300.0) -> bool:
    """Wait until no checkpoint of the table at `path` is asked for or being written; False
    when `timeout_s` passed first."""
    with _REGISTRY_LOCK:
        found = _CHECKPOINTERS.get(path)
    return found is None or found.wait(timeout_s)
