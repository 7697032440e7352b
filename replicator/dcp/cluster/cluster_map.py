"""The bucket's cluster map: which data node holds the active copy of each vbucket.

Parsed from the JSON a node returns for GET_CLUSTER_CONFIG (0xb5), pushes in a cluster-map change
notification, or puts in a NOT_MY_VBUCKET response. What we read:

- `rev` and `revEpoch` (0 when absent): a map replaces another only when (revEpoch, rev) is
  greater.
- `vBucketServerMap.serverList` (`host:port` of each data node's plain port) and
  `vBucketServerMap.vBucketMap` (per vbucket, server indexes: active first, then replicas; -1
  is "none").
- `nodesExt[].services.kv` / `kvSSL` to learn each node's TLS port; `nodesExt[].hostname` is
  absent when the node is the one we asked.

`$HOST` in a host position stands for "the address you connected to" (a node configured on
localhost does not know its own external name).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replicator.dcp.transport.socket_io import format_address
from replicator.errors import ConfigError, ProtocolError

HOST_PLACEHOLDER = "$HOST"


@dataclass(frozen=True, slots=True)
class KvNode:
    """A data-service node: host (IPv6 without brackets), plain port, TLS port when known."""

    host: str
    kv_port: int
    kv_tls_port: int | None = field(default=None, compare=False)
    """Not part of the node's identity: a later map may add it."""

    def port(self, *, tls: bool) -> int:
        """The port to connect to; ConfigError when TLS is asked and the map gave no TLS port."""
        if not tls:
            return self.kv_port
        if self.kv_tls_port is None:
            raise ConfigError(
                f"node {self.address(tls=False)}: the cluster map lists no kvSSL port, "
                "so it cannot be reached with couchbases://"
            )
        return self.kv_tls_port

    def address(self, *, tls: bool) -> str:
        """`host:port` of the port we would connect to."""
        return format_address(self.host, self.port(tls=tls))

    def __str__(self) -> str:
        return format_address(self.host, self.kv_port)


@dataclass(frozen=True, slots=True)
class ClusterMap:
    """A bucket's vbucket-to-node map at one revision."""

    bucket: str
    rev: int
    rev_epoch: int
    nodes: tuple[KvNode, ...]
    active_index: tuple[int, ...]
    """Per vbucket, the index in `nodes` of the active copy, -1 when none is active."""
    bucket_uuid: str = ""
    capabilities: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for vb, index in enumerate(self.active_index):
            if not -1 <= index < len(self.nodes):
                raise ProtocolError(
                    f"cluster map rev {self.rev}: vbucket {vb} points at server {index}, "
                    f"but the server list has {len(self.nodes)} entries"
                )

    @property
    def num_vbuckets(self) -> int:
        return len(self.active_index)

    @property
    def version(self) -> tuple[int, int]:
        """(revEpoch, rev): what decides which of two maps is newer."""
        return (self.rev_epoch, self.rev)

    def is_newer_than(self, other: ClusterMap | None) -> bool:
        """True when this map should replace `other` (always, when there is none)."""
        return other is None or self.version > other.version

    def active_node(self, vbucket: int) -> KvNode | None:
        """The node holding `vbucket`'s active copy, None while no copy is active."""
        self._check_vbucket(vbucket)
        index = self.active_index[vbucket]
        return None if index < 0 else self.nodes[index]

    def vbuckets_of(self, node: KvNode) -> tuple[int, ...]:
        """The vbuckets whose active copy is on `node`, ascending."""
        if node not in self.nodes:
            return ()
        index = self.nodes.index(node)
        return tuple(vb for vb, i in enumerate(self.active_index) if i == index)

    def node_for(self, host: str, kv_port: int) -> KvNode | None:
        """The node with this host and plain data port (either port when TLS), if listed."""
        for node in self.nodes:
            if node.host == host and kv_port in (node.kv_port, node.kv_tls_port):
                return node
        return None

    def _check_vbucket(self, vbucket: int) -> None:
        if not 0 <= vbucket < len(self.active_index):
            raise ConfigError(
                f"vbucket {vbucket} is out of range: bucket {self.bucket!r} has "
                f"{len(self.active_index)} vbuckets (0-{len(self.active_index) - 1})"
            )


def parse_cluster_map(
    config: bytes | str | Mapping[str, Any], *, connected_host: str
) -> ClusterMap:
    """Parse a bucket config; `connected_host` replaces `$HOST` and absent nodesExt hostnames.

    Raises ProtocolError when the JSON is malformed or inconsistent, ConfigError when the bucket
    has no vbucket map (a memcached bucket cannot be streamed with DCP).
    """
    document = _load(config)
    try:
        return _parse(document, _strip_brackets(connected_host))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"cluster config is malformed: {type(exc).__name__}: {exc}") from None


def _load(config: bytes | str | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return config
    try:
        document = json.loads(config)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"cluster config is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ProtocolError("cluster config is not a JSON object")
    return document


def _parse(document: Mapping[str, Any], connected_host: str) -> ClusterMap:
    rev = _int(document, "rev")
    rev_epoch = _int(document, "revEpoch") if "revEpoch" in document else 0
    bucket = document.get("name", "")
    server_map = document.get("vBucketServerMap")
    if not isinstance(server_map, Mapping):
        raise ConfigError(
            f"bucket {bucket!r} has no vBucketServerMap (not a Couchbase bucket?): "
            "DCP needs a Couchbase or Ephemeral bucket"
        )
    server_list = server_map["serverList"]
    vbucket_map = server_map["vBucketMap"]
    if not isinstance(server_list, list) or not isinstance(vbucket_map, list):
        raise ProtocolError("cluster config: serverList and vBucketMap must be lists")
    tls_ports = _tls_ports(document.get("nodesExt") or [], connected_host)
    nodes: list[KvNode] = []
    for entry in server_list:
        host, port = _split_host_port(str(entry), connected_host)
        nodes.append(KvNode(host, port, tls_ports.get((host, port))))
    active: list[int] = []
    for vb, row in enumerate(vbucket_map):
        if not isinstance(row, list) or not row or not isinstance(row[0], int):
            raise ProtocolError(f"cluster config: vBucketMap entry {vb} is not a list of ints")
        active.append(row[0])
    declared = document.get("numVBuckets")
    if declared is not None and declared != len(active):
        raise ProtocolError(
            f"cluster config: numVBuckets is {declared} but vBucketMap has {len(active)} rows"
        )
    if not active:
        raise ProtocolError("cluster config: vBucketMap is empty")
    capabilities = document.get("bucketCapabilities") or []
    return ClusterMap(
        bucket=str(bucket),
        rev=rev,
        rev_epoch=rev_epoch,
        nodes=tuple(nodes),
        active_index=tuple(active),
        bucket_uuid=str(document.get("uuid", "")),
        capabilities=frozenset(str(c) for c in capabilities),
    )


def _tls_ports(nodes_ext: list[Any], connected_host: str) -> dict[tuple[str, int], int | None]:
    """(host, plain kv port) -> kvSSL port, from nodesExt."""
    ports: dict[tuple[str, int], int | None] = {}
    for node in nodes_ext:
        services = node.get("services") or {}
        kv = services.get("kv")
        if not isinstance(kv, int):
            continue  # not a data node
        host = _strip_brackets(node.get("hostname") or connected_host)
        if host == HOST_PLACEHOLDER:
            host = connected_host
        kv_ssl = services.get("kvSSL")
        ports[(host, kv)] = kv_ssl if isinstance(kv_ssl, int) else None
    return ports


def _split_host_port(entry: str, connected_host: str) -> tuple[str, int]:
    host, colon, port_text = entry.rpartition(":")
    if not colon or not port_text.isdigit():
        raise ProtocolError(f"cluster config: server {entry!r} is not host:port")
    host = _strip_brackets(host)
    if host == HOST_PLACEHOLDER:
        host = connected_host
    return host, int(port_text)


def _strip_brackets(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _int(document: Mapping[str, Any], key: str) -> int:
    value = document[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"cluster config: {key!r} is not an integer: {value!r}")
    return value
