"""The newest cluster map the client has seen, and how newer ones are adopted: pushed by a
node, carried by a NOT_MY_VBUCKET reply, or fetched with GET_CLUSTER_CONFIG.

A map is adopted only when it is newer (epoch, revision) than the current one; routing reads
the current map under the client's lock, and waiters are woken on every change.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

from replicator.dcp.cluster.cluster_map import ClusterMap, parse_cluster_map
from replicator.dcp.cluster.state import ClientState
from replicator.dcp.protocol.opcodes import Status
from replicator.dcp.protocol.pushes import ClustermapChangeNotification
from replicator.dcp.protocol.requests import GetClusterConfig
from replicator.dcp.protocol.responses import Response
from replicator.dcp.transport.connection import NodeConnection
from replicator.dcp.transport.pending import response_value
from replicator.errors import ConnectionLostError, ReplicatorError

log = logging.getLogger(__name__)


class MapTracker:
    """The current cluster map (None until bootstrap) and its adoption."""

    def __init__(self, state: ClientState) -> None:
        self._state = state
        self.current: ClusterMap | None = None
        """The newest map seen; read and replaced under the client's lock."""

    def newest(self) -> ClusterMap:
        """The current map (after bootstrap)."""
        with self._state.lock:
            assert self.current is not None
            return self.current

    def adopt(self, raw: bytes, connected_host: str) -> None:
        """Take the map in `raw` when it parses and is newer than the current one."""
        try:
            candidate = parse_cluster_map(raw, connected_host=connected_host)
        except ReplicatorError as exc:
            log.warning("ignoring a cluster map that does not parse: %s", exc)
            return
        with self._state.cond:
            if not candidate.is_newer_than(self.current):
                return
            log.info(
                "cluster map rev %s replaces %s",
                candidate.version,
                None if self.current is None else self.current.version,
            )
            self.current = candidate
            self._state.cond.notify_all()

    def is_behind(self, notification: ClustermapChangeNotification) -> bool:
        """A pushed revision is newer than the current map (fetch it)."""
        with self._state.lock:
            current = (0, 0) if self.current is None else self.current.version
        return (notification.epoch or 0, notification.revision) > current

    def refresh(self, candidates: Sequence[NodeConnection]) -> None:
        """Ask the first candidate that takes the request for its map; adopt it if newer."""
        for connection in candidates:
            try:
                connection.request(
                    GetClusterConfig(), on_response=partial(self._on_config_reply, connection)
                )
                return
            except ConnectionLostError:
                continue

    def refresh_now(
        self, connection: NodeConnection, reply: Response, timeout: float | None
    ) -> None:
        """After a NOT_MY_VBUCKET reply: adopt the map it carries, else fetch and adopt one."""
        config = response_value(reply) if reply.status == Status.NOT_MY_VBUCKET else b""
        if not config:
            fetched = connection.call(GetClusterConfig(), timeout)
            if fetched.status != Status.SUCCESS:
                return
            config = response_value(fetched)
        self.adopt(config, connection.host)

    def _on_config_reply(self, connection: NodeConnection, reply: Response) -> None:
        if reply.status == Status.SUCCESS:
            self.adopt(response_value(reply), connection.host)
