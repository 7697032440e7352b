"""Cluster maps: the two real configs from java-dcp-client, $HOST, ordering, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replicator.dcp.cluster.cluster_map import ClusterMap, KvNode, parse_cluster_map
from replicator.errors import ConfigError, ProtocolError
from tests.dcp.scripted_peer import cluster_config


def _vector(vectors_dir: Path, name: str) -> bytes:
    return (vectors_dir / "java-dcp-client" / name).read_bytes()


def test_two_nodes_on_one_host_are_told_apart_by_port(vectors_dir: Path) -> None:
    raw = _vector(vectors_dir, "cluster_run_two_nodes_same_host.json")
    cmap = parse_cluster_map(raw, connected_host="192.168.1.194")
    assert cmap.bucket == "travel-sample"
    assert cmap.version == (0, 1067)  # no revEpoch in this old config
    assert cmap.nodes == (
        KvNode("192.168.1.194", 12000, None),
        KvNode("192.168.1.194", 12002, None),
    )
    assert [n.kv_tls_port for n in cmap.nodes] == [None, None]  # no kvSSL in nodesExt
    assert cmap.num_vbuckets == 1024
    document = json.loads(raw)
    expected_on_first = [
        vb for vb, row in enumerate(document["vBucketServerMap"]["vBucketMap"]) if row[0] == 0
    ]
    assert list(cmap.vbuckets_of(cmap.nodes[0])) == expected_on_first
    assert len(cmap.vbuckets_of(cmap.nodes[0])) + len(cmap.vbuckets_of(cmap.nodes[1])) == 1024
    assert cmap.active_node(0) == cmap.nodes[document["vBucketServerMap"]["vBucketMap"][0][0]]


def test_magma_config_gives_tls_ports_and_epoch(vectors_dir: Path) -> None:
    raw = _vector(vectors_dir, "config_magma_two_nodes.json")
    cmap = parse_cluster_map(raw, connected_host="10.145.231.101")
    assert cmap.version == (1, 1017)
    assert cmap.nodes == (
        KvNode("10.145.231.101", 11210, 11207),
        KvNode("10.145.231.102", 11210, 11207),
    )
    assert [n.kv_tls_port for n in cmap.nodes] == [11207, 11207]
    assert cmap.nodes[1].address(tls=True) == "10.145.231.102:11207"
    assert "collections" in cmap.capabilities
    document = json.loads(raw)
    vb_map = document["vBucketServerMap"]["vBucketMap"]
    for vb in (0, 511, 1023):
        assert cmap.active_node(vb) == cmap.nodes[vb_map[vb][0]]


def test_host_placeholder_becomes_the_connected_host() -> None:
    raw = cluster_config([11210, 11211], tls_ports=[11207, 11208], num_vbuckets=4)
    cmap = parse_cluster_map(raw, connected_host="db.local")
    assert cmap.nodes == (KvNode("db.local", 11210), KvNode("db.local", 11211))
    assert [n.kv_tls_port for n in cmap.nodes] == [11207, 11208]
    assert cmap.vbuckets_of(cmap.nodes[1]) == (1, 3)


def test_ipv6_server_list_entries_lose_their_brackets() -> None:
    raw = cluster_config([11210], host="[fd00::7]")
    cmap = parse_cluster_map(raw, connected_host="fd00::7")
    assert cmap.nodes[0].host == "fd00::7"
    assert str(cmap.nodes[0]) == "[fd00::7]:11210"


def test_no_active_copy_and_ordering() -> None:
    older = parse_cluster_map(cluster_config([1], owners=[0, -1], rev=5), connected_host="h")
    newer_rev = parse_cluster_map(cluster_config([1], rev=6), connected_host="h")
    newer_epoch = parse_cluster_map(cluster_config([1], rev=1, rev_epoch=2), connected_host="h")
    assert older.active_node(1) is None
    assert newer_rev.is_newer_than(older) and not older.is_newer_than(newer_rev)
    assert newer_epoch.is_newer_than(newer_rev)  # epoch outranks revision
    assert older.is_newer_than(None)
    assert not older.is_newer_than(older)


def test_a_node_is_the_same_node_whether_or_not_its_tls_port_is_known() -> None:
    assert KvNode("h", 11210, 11207) == KvNode("h", 11210)
    assert KvNode("h", 11210) != KvNode("h", 11211)


def test_tls_port_missing_is_a_config_error() -> None:
    cmap = parse_cluster_map(cluster_config([11210]), connected_host="h")
    with pytest.raises(ConfigError, match="no kvSSL port"):
        cmap.nodes[0].port(tls=True)


def test_vbucket_out_of_range() -> None:
    cmap = parse_cluster_map(cluster_config([11210], num_vbuckets=4), connected_host="h")
    with pytest.raises(ConfigError, match="vbucket 4 is out of range"):
        cmap.active_node(4)


@pytest.mark.parametrize(
    ("raw", "error", "complaint"),
    [
        (b"not json", ProtocolError, "not JSON"),
        (b"[1, 2]", ProtocolError, "not a JSON object"),
        (b'{"rev": 1, "name": "m"}', ConfigError, "no vBucketServerMap"),
        (b'{"rev": "x", "vBucketServerMap": {}}', ProtocolError, "'rev' is not an integer"),
        (
            b'{"rev": 1, "vBucketServerMap": {"serverList": ["h:1"], "vBucketMap": [[3]]}}',
            ProtocolError,
            "points at server 3",
        ),
        (
            b'{"rev": 1, "vBucketServerMap": {"serverList": ["nohostport"], "vBucketMap": [[0]]}}',
            ProtocolError,
            "not host:port",
        ),
        (
            b'{"rev": 1, "numVBuckets": 2, "vBucketServerMap": {"serverList": ["h:1"], '
            b'"vBucketMap": [[0]]}}',
            ProtocolError,
            "numVBuckets is 2",
        ),
        (b'{"rev": 1, "vBucketServerMap": {"vBucketMap": []}}', ProtocolError, "malformed"),
    ],
)
def test_bad_configs(raw: bytes, error: type[Exception], complaint: str) -> None:
    with pytest.raises(error, match=complaint):
        parse_cluster_map(raw, connected_host="h")


def test_map_rejects_indexes_beyond_server_list() -> None:
    with pytest.raises(ProtocolError):
        ClusterMap("b", 1, 0, (KvNode("h", 1),), (0, 1))
