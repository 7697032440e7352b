"""Each node's streak of failed connections: what paces its reconnects and when to give up.

A streak counts a node's connections in a row that could not be opened or broke before being
stable (or proven by committed progress); its first failure starts the reconnect deadline.
Pure bookkeeping: the node pool calls it with the client's lock held.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from replicator.dcp.cluster.cluster_map import KvNode
from replicator.dcp.cluster.options import ClientOptions
from replicator.errors import ConnectionLostError, ProtocolError, ReplicatorError

log = logging.getLogger(__name__)

SAME_FRAME_REPORTED_AFTER = 3
"""Connections in a row broken by the same refused frame before an error line says so."""


@dataclass(slots=True)
class FailureStreak:
    """A node's connections in a row that could not be opened or broke before being stable."""

    first_at: float
    """time.monotonic() of the streak's first failure: the reconnect deadline counts from it."""
    failures: int = 0
    last_cause: ReplicatorError | None = None
    same_cause: int = 0
    """How many failures in a row ended with the same error text as `last_cause`."""


class FailureStreaks:
    """The current streak of every node that has one. The caller holds the client's lock."""

    def __init__(self, options: ClientOptions) -> None:
        self._options = options
        self._by_node: dict[KvNode, FailureStreak] = {}

    def get(self, node: KvNode) -> FailureStreak | None:
        return self._by_node.get(node)

    def forget(self, node: KvNode) -> None:
        self._by_node.pop(node, None)

    def count(self, node: KvNode, cause: ReplicatorError, *, fresh: bool) -> int:
        """Count a failed or broken connection to `node`; the streak's length.

        `fresh`: the broken connection had been stable, so a new streak starts.
        """
        streak = self._by_node.get(node)
        if streak is None or fresh:
            streak = FailureStreak(first_at=time.monotonic())
            self._by_node[node] = streak
        streak.failures += 1
        same = streak.last_cause is not None and str(streak.last_cause) == str(cause)
        streak.same_cause = streak.same_cause + 1 if same else 1
        streak.last_cause = cause
        if isinstance(cause, ProtocolError) and streak.same_cause == SAME_FRAME_REPORTED_AFTER:
            left = self._options.reconnect.deadline - (time.monotonic() - streak.first_at)
            log.error(
                "%s: the same frame was refused %d times in a row, on every new connection: %s; "
                "reconnecting with backoff until the deadline (%.0f s left), then the run fails",
                node, streak.same_cause, cause, max(0.0, left),
            )
        return streak.failures

    def gave_up_on(self, node: KvNode, streak: FailureStreak) -> ConnectionLostError:
        """The fatal error of a node whose streak outlasted the reconnect deadline."""
        cause = streak.last_cause
        if isinstance(cause, ProtocolError) and streak.same_cause > 1:
            what = (
                f"the same frame was refused {streak.same_cause} times in a row ({cause}); the "
                "producer sends something this consumer cannot apply: check the server's version "
                "and DCP settings, or report the frame; the mirror stays at its committed "
                "position and a new run resumes from there"
            )
        elif isinstance(cause, ProtocolError):
            what = (
                f"{streak.failures} connections in a row broke before committing anything; "
                f"last cause: {cause}; check the server's version and DCP settings"
            )
        else:
            what = (
                f"{streak.failures} connections in a row failed, or broke within "
                f"{self._options.connection_stable_after:g} s before committing anything; last "
                f"cause: {cause}; check that the node is up and reachable from this host"
            )
        return ConnectionLostError(
            str(node), f"could not reconnect within {self._options.reconnect.deadline:g} s: {what}"
        )
