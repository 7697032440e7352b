"""The bucket configuration (cluster map) a simulated node hands out, shaped as Couchbase's.

Clients bootstrap from this JSON (GET_CLUSTER_CONFIG, the body of a NOT_MY_VBUCKET reply, a
cluster-map change notification): `vBucketServerMap` says which node is active for each
vbucket, `nodesExt` which ports a node's services listen on. The shape follows real configs
(compare shared/vectors/java-dcp-client/*.json): rev and revEpoch, nodeLocator `vbucket`,
hashAlgorithm CRC, `nodes` and `nodesExt` with `thisNode` on the node that answered.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from replicator.dcp.transport.socket_io import format_address

BUCKET_CAPABILITIES = (
    "collections",
    "durableWrite",
    "tombstonedUserXAttrs",
    "subdoc.ReplaceBodyWithXattr",
    "subdoc.DocumentMacroSupport",
    "subdoc.ReviveDocument",
    "dcp",
    "cbhello",
    "touch",
    "cccp",
    "xdcrCheckpointing",
    "nodesExt",
    "xattr",
)
"""What a 7.x Couchbase bucket advertises; `dcp`, `collections` and `xattr` matter to DCP."""

FIRST_MGMT_PORT = 9000
"""Management ports as a cluster_run dev cluster numbers them (a SimCluster's serve the REST
API's cluster-map endpoints on ports of their own, `replicator.sim.management`)."""


@dataclass(frozen=True, slots=True)
class NodeEndpoint:
    """Where one node listens: the data service (kv), its TLS port if any, and a mgmt port.

    Several simulated nodes share a host and differ by port, as in a cluster_run dev cluster.
    """

    host: str
    kv_port: int
    kv_tls_port: int | None = None
    mgmt_port: int = FIRST_MGMT_PORT

    @property
    def kv_address(self) -> str:
        """`host:kv_port` as the config's serverList names the node."""
        return format_address(self.host, self.kv_port)


@dataclass(frozen=True, slots=True)
class BucketTopology:
    """One revision of the cluster map: the nodes and the active node of every vbucket.

    `active_nodes[vb]` is an index into `nodes`. Each change of the map is a new value with a
    higher `rev` (clients keep the map with the highest (rev_epoch, rev)).
    """

    bucket: str
    nodes: tuple[NodeEndpoint, ...]
    active_nodes: tuple[int, ...]
    rev: int = 1
    rev_epoch: int = 1

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("a cluster map needs at least one node")
        if not self.active_nodes:
            raise ValueError("a cluster map needs at least one vbucket")
        bad = [vb for vb, node in enumerate(self.active_nodes) if not 0 <= node < len(self.nodes)]
        if bad:
            raise ValueError(f"vbuckets {bad[:5]} map to nodes outside 0..{len(self.nodes) - 1}")

    @classmethod
    def spread(
        cls, bucket: str, nodes: Sequence[NodeEndpoint], num_vbuckets: int, *, rev: int = 1
    ) -> BucketTopology:
        """Vbuckets split into contiguous, even ranges over the nodes, as ns_server lays them out.

        >>> nodes = [NodeEndpoint("127.0.0.1", 12000), NodeEndpoint("127.0.0.1", 12002)]
        >>> BucketTopology.spread("b", nodes, 4).active_nodes
        (0, 0, 1, 1)
        """
        if num_vbuckets < 1:
            raise ValueError(f"num_vbuckets must be positive, got {num_vbuckets}")
        count = len(nodes)
        owners = tuple(vb * count // num_vbuckets for vb in range(num_vbuckets))
        return cls(bucket, tuple(nodes), owners, rev)

    @property
    def num_vbuckets(self) -> int:
        return len(self.active_nodes)

    def vbuckets_of(self, node: int) -> tuple[int, ...]:
        """The vbuckets `node` is active for, ascending."""
        return tuple(vb for vb, owner in enumerate(self.active_nodes) if owner == node)

    def moved(self, moves: Mapping[int, int]) -> BucketTopology:
        """The next revision with `moves` (vbucket -> new active node) applied."""
        owners = list(self.active_nodes)
        for vb, node in moves.items():
            if not 0 <= vb < len(owners):
                raise ValueError(f"vbucket {vb} is not in 0..{len(owners) - 1}")
            if not 0 <= node < len(self.nodes):
                raise ValueError(f"vbucket {vb}: node {node} is not in 0..{len(self.nodes) - 1}")
            owners[vb] = node
        return replace(self, active_nodes=tuple(owners), rev=self.rev + 1)

    def with_nodes(self, nodes: Sequence[NodeEndpoint]) -> BucketTopology:
        """The next revision with a new node list (a node added or its ports changed)."""
        return replace(self, nodes=tuple(nodes), rev=self.rev + 1)


def bucket_uuid(bucket: str) -> str:
    """A stable 32-hex-digit bucket uuid derived from the name (real ones are random)."""
    return hashlib.md5(bucket.encode(), usedforsecurity=False).hexdigest()


def bucket_config(
    topology: BucketTopology,
    *,
    this_node: int | None = None,
    collections_manifest_uid: int = 0,
    storage_backend: str = "couchstore",
) -> dict[str, Any]:
    """The bucket config as a JSON-ready dict; `this_node` marks the answering node."""
    name = topology.bucket
    uuid = bucket_uuid(name)
    nodes_ext: list[dict[str, Any]] = []
    legacy_nodes: list[dict[str, Any]] = []
    for index, node in enumerate(topology.nodes):
        services: dict[str, int] = {"kv": node.kv_port, "mgmt": node.mgmt_port}
        if node.kv_tls_port is not None:
            services["kvSSL"] = node.kv_tls_port
        entry: dict[str, Any] = {"services": services, "hostname": node.host}
        if index == this_node:
            entry["thisNode"] = True
        nodes_ext.append(entry)
        legacy_nodes.append(
            {
                "hostname": format_address(node.host, node.mgmt_port),
                "ports": {"direct": node.kv_port},
            }
        )
    return {
        "rev": topology.rev,
        "revEpoch": topology.rev_epoch,
        "name": name,
        "nodeLocator": "vbucket",
        "bucketType": "membase",
        "storageBackend": storage_backend,
        "uuid": uuid,
        "uri": f"/pools/default/buckets/{name}?bucket_uuid={uuid}",
        "streamingUri": f"/pools/default/bucketsStreaming/{name}?bucket_uuid={uuid}",
        "numVBuckets": topology.num_vbuckets,
        "bucketCapabilitiesVer": "",
        "bucketCapabilities": list(BUCKET_CAPABILITIES),
        "collectionsManifestUid": f"{collections_manifest_uid:x}",
        "ddocs": {"uri": f"/pools/default/buckets/{name}/ddocs"},
        "vBucketServerMap": {
            "hashAlgorithm": "CRC",
            "numReplicas": 0,
            "serverList": [node.kv_address for node in topology.nodes],
            "vBucketMap": [[owner] for owner in topology.active_nodes],
        },
        "nodes": legacy_nodes,
        "nodesExt": nodes_ext,
        "clusterCapabilitiesVer": [1, 0],
        "clusterCapabilities": {"n1ql": ["enhancedPreparedStatements"]},
    }


def encode_bucket_config(
    topology: BucketTopology,
    *,
    this_node: int | None = None,
    collections_manifest_uid: int = 0,
    storage_backend: str = "couchstore",
) -> bytes:
    """The bucket config as compact JSON bytes, ready for a response value."""
    config = bucket_config(
        topology,
        this_node=this_node,
        collections_manifest_uid=collections_manifest_uid,
        storage_backend=storage_backend,
    )
    return json.dumps(config, separators=(",", ":")).encode()
