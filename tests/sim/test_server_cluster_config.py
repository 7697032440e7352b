"""The cluster map the simulated nodes hand out: shape, ownership, revisions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from replicator.dcp.protocol.opcodes import Status
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster_config import (
    BucketTopology,
    NodeEndpoint,
    bucket_config,
    encode_bucket_config,
)
from tests.sim.raw_client import RawClient, serve


def active_owners(config: dict[str, Any]) -> dict[int, str]:
    """vbucket -> kv address of its active node, read the way clients read the map."""
    server_map = config["vBucketServerMap"]
    servers = server_map["serverList"]
    return {vb: servers[chain[0]] for vb, chain in enumerate(server_map["vBucketMap"])}


def test_config_has_the_fields_real_clients_read(vectors_dir: Path) -> None:
    real = json.loads((vectors_dir / "java-dcp-client" / "config_magma_two_nodes.json").read_text())
    nodes = [NodeEndpoint("127.0.0.1", 12000, 12100), NodeEndpoint("127.0.0.1", 12001, 12101)]
    ours = bucket_config(BucketTopology.spread("foo", nodes, 1024, rev=7), this_node=1)
    # Every top-level field of a real 7.x config that a client may read is present.
    assert set(real) <= set(ours)
    assert ours["rev"] == 7 and ours["revEpoch"] == 1
    assert ours["nodeLocator"] == "vbucket"
    assert ours["vBucketServerMap"]["hashAlgorithm"] == "CRC"
    assert {"dcp", "collections", "xattr"} <= set(ours["bucketCapabilities"])
    assert [n.get("thisNode", False) for n in ours["nodesExt"]] == [False, True]
    assert ours["nodesExt"][1]["services"]["kv"] == 12001
    assert ours["nodesExt"][1]["services"]["kvSSL"] == 12101
    assert ours["vBucketServerMap"]["serverList"] == ["127.0.0.1:12000", "127.0.0.1:12001"]
    assert len(ours["vBucketServerMap"]["vBucketMap"]) == ours["numVBuckets"] == 1024


def test_spread_gives_contiguous_even_ranges() -> None:
    nodes = [NodeEndpoint("h", 1), NodeEndpoint("h", 2), NodeEndpoint("h", 3)]
    topology = BucketTopology.spread("b", nodes, 10)
    assert topology.vbuckets_of(0) == (0, 1, 2, 3)
    assert topology.vbuckets_of(1) == (4, 5, 6)
    assert topology.vbuckets_of(2) == (7, 8, 9)


def test_moved_bumps_the_revision_and_rejects_bad_moves() -> None:
    topology = BucketTopology.spread("b", [NodeEndpoint("h", 1), NodeEndpoint("h", 2)], 4)
    moved = topology.moved({0: 1})
    assert moved.rev == topology.rev + 1
    assert moved.active_nodes == (1, 0, 1, 1)
    with pytest.raises(ValueError, match="node 5"):
        topology.moved({0: 5})
    with pytest.raises(ValueError, match="vbucket 9"):
        topology.moved({9: 0})


def test_config_without_tls_has_no_ssl_ports() -> None:
    topology = BucketTopology.spread("b", [NodeEndpoint("::1", 11210)], 2)
    config = json.loads(encode_bucket_config(topology))
    assert "kvSSL" not in config["nodesExt"][0]["services"]
    assert config["vBucketServerMap"]["serverList"] == ["[::1]:11210"]


def test_every_vbucket_has_exactly_one_active_node_that_serves_it() -> None:
    bucket = SimBucket("travel", num_vbuckets=16, seed=2)
    with serve(bucket, nodes=3) as cluster:
        ports = {f"127.0.0.1:{node.port}": index for index, node in enumerate(cluster.nodes)}
        for index, node in enumerate(cluster.nodes):
            with RawClient("127.0.0.1", node.port) as client:
                client.connect("travel")
                config = json.loads(client.cluster_config().value)
                this = [n for n in config["nodesExt"] if n.get("thisNode")]
                assert [n["services"]["kv"] for n in this] == [node.port]
                owners = active_owners(config)
                assert sorted(owners) == list(range(16))
                assert set(owners.values()) == set(ports)
                assert all(len(chain) == 1 for chain in config["vBucketServerMap"]["vBucketMap"])
                # The node serves exactly the vbuckets the map gives it.
                assert client.dcp_open().status == Status.SUCCESS
                for vb, address in owners.items():
                    status = client.stream_request(vb).status
                    expected = Status.SUCCESS if ports[address] == index else Status.NOT_MY_VBUCKET
                    assert status == expected, (vb, address, index)
