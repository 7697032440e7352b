"""What every part of the DCP client shares: its one lock, whether it is closed, and the
failures `poll` raises.

One lock for the whole client (node pool, cluster map, streams, event queue): a connection
loss, a stream reply or a map change touches several of them in one critical section.
"""

from __future__ import annotations

import collections
import logging
import threading

from replicator.errors import ConfigError, ReplicatorError

log = logging.getLogger(__name__)


class ClientState:
    """The client's lock and condition (an RLock: parts call each other with it held), its
    life cycle, and the errors waiting for `poll`."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.stop = threading.Event()
        """Set on close: reconnect threads stop waiting and give up."""
        self.closed = False
        self.fatal: ReplicatorError | None = None
        """The client's failure (reconnect deadline passed, credentials refused): `poll`
        raises it from then on."""
        self.errors: collections.deque[BaseException] = collections.deque()
        """Streams' failures, each raised once by `poll`."""

    def check_open(self) -> None:
        """Raise the fatal error, or ConfigError once closed (lock held)."""
        if self.fatal is not None:
            raise self.fatal
        if self.closed:
            raise ConfigError("the client is closed")

    def set_fatal(self, error: ReplicatorError) -> None:
        log.error("DCP client failed: %s", error)
        with self.cond:
            if self.fatal is None:
                self.fatal = error
            self.cond.notify_all()
