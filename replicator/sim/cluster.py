"""`SimCluster`: a simulated bucket served by several nodes, with rebalance and faults.

Each node is a `NodeServer` on its own port (ephemeral by default) and is active for part of
the vbucket map. The cluster answers the nodes' questions (who owns a vbucket, the current
cluster map), wakes their connections when the bucket changes, and is where tests inject
faults: failover, tombstone purge, rebalance, dropped or stalled connections, slow sends, a
malformed frame, node restarts with or without losing data.

>>> from replicator.sim.bucket import SimBucket
>>> with SimCluster(SimBucket("travel", num_vbuckets=8), nodes=2) as cluster:
...     cluster.connection_string.startswith("couchbase://127.0.0.1:")
True

Faults change the bucket's exact state, which a test reads back to compare with a mirror:

>>> bucket = SimBucket("travel", num_vbuckets=8, seed=1)
>>> with SimCluster(bucket, nodes=2) as cluster:
...     vb = bucket.upsert("airline_10", {"name": "40-Mile Air"}).vbucket
...     _ = bucket.upsert("airline_10", {"name": "Texas Wings"})
...     log = cluster.failover(vb, lose_last=1)  # the replica never got the second write
...     [entry.seqno for entry in log.entries]  # a new branch at seqno 1, newest first
...     [(record.key, record.value) for record in bucket.documents(vbucket=vb)]
...     owner = cluster.active_node(vb)
...     _ = cluster.rebalance("rotate")  # every vbucket moves to the next node
...     cluster.active_node(vb) == (owner + 1) % 2
[1, 0]
[(b'airline_10', b'{"name":"40-Mile Air"}')]
True
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType

from replicator.dcp.protocol.events import StreamEndReason
from replicator.dcp.transport.socket_io import format_address
from replicator.model.positions import FailoverLog
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster_config import BucketTopology, NodeEndpoint, encode_bucket_config
from replicator.sim.faults import MalformedFrame
from replicator.sim.history_items import DocumentItem
from replicator.sim.management import ManagementServer
from replicator.sim.sasl_server import CredentialStore
from replicator.sim.server import NodeServer, ServerOptions
from replicator.sim.session import Session

DEFAULT_USERNAME = "Administrator"
DEFAULT_PASSWORD = "password"
"""The credentials of a fresh Couchbase dev cluster."""


def server_tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server-side TLS context from a PEM certificate (chain) and its private key."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


class SimCluster:
    """Nodes serving one `SimBucket` over TCP on `host`.

    `base_port` 0 gives every node an ephemeral port; otherwise node i listens on
    base_port + i (and on tls_base_port + i for TLS when `tls_context` is given, ephemeral if
    tls_base_port is 0). Each node also serves the management REST API's cluster-map part on
    mgmt_base_port + i (ephemeral for 0), as its `mgmt` service in the cluster map. `users`
    maps user names to passwords (default: Administrator / password). Start it with `start()`
    or a `with` block.
    """

    def __init__(
        self,
        bucket: SimBucket,
        nodes: int = 2,
        *,
        host: str = "127.0.0.1",
        base_port: int = 0,
        users: Mapping[str, str] | None = None,
        tls_context: ssl.SSLContext | None = None,
        tls_base_port: int = 0,
        mgmt_base_port: int = 0,
        options: ServerOptions | None = None,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        if nodes > bucket.num_vbuckets:
            raise ValueError(f"{nodes} nodes cannot share {bucket.num_vbuckets} vbuckets")
        if not all(0 <= port <= 65535 - nodes for port in (base_port, tls_base_port,
                                                           mgmt_base_port)):
            raise ValueError("ports must leave room for one port per node below 65536")
        self._bucket = bucket
        self._host = host
        self._credentials = CredentialStore(
            users if users is not None else {DEFAULT_USERNAME: DEFAULT_PASSWORD}
        )
        self._options = options if options is not None else ServerOptions()
        self._tls_context = tls_context
        self._lock = threading.RLock()
        self._nodes = [
            NodeServer(
                self,
                index,
                host=host,
                port=base_port + index if base_port else 0,
                tls_context=tls_context,
                tls_port=tls_base_port + index if tls_base_port else 0,
            )
            for index in range(nodes)
        ]
        self._mgmt_base_port = mgmt_base_port
        self._management: list[ManagementServer] = []
        self._topology: BucketTopology | None = None
        self._config_cache: dict[tuple[int, int, int], bytes] = {}
        self._unsubscribe: Callable[[], None] | None = None
        self._started = False

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> SimCluster:
        """Bind every node's ports and start serving; returns self."""
        if self._started:
            return self
        try:
            for node in self._nodes:
                node.start()
                self._management.append(self._management_server(node.index))
        except OSError:
            for node in self._nodes:
                node.stop()
            self._stop_management()
            raise
        with self._lock:
            self._topology = BucketTopology.spread(
                self._bucket.name, self._endpoints(), self._bucket.num_vbuckets
            )
        self._unsubscribe = self._bucket.add_change_listener(self._on_bucket_change)
        self._started = True
        return self

    def close(self) -> None:
        """Stop every node and drop every connection."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        for node in self._nodes:
            node.stop()
        self._stop_management()
        self._started = False

    def __enter__(self) -> SimCluster:
        return self.start()

    def _management_server(self, index: int) -> ManagementServer:
        port = self._mgmt_base_port + index if self._mgmt_base_port else 0
        return ManagementServer(self, index, host=self._host, port=port).start()

    def _stop_management(self) -> None:
        for server in self._management:
            server.stop()
        self._management = []

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- what the nodes ask (ClusterContext) ------------------------------------------

    @property
    def bucket(self) -> SimBucket:
        return self._bucket

    @property
    def credentials(self) -> CredentialStore:
        return self._credentials

    @property
    def options(self) -> ServerOptions:
        return self._options

    def owns(self, node: int, vbucket: int) -> bool:
        """True if `node` is the active node of `vbucket`."""
        return self.topology.active_nodes[vbucket] == node

    def config_revision(self) -> tuple[int, int]:
        topology = self.topology
        return topology.rev_epoch, topology.rev

    def config_json(self, node: int) -> bytes:
        """The cluster map JSON as `node` hands it out (cached per revision)."""
        with self._lock:
            topology = self.topology
            manifest_uid = self._bucket.manifest.uid
            key = (topology.rev, node, manifest_uid)
            cached = self._config_cache.get(key)
            if cached is None:
                cached = encode_bucket_config(
                    topology,
                    this_node=node,
                    collections_manifest_uid=manifest_uid,
                    storage_backend=self._bucket.storage_backend,
                )
                if len(self._config_cache) > 64:
                    self._config_cache.clear()
                self._config_cache[key] = cached
            return cached

    def node_vbuckets(self, node: int) -> tuple[int, ...]:
        return self.topology.vbuckets_of(node)

    def scopes_json(self) -> bytes:
        """The bucket's scopes and collections as the management API lists them."""
        return self._bucket.manifest_rest_json().encode()

    def bucket_settings(self) -> dict[str, object]:
        """Bucket settings the full bucket config adds (the history retention of magma)."""
        bucket = self._bucket
        if not bucket.can_retain_history:
            return {}
        return {
            "historyRetentionSeconds": bucket.history_retention_seconds,
            "historyRetentionBytes": bucket.history_retention_bytes,
            "historyRetentionCollectionDefault": bucket.history_collection_default,
        }

    # -- reading ----------------------------------------------------------------------

    @property
    def topology(self) -> BucketTopology:
        """The current cluster map (raises before `start`)."""
        topology = self._topology
        if topology is None:
            raise RuntimeError("the cluster is not started")
        return topology

    @property
    def nodes(self) -> tuple[NodeServer, ...]:
        return tuple(self._nodes)

    def history_start_seqno(self, vbucket: int) -> int:
        """Where a vbucket's history window starts (0: no history retained)."""
        return self._bucket.history_start_seqno(vbucket)

    def history_revisions(self, vbucket: int) -> list[DocumentItem]:
        """The revisions a vbucket retains as history (`SimBucket.history_revisions`)."""
        return self._bucket.history_revisions(vbucket)

    def node(self, index: int) -> NodeServer:
        """The node at `index` (0-based)."""
        if not 0 <= index < len(self._nodes):
            raise ValueError(f"no node {index}: the cluster has nodes 0..{len(self._nodes) - 1}")
        return self._nodes[index]

    def active_node(self, vbucket: int) -> int:
        """The index of the node active for `vbucket`."""
        return self.topology.active_nodes[vbucket]

    @property
    def connection_string(self) -> str:
        """`couchbase://host:port,.../bucket` over every node's plain port."""
        hosts = ",".join(format_address(self._host, node.port) for node in self._nodes)
        return f"couchbase://{hosts}/{self._bucket.name}"

    @property
    def management_urls(self) -> tuple[str, ...]:
        """Each node's management (REST) endpoint, `http://host:port`."""
        return tuple(
            f"http://{format_address(self._host, server.port)}" for server in self._management
        )

    @property
    def tls_connection_string(self) -> str | None:
        """`couchbases://host:tls_port,.../bucket`, None when the cluster serves no TLS."""
        if self._tls_context is None:
            return None
        ports = [node.tls_port for node in self._nodes]
        hosts = ",".join(format_address(self._host, port) for port in ports if port is not None)
        return f"couchbases://{hosts}/{self._bucket.name}"

    def sessions(self, node: int | None = None) -> list[Session]:
        """Live connections, of one node or of all."""
        nodes = self._nodes if node is None else [self.node(node)]
        return [session for n in nodes for session in n.sessions()]

    # -- topology changes -------------------------------------------------------------

    def rebalance(self, moves: Mapping[int, int] | str = "spread") -> BucketTopology:
        """Move vbuckets between nodes; returns the new cluster map.

        `moves` maps vbucket -> new node, or names a plan: "spread" (even contiguous ranges
        over all nodes, as after adding a node) or "rotate" (every vbucket to the next node).
        Streams of moved vbuckets end with STATE_CHANGED, stream requests to the old node
        answer NOT_MY_VBUCKET with the new map, and clients that asked for cluster-map
        notifications get one.
        """
        with self._lock:
            current = self.topology
            plan = self._plan(current, moves)
            changed = {vb: node for vb, node in plan.items() if current.active_nodes[vb] != node}
            if not changed:
                return current
            self._topology = current.moved(changed)
            new = self._topology
        by_old_owner: dict[int, set[int]] = {}
        for vb in changed:
            by_old_owner.setdefault(current.active_nodes[vb], set()).add(vb)
        for owner, vbuckets in by_old_owner.items():
            for session in self._nodes[owner].sessions():
                session.end_streams(vbuckets, StreamEndReason.STATE_CHANGED)
        self._push_cluster_map()
        return new

    def add_node(self) -> int:
        """Start one more node (owning nothing until a rebalance); returns its index."""
        with self._lock:
            index = len(self._nodes)
            node = NodeServer(self, index, host=self._host, tls_context=self._tls_context)
            node.start()
            self._management.append(self._management_server(index))
            self._nodes.append(node)
            self._topology = self.topology.with_nodes(self._endpoints())
        self._push_cluster_map()
        return index

    def _plan(self, current: BucketTopology, moves: Mapping[int, int] | str) -> dict[int, int]:
        count = len(self._nodes)
        if moves == "spread":
            spread = BucketTopology.spread(current.bucket, current.nodes, current.num_vbuckets)
            return dict(enumerate(spread.active_nodes))
        if moves == "rotate":
            return {vb: (owner + 1) % count for vb, owner in enumerate(current.active_nodes)}
        if isinstance(moves, str):
            raise ValueError(f"unknown rebalance plan {moves!r}: use 'spread', 'rotate' or a map")
        return dict(moves)

    def _endpoints(self) -> list[NodeEndpoint]:
        return [
            NodeEndpoint(
                self._host,
                node.port,
                node.tls_port,
                mgmt_port=self._management[node.index].port,
            )
            for node in self._nodes
        ]

    def _push_cluster_map(self) -> None:
        for session in self.sessions():
            session.push_cluster_map()
        for server in self._management:
            server.notify_changed()

    def _on_bucket_change(self, vbuckets: frozenset[int]) -> None:
        for node in self._nodes:
            for session in node.sessions():
                session.notify_changed(vbuckets)

    # -- faults -----------------------------------------------------------------------

    def failover(self, vbucket: int, lose_last: int) -> FailoverLog:
        """Fail `vbucket` over to a replica that lacked its last `lose_last` items.

        Its open streams end with STATE_CHANGED; a consumer that saw the lost items is told to
        roll back when it reconnects. Returns the new failover log.
        """
        return self._bucket.failover(vbucket, lose_last)

    def lose_history(self, vbucket: int, lose_last: int) -> FailoverLog:
        """Forget `vbucket`'s last `lose_last` items under the same uuid, as a producer that
        restarted with older data and kept its failover log would: no real server does this,
        and a consumer that committed the lost items must notice it itself. Returns the
        (unchanged) failover log."""
        return self._bucket.lose_history(vbucket, lose_last)

    def end_streams(self, reason: StreamEndReason, vbuckets: Iterable[int] | None = None) -> None:
        """End open streams (of these vbuckets, else all) with STREAM_END `reason`, unasked:
        OK on an open-ended stream is what a producer that stops after its backfill sends."""
        for node in self._nodes:
            node.end_streams(reason, vbuckets)

    def refuse_commands(self, *opcodes: int) -> None:
        """Answer these requests UNKNOWN_COMMAND on every node, as a server without them would
        (no arguments: accept everything again)."""
        for node in self._nodes:
            node.refused_opcodes = frozenset(int(op) for op in opcodes)

    def always_send_malformed(self, kind: MalformedFrame | None) -> None:
        """Break the first mutation, deletion or expiration of every connection, present and
        future, after its good snapshot marker (None stops it): a producer whose document
        frames this consumer refuses, every time it reconnects."""
        for node in self._nodes:
            node.malformed_documents = kind
            if kind is not None:
                node.inject_malformed_documents(kind)

    def purge_tombstones(self, vbucket: int, up_to: int | None = None) -> int:
        """Purge a vbucket's tombstones (all, or up to a seqno); returns the purge seqno."""
        return self._bucket.purge_tombstones(vbucket, up_to)

    def drop_connections(self, node: int | None = None) -> None:
        """Close every connection, of one node or of all; returns once they are closed."""
        for target in self._targets(node):
            target.drop_connections()

    def stall(self, node: int | None = None) -> None:
        """Connections (present and new) send nothing, not even noops, until `release`."""
        for target in self._targets(node):
            target.stall()

    def release(self, node: int | None = None) -> None:
        """End a stall."""
        for target in self._targets(node):
            target.release()

    def slow_sending(self, bytes_per_second: int | None, node: int | None = None) -> None:
        """Cap each connection's send rate (None lifts the cap)."""
        for target in self._targets(node):
            target.set_send_rate(bytes_per_second)

    def send_malformed_frame(self, kind: MalformedFrame, node: int | None = None) -> int:
        """Break the next DCP message of each open DCP connection; returns how many."""
        return sum(target.inject_malformed(kind) for target in self._targets(node))

    def restart_node(self, node: int, *, lose_last: int | None = None, wipe: bool = False) -> None:
        """Restart a node on the same ports: its connections drop, clients must reconnect.

        By default the data survives (a clean restart). `lose_last=K` simulates an unclean
        shutdown: each vbucket the node owns loses its last K items (at most all of them)
        and starts a new failover-log entry. `wipe` loses everything: the vbuckets come back
        empty with a new history, and consumers must roll back to 0.
        """
        target = self.node(node)
        target.stop()
        if wipe or lose_last is not None:
            for vb in self.node_vbuckets(node):
                high = self._bucket.vbucket(vb).high_seqno
                lost = high if wipe else min(max(lose_last or 0, 0), high)
                self._bucket.failover(vb, lost)
        target.start()

    def _targets(self, node: int | None) -> list[NodeServer]:
        return list(self._nodes) if node is None else [self.node(node)]
