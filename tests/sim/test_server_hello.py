"""HELLO as a 7.6 node answers it: what it acknowledges, its dependency rules, and what the
features that change behaviour do (brief cluster-map pushes, deduplicated NOT_MY_VBUCKET maps,
SnappyEverywhere), over real sockets."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from replicator.dcp.protocol.events import Mutation, StreamEnd, StreamEndReason
from replicator.dcp.protocol.opcodes import Datatype, HelloFeature, Status
from replicator.dcp.protocol.responses import hello_features_of
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from tests.sim.raw_client import DEFAULT_FEATURES, RawClient, producer, serve

ACKNOWLEDGED_BY_A_7_6_NODE = (
    HelloFeature.TCP_NODELAY,
    HelloFeature.MUTATION_SEQNO,
    HelloFeature.XATTR,
    HelloFeature.XERROR,
    HelloFeature.SELECT_BUCKET,
    HelloFeature.SNAPPY,
    HelloFeature.JSON,
    HelloFeature.DUPLEX,
    HelloFeature.UNORDERED_EXECUTION,
    HelloFeature.ALT_REQUEST_SUPPORT,
    HelloFeature.SYNC_REPLICATION,
    HelloFeature.COLLECTIONS,
    HelloFeature.SNAPPY_EVERYWHERE,
    HelloFeature.PRESERVE_TTL,
    HelloFeature.VATTR,
    HelloFeature.SUBDOC_CREATE_AS_DELETED,
    HelloFeature.SUBDOC_DOCUMENT_MACRO_SUPPORT,
    HelloFeature.SUBDOC_REPLACE_BODY_WITH_XATTR,
    HelloFeature.NON_BLOCKING_THROTTLING_MODE,
    HelloFeature.SUBDOC_REPLICA_READ,
    HelloFeature.GET_CLUSTER_CONFIG_WITH_KNOWN_VERSION,
    HelloFeature.DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP,
    HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF,
    HelloFeature.SUBDOC_ALLOWS_ACCESS_ON_MULTIPLE_XATTR_KEYS,
    HelloFeature.SUBDOC_BINARY_XATTR,
)
"""Every feature code a 7.6 node knows (0x01-0x21, TCP_DELAY aside) asked at once: the answer,
in code order. Brief notifications win over full ones; TLS, TCP_DELAY, TRACING, PITR,
REPORT_UNIT_USAGE and the retired codes are left out."""


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    with serve(SimBucket("travel", num_vbuckets=8, seed=3), nodes=2) as running:
        yield running


def connect(cluster: SimCluster, node: int = 0) -> RawClient:
    return RawClient("127.0.0.1", cluster.node(node).port)


def test_hello_acknowledges_what_a_7_6_node_acknowledges(cluster: SimCluster) -> None:
    asked = [code for code in range(0x01, 0x22) if code != HelloFeature.TCP_DELAY]
    with connect(cluster) as client:
        agreed = hello_features_of(client.hello([0x7FFF, *reversed(asked)]))
    assert agreed == ACKNOWLEDGED_BY_A_7_6_NODE
    # What the bucket claims in its capabilities, HELLO now acknowledges too.
    assert {
        HelloFeature.SYNC_REPLICATION,  # durableWrite
        HelloFeature.SUBDOC_REPLACE_BODY_WITH_XATTR,  # subdoc.ReplaceBodyWithXattr
        HelloFeature.SUBDOC_DOCUMENT_MACRO_SUPPORT,  # subdoc.DocumentMacroSupport
        HelloFeature.SUBDOC_CREATE_AS_DELETED,  # subdoc.ReviveDocument
        HelloFeature.PRESERVE_TTL,
    } <= set(agreed)


@pytest.mark.parametrize(
    ("asked", "context"),
    [
        ((HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION,), "needs Duplex"),
        ((HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF, HelloFeature.XERROR), "needs Duplex"),
        ((HelloFeature.VATTR, HelloFeature.JSON), "needs XATTR"),
        ((HelloFeature.SUBDOC_DOCUMENT_MACRO_SUPPORT,), "needs XATTR"),
        ((HelloFeature.TCP_NODELAY, HelloFeature.TCP_DELAY), "cannot co-exist"),
    ],
)
def test_hello_refuses_what_kv_engine_refuses_and_keeps_what_was_agreed(
    cluster: SimCluster, asked: tuple[int, ...], context: str
) -> None:
    with connect(cluster) as client:
        assert client.hello((HelloFeature.XERROR, HelloFeature.JSON)).status == Status.SUCCESS
        refused = client.hello(asked)
        assert refused.status == Status.EINVAL
        # The earlier HELLO still holds: XERROR makes the refusal carry its reason.
        assert context in json.loads(refused.value)["error"]["context"]
        ok = client.hello((HelloFeature.XATTR, HelloFeature.VATTR, HelloFeature.TCP_DELAY))
        assert hello_features_of(ok) == (HelloFeature.XATTR, HelloFeature.VATTR)


def test_unordered_execution_is_not_acknowledged_on_a_dcp_connection(cluster: SimCluster) -> None:
    with producer(cluster) as client:
        agreed = hello_features_of(client.hello((*DEFAULT_FEATURES, 0x0E)))
    assert HelloFeature.UNORDERED_EXECUTION not in agreed
    assert HelloFeature.COLLECTIONS in agreed


def test_brief_notifications_carry_the_version_and_no_map(cluster: SimCluster) -> None:
    brief = HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF
    features = (*DEFAULT_FEATURES, HelloFeature.DUPLEX, brief)
    vb = cluster.topology.vbuckets_of(0)[0]
    with producer(cluster, features=features) as client:
        assert client.stream_request(vb).status == Status.SUCCESS
        new_map = cluster.rebalance({vb: 1})
        # The notification is queued before the stream's end: it has arrived by then.
        assert client.next_message() == StreamEnd(vb, StreamEndReason.STATE_CHANGED)
    (notification,) = client.notifications
    assert (notification.epoch, notification.revision) == cluster.config_revision()
    assert notification.revision == new_map.rev and notification.config == b""


def test_not_my_vbucket_maps_are_deduplicated_for_clients_that_ask(cluster: SimCluster) -> None:
    foreign = cluster.topology.vbuckets_of(1)[0]
    dedupe = (*DEFAULT_FEATURES, HelloFeature.DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP)
    with producer(cluster, features=dedupe) as client:
        first = client.stream_request(foreign)
        assert first.status == Status.NOT_MY_VBUCKET
        assert json.loads(first.value)["rev"] == cluster.config_revision()[1]
        again = client.stream_request(foreign)
        assert (again.status, again.value) == (Status.NOT_MY_VBUCKET, b"")
        cluster.rebalance({cluster.topology.vbuckets_of(1)[1]: 0})  # a newer map
        newer = client.stream_request(foreign)
        assert json.loads(newer.value)["rev"] == cluster.config_revision()[1]
    with producer(cluster) as client:
        assert client.cluster_config().status == Status.SUCCESS
        for _ in range(2):
            assert json.loads(client.stream_request(foreign).value)["rev"]


def test_snappy_everywhere_alone_lets_values_go_compressed() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    bucket.upsert("big", {"text": "x" * 4096})
    features = (*DEFAULT_FEATURES, HelloFeature.SNAPPY_EVERYWHERE)
    with serve(bucket) as cluster, producer(cluster, features=features) as client:
        assert HelloFeature.SNAPPY_EVERYWHERE in client.features
        assert HelloFeature.SNAPPY not in client.features
        assert client.control("force_value_compression", "true").status == Status.SUCCESS
        assert client.stream_request(0, end=1).status == Status.SUCCESS
        while True:
            received = client.next_received()
            if isinstance(received.message, Mutation):
                break
    assert received.frame.datatype & Datatype.SNAPPY
    assert received.message.value == b'{"text":"' + b"x" * 4096 + b'"}'
