"""The management port: what SDKs read the cluster map from over HTTP, as a 7.x server serves it.

Checked against what the data port hands out (GET_CLUSTER_CONFIG through the project's own
client): every node's advertised `mgmt` port answers, with the same bucket config.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from replicator.dcp.protocol.opcodes import Status
from replicator.sim.bucket import SimBucket
from replicator.sim.cli import _check_options, add_sim_arguments
from replicator.sim.cluster import DEFAULT_PASSWORD, DEFAULT_USERNAME, SimCluster
from replicator.sim.management import CONFIG_SEPARATOR, IMPLEMENTATION_VERSION
from tests.sim.raw_client import RawClient

BUCKET = "travel"


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    with SimCluster(SimBucket(BUCKET, num_vbuckets=8, seed=1), nodes=2) as running:
        yield running


def auth(user: str = DEFAULT_USERNAME, password: str = DEFAULT_PASSWORD) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def get(port: int, path: str, headers: dict[str, str] | None = None,
        method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, headers=auth() if headers is None else headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def data_port_config(cluster: SimCluster, node: int) -> dict[str, Any]:
    """The cluster map as the node's data port hands it out (GET_CLUSTER_CONFIG)."""
    with RawClient("127.0.0.1", cluster.node(node).port) as client:
        client.connect(BUCKET)
        response = client.cluster_config()
        assert response.status == Status.SUCCESS
        config: dict[str, Any] = json.loads(response.value)
        return config


def advertised_mgmt_ports(config: dict[str, Any]) -> list[int]:
    return [int(node["services"]["mgmt"]) for node in config["nodesExt"]]


def test_every_advertised_mgmt_port_serves_the_config_the_data_port_hands_out(
    cluster: SimCluster,
) -> None:
    for node in range(2):
        config = data_port_config(cluster, node)
        ports = advertised_mgmt_ports(config)
        assert len(set(ports)) == 2
        assert cluster.management_urls == tuple(f"http://127.0.0.1:{p}" for p in ports)
        for path in (f"/pools/default/b/{BUCKET}", f"/pools/default/buckets/{BUCKET}"):
            status, headers, body = get(ports[node], path)
            assert status == 200, body
            assert headers["Content-Type"] == "application/json"
            assert json.loads(body) == config, path
        status, _, body = get(ports[node], "/pools/default/buckets")
        assert (status, json.loads(body)) == (200, [config])
        # The legacy node list names the same management addresses, and no views service.
        assert [n["hostname"] for n in config["nodes"]] == [f"127.0.0.1:{p}" for p in ports]
        assert all("couchApiBase" not in n for n in config["nodes"])


def test_pools_and_the_default_pool_describe_the_cluster(cluster: SimCluster) -> None:
    config = data_port_config(cluster, 0)
    ports = advertised_mgmt_ports(config)

    status, _, body = get(ports[1], "/pools")
    pools = json.loads(body)
    assert status == 200
    assert pools["implementationVersion"] == IMPLEMENTATION_VERSION
    assert [pool["name"] for pool in pools["pools"]] == ["default"]
    status, _, body = get(ports[1], pools["pools"][0]["uri"])
    default = json.loads(body)
    assert status == 200
    assert [n["hostname"] for n in default["nodes"]] == [f"127.0.0.1:{p}" for p in ports]
    assert [n["ports"]["direct"] for n in default["nodes"]] == [
        int(n["services"]["kv"]) for n in config["nodesExt"]
    ]
    assert [n.get("thisNode", False) for n in default["nodes"]] == [False, True]
    assert default["buckets"]["terseStreamingBucketsBase"] == "/pools/default/bs/"


def test_requests_without_the_password_or_for_something_else_are_refused(
    cluster: SimCluster,
) -> None:
    port = advertised_mgmt_ports(data_port_config(cluster, 0))[0]
    path = f"/pools/default/b/{BUCKET}"

    for headers in ({}, auth(password="wrong"), auth(user="nobody"),
                    {"Authorization": "Basic !!!"}, {"Authorization": "Bearer x"}):
        status, response_headers, body = get(port, path, headers)
        assert status == 401, headers
        assert response_headers["WWW-Authenticate"].startswith("Basic realm=")
        assert DEFAULT_PASSWORD.encode() not in body
    assert get(port, "/pools/default/b/no-such-bucket")[0] == 404
    assert get(port, "/pools/nodes")[0] == 404
    assert get(port, path, method="POST")[0] == 405


def read_configs(response: http.client.HTTPResponse, count: int, timeout: float) -> list[Any]:
    """The next `count` configs of a streaming response (each ends with CONFIG_SEPARATOR)."""
    buffer = b""
    configs: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(configs) < count:
        assert time.monotonic() < deadline, f"only {len(configs)} of {count} configs arrived"
        chunk = response.read1(65536)
        assert chunk, "the stream ended"
        buffer += chunk
        while CONFIG_SEPARATOR in buffer:
            config, buffer = buffer.split(CONFIG_SEPARATOR, 1)
            configs.append(json.loads(config))
    return configs


def test_the_streaming_config_sends_the_map_again_when_it_changes(cluster: SimCluster) -> None:
    port = advertised_mgmt_ports(data_port_config(cluster, 0))[0]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", f"/pools/default/bs/{BUCKET}", headers=auth())
    response = connection.getresponse()
    assert response.status == 200
    assert response.getheader("Transfer-Encoding") == "chunked"

    (first,) = read_configs(response, 1, timeout=10)
    assert first == data_port_config(cluster, 0)
    cluster.rebalance("rotate")
    (second,) = read_configs(response, 1, timeout=10)

    assert second["rev"] > first["rev"]
    assert second["vBucketServerMap"]["vBucketMap"] == [
        [(owner + 1) % 2] for [owner] in first["vBucketServerMap"]["vBucketMap"]
    ]
    assert second == data_port_config(cluster, 0)
    cluster.close()  # a stopping node ends its streams cleanly (the last, empty chunk)
    assert response.read() == b""
    connection.close()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [((), 8091), (("--port", "0"), 0), (("--port", "0", "--mgmt-port", "9000"), 9000)],
)
def test_the_sim_command_serves_management_on_8091_unless_ports_are_ephemeral(
    flags: tuple[str, ...], expected: int
) -> None:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    args = parser.parse_args(list(flags))

    _check_options(args, [])

    assert args.mgmt_port == expected
