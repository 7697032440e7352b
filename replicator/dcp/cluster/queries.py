"""One-shot requests to the cluster: a vbucket's failover log, the high seqnos, the
collections manifest. Each waits for the connection it needs, asks, and reads the reply."""

from __future__ import annotations

import json

from replicator.dcp.cluster.map_tracker import MapTracker
from replicator.dcp.cluster.nodes import NodePool
from replicator.dcp.protocol.dcp_requests import GetFailoverLog
from replicator.dcp.protocol.opcodes import Opcode, Status, VbucketState
from replicator.dcp.protocol.requests import GetAllVbSeqnos, GetCollectionsManifest
from replicator.dcp.protocol.responses import Response, failover_log_of, vbucket_seqnos_of
from replicator.dcp.transport.connection import NodeConnection
from replicator.dcp.transport.pending import response_value
from replicator.errors import ConfigError, ProtocolError, UnsupportedCommandError
from replicator.model.positions import FailoverLog


class ClusterQueries:
    """The client's one-shot requests, over the node pool's connections."""

    def __init__(self, nodes: NodePool, maps: MapTracker) -> None:
        self._nodes = nodes
        self._maps = maps

    def failover_log(self, vbucket: int, *, timeout: float | None = None) -> FailoverLog:
        """The vbucket's current failover log from its active node (GET_FAILOVER_LOG)."""
        for _ in range(3):
            connection = self._nodes.connection_for(vbucket, timeout)
            reply = connection.call(GetFailoverLog(vbucket), timeout)
            if reply.status == Status.NOT_MY_VBUCKET:
                self._maps.refresh_now(connection, reply, timeout)
                continue
            if reply.status != Status.SUCCESS:
                raise ProtocolError(
                    f"vbucket {vbucket}: GET_FAILOVER_LOG failed on {connection.address}: "
                    f"{reply.status_name}",
                    opcode=Opcode.DCP_GET_FAILOVER_LOG,
                )
            return failover_log_of(reply)
        raise ProtocolError(
            f"vbucket {vbucket}: nodes keep answering NOT_MY_VBUCKET",
            opcode=Opcode.DCP_GET_FAILOVER_LOG,
        )

    def high_seqnos(
        self, *, timeout: float | None = None, connected_only: bool = False
    ) -> dict[int, int]:
        """Every active vbucket's high seqno (GET_ALL_VB_SEQNOS on each node).

        `connected_only`: ask only the nodes connected now, without waiting for the others
        (their vbuckets are missing from the answer): a periodic check must not stall its
        caller while a node is down.
        """
        cluster_map = self._maps.newest()
        seqnos: dict[int, int] = {}
        for node in cluster_map.nodes:
            owned = set(cluster_map.vbuckets_of(node))
            if not owned:
                continue
            if connected_only and self._nodes.connected(node) is None:
                continue
            connection = self._nodes.connection_to(node, timeout)
            reply = connection.call(GetAllVbSeqnos(VbucketState.ACTIVE), timeout)
            if reply.status != Status.SUCCESS:
                raise _refused(
                    connection, reply, Opcode.GET_ALL_VB_SEQNOS, "its vbuckets' high seqnos"
                )
            for record in vbucket_seqnos_of(reply):
                if record.vbucket in owned:
                    seqnos[record.vbucket] = record.seqno
        return seqnos

    def collections_manifest(self, *, timeout: float | None = None) -> dict[str, object]:
        """The bucket's collections manifest JSON (GET_COLLECTIONS_MANIFEST)."""
        connection = self._nodes.any_connection(timeout)
        if not connection.collections:
            raise ConfigError(
                f"{connection.address} did not negotiate collections: no manifest to fetch"
            )
        reply = connection.call(GetCollectionsManifest(), timeout)
        if reply.status != Status.SUCCESS:
            raise _refused(
                connection, reply, Opcode.GET_COLLECTIONS_MANIFEST, "the bucket's collections"
            )
        try:
            manifest = json.loads(response_value(reply))
        except ValueError as exc:
            raise ProtocolError(
                f"collections manifest is not JSON: {exc}", opcode=Opcode.GET_COLLECTIONS_MANIFEST
            ) from None
        if not isinstance(manifest, dict):
            raise ProtocolError(
                "collections manifest is not a JSON object", opcode=Opcode.GET_COLLECTIONS_MANIFEST
            )
        return manifest


def _refused(
    connection: NodeConnection, reply: Response, opcode: Opcode, what: str
) -> UnsupportedCommandError:
    """A node answered a request the caller needs with an error: name it and the command."""
    return UnsupportedCommandError(
        connection.address,
        f"{opcode.name} (0x{int(opcode):02x}) refused ({reply.status_name}): the node cannot "
        f"tell {what}",
        command=opcode.name,
    )
