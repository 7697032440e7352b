"""The simulated node's bootstrap commands over real sockets: HELLO, SASL, buckets, maps."""

from __future__ import annotations

import json
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicator.dcp.protocol.dcp_requests import DcpOpen
from replicator.dcp.protocol.frame import encode_frame
from replicator.dcp.protocol.opcodes import (
    DcpOpenFlags,
    HelloFeature,
    Magic,
    Opcode,
    Status,
    VbucketState,
)
from replicator.dcp.protocol.requests import (
    GetAllVbSeqnos,
    GetCollectionsManifest,
    SaslAuth,
    SaslStep,
)
from replicator.dcp.protocol.responses import (
    hello_features_of,
    sasl_mechanisms_of,
    vbucket_seqnos_of,
)
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster, server_tls_context
from tests.sim.raw_client import PRODUCER_FLAGS, RawClient, self_signed_certificate, serve


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    bucket = SimBucket("travel", num_vbuckets=8, seed=3)
    with serve(bucket, users={"Administrator": "password", "reader": "s3cret"}) as running:
        yield running


def connect(cluster: SimCluster) -> RawClient:
    return RawClient("127.0.0.1", cluster.node(0).port)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"])
def test_scram_succeeds_with_the_right_password(cluster: SimCluster, mechanism: str) -> None:
    with connect(cluster) as client:
        response = client.auth_scram("reader", "s3cret", mechanism)
        # The client verified the server's signature in set_server_final.
        assert response.status == Status.SUCCESS
        assert response.value.startswith(b"v=")
        assert client.select_bucket("travel").status == Status.SUCCESS


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA512", "SCRAM-SHA1"])
def test_scram_with_a_wrong_password_is_auth_error(cluster: SimCluster, mechanism: str) -> None:
    with connect(cluster) as client:
        client.hello()
        response = client.auth_scram("reader", "wrong-password", mechanism)
        assert response.status == Status.AUTH_ERROR
        assert b"wrong-password" not in response.value and b"s3cret" not in response.value
        # Still not authenticated: bucket commands are refused.
        assert client.select_bucket("travel").status == Status.EACCESS


def test_scram_for_an_unknown_user_fails_only_at_the_proof(cluster: SimCluster) -> None:
    with connect(cluster) as client:
        first = client.request(
            SaslAuth("SCRAM-SHA512", b"n,,n=nobody,r=abcdefgh", client.next_opaque())
        )
        # Like kv_engine, the server does not reveal at the first step that the user is unknown.
        assert first.status == Status.AUTH_CONTINUE
        assert b"r=abcdefgh" in first.value
        assert client.auth_scram("nobody", "password").status == Status.AUTH_ERROR


def test_plain_auth_checks_the_password(cluster: SimCluster) -> None:
    with connect(cluster) as client:
        assert client.auth_plain("reader", "nope").status == Status.AUTH_ERROR
        assert client.auth_plain("reader", "s3cret").status == Status.SUCCESS
        assert client.select_bucket("travel").status == Status.SUCCESS


def test_sasl_step_without_auth_is_einval(cluster: SimCluster) -> None:
    with connect(cluster) as client:
        step = client.request(SaslStep("SCRAM-SHA512", b"c=biws,r=x,p=y", client.next_opaque()))
        assert step.status == Status.EINVAL


def test_list_mechanisms_strongest_first(cluster: SimCluster) -> None:
    with connect(cluster) as client:
        mechanisms = sasl_mechanisms_of(client.list_mechanisms())
    assert mechanisms == ("SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1", "PLAIN")


def test_hello_agrees_to_the_supported_subset_in_feature_code_order(cluster: SimCluster) -> None:
    asked = (
        HelloFeature.TLS,
        HelloFeature.COLLECTIONS,
        HelloFeature.XERROR,
        HelloFeature.SYNC_REPLICATION,
        HelloFeature.SNAPPY,
        0x7FFF,  # a feature code no server knows
        HelloFeature.JSON,
        HelloFeature.DUPLEX,
        HelloFeature.SELECT_BUCKET,
        HelloFeature.XATTR,
    )
    with connect(cluster) as client:
        agreed = hello_features_of(client.hello(asked))
    # kv_engine keeps the agreed features in an ordered set and answers in that order.
    assert agreed == (
        HelloFeature.XATTR,
        HelloFeature.XERROR,
        HelloFeature.SELECT_BUCKET,
        HelloFeature.SNAPPY,
        HelloFeature.JSON,
        HelloFeature.DUPLEX,
        HelloFeature.SYNC_REPLICATION,
        HelloFeature.COLLECTIONS,
    )


def test_clustermap_notifications_need_duplex(cluster: SimCluster) -> None:
    notify = HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION
    with connect(cluster) as client:
        refused = client.hello((notify,))
        assert refused.status == Status.EINVAL  # kv_engine refuses the combination
        assert hello_features_of(client.hello((HelloFeature.DUPLEX, notify))) == (
            HelloFeature.DUPLEX,
            notify,
        )


def test_commands_before_authentication_are_refused(cluster: SimCluster) -> None:
    with connect(cluster) as client:
        client.hello()
        assert client.select_bucket("travel").status == Status.EACCESS
        assert client.dcp_open().status == Status.EACCESS
        assert client.cluster_config().status == Status.EACCESS


def test_unknown_bucket_is_eaccess_and_bucket_commands_need_one(cluster: SimCluster) -> None:
    with connect(cluster) as client:
        client.hello()
        assert client.auth_scram("Administrator", "password").status == Status.SUCCESS
        assert client.select_bucket("no-such-bucket").status == Status.EACCESS
        assert client.cluster_config().status == Status.NO_BUCKET
        assert client.request(DcpOpen("x:y", DcpOpenFlags.PRODUCER, 9)).status == Status.NO_BUCKET


def test_version_error_map_and_unknown_commands(cluster: SimCluster) -> None:
    with connect(cluster) as client:
        version = client.raw_request(encode_frame(Magic.REQUEST, 0x0B, opaque=70), 70)
        assert version.status == Status.SUCCESS
        major, minor = version.value.decode().split(".")[:2]
        assert int(major) >= 7 and minor.isdigit()

        request = encode_frame(Magic.REQUEST, Opcode.GET_ERROR_MAP, opaque=71, value=b"\x00\x02")
        error_map = json.loads(client.raw_request(request, 71).value)
        assert error_map["version"] == 1
        assert error_map["errors"]["7"]["name"] == "NOT_MY_VBUCKET"
        assert "fetch-config" in error_map["errors"]["7"]["attrs"]
        assert all(int(code, 16) >= 0 for code in error_map["errors"])

        bad_version = encode_frame(Magic.REQUEST, Opcode.GET_ERROR_MAP, opaque=72, value=b"\0\0")
        assert client.raw_request(bad_version, 72).status == Status.EINVAL

        unknown = client.raw_request(encode_frame(Magic.REQUEST, 0xE9, opaque=73), 73)
        assert unknown.status == Status.UNKNOWN_COMMAND


def test_xerror_adds_a_json_context_to_errors(cluster: SimCluster) -> None:
    with connect(cluster) as client:
        client.hello((HelloFeature.XERROR, HelloFeature.JSON))
        refused = client.select_bucket("travel")
        assert refused.status == Status.EACCESS
        assert json.loads(refused.value)["error"]["context"]
    with connect(cluster) as plain_client:
        assert plain_client.select_bucket("travel").value == b""


def test_collections_manifest_and_vbucket_seqnos(cluster: SimCluster) -> None:
    cluster.bucket.create_scope("app")
    cluster.bucket.create_collection("app", "users")
    cluster.bucket.upsert("u1", {"n": 1}, collection="app.users")
    with connect(cluster) as client:
        client.connect("travel")
        manifest = json.loads(client.request(GetCollectionsManifest(client.next_opaque())).value)
        scopes = {scope["name"]: scope for scope in manifest["scopes"]}
        assert [c["name"] for c in scopes["app"]["collections"]] == ["users"]

        records = vbucket_seqnos_of(client.request(GetAllVbSeqnos(opaque=client.next_opaque())))
        assert {r.vbucket: r.seqno for r in records} == cluster.bucket.high_seqnos()

        users = cluster.bucket.manifest.collection("app.users").collection_id
        vb_of_u1 = cluster.bucket.vbucket_for("u1")
        filtered = client.request(
            GetAllVbSeqnos(
                vbucket_state=VbucketState.ACTIVE, collection_id=users, opaque=client.next_opaque()
            )
        )
        per_vb = {r.vbucket: r.seqno for r in vbucket_seqnos_of(filtered)}
        assert per_vb[vb_of_u1] == cluster.bucket.high_seqnos()[vb_of_u1]
        other = next(vb for vb in per_vb if vb != vb_of_u1)
        # Only the collection's creation event is in the other vbuckets.
        assert per_vb[other] == 2

        replicas = client.request(
            GetAllVbSeqnos(vbucket_state=VbucketState.REPLICA, opaque=client.next_opaque())
        )
        assert vbucket_seqnos_of(replicas) == ()


def test_malformed_request_is_einval_and_bad_framing_closes(cluster: SimCluster) -> None:
    with connect(cluster) as client:
        client.connect("travel")
        # DCP_OPEN without its 8 bytes of extras.
        broken = encode_frame(Magic.REQUEST, Opcode.DCP_OPEN, opaque=5, key=b"name")
        assert client.raw_request(broken, 5).status == Status.EINVAL
        client.send_bytes(b"\x42" + bytes(23))  # bad magic: the stream cannot be trusted
        assert client.wait_closed(2.0)


def test_tls_connection_with_a_caller_certificate(tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    context = server_tls_context(str(cert), str(key))
    bucket = SimBucket("secure", num_vbuckets=4, seed=1)
    with serve(bucket, tls_context=context) as running:
        tls_port = running.node(0).tls_port
        assert tls_port is not None
        assert running.tls_connection_string == f"couchbases://127.0.0.1:{tls_port}/secure"
        client_context = ssl.create_default_context(cafile=str(cert))
        with RawClient("127.0.0.1", tls_port, tls_context=client_context) as client:
            client.connect("secure")
            config = json.loads(client.cluster_config().value)
            assert config["nodesExt"][0]["services"]["kvSSL"] == tls_port
        untrusting = ssl.create_default_context()  # does not trust the self-signed cert
        with pytest.raises(ssl.SSLCertVerificationError):
            RawClient("127.0.0.1", tls_port, tls_context=untrusting)
        # The plain port still serves.
        with RawClient("127.0.0.1", running.node(0).port) as plain:
            plain.connect("secure")


def test_same_dcp_name_replaces_the_older_connection(cluster: SimCluster) -> None:
    with connect(cluster) as first, connect(cluster) as second:
        first.connect("travel")
        second.connect("travel")
        assert first.dcp_open("app:same").status == Status.SUCCESS
        assert second.dcp_open("app:same").status == Status.SUCCESS
        assert first.wait_closed(2.0)
        assert second.control("enable_noop", "true").status == Status.SUCCESS


def test_get_cluster_config_with_known_revision_is_empty(cluster: SimCluster) -> None:
    with connect(cluster) as client:
        client.connect("travel")
        epoch, rev = cluster.config_revision()
        current = struct.pack(">qq", epoch, rev)
        request = encode_frame(Magic.REQUEST, Opcode.GET_CLUSTER_CONFIG, opaque=40, extras=current)
        assert client.raw_request(request, 40).value == b""
        older = struct.pack(">qq", epoch, rev - 1)
        request = encode_frame(Magic.REQUEST, Opcode.GET_CLUSTER_CONFIG, opaque=41, extras=older)
        assert json.loads(client.raw_request(request, 41).value)["rev"] == rev


def refusal_context(value: bytes) -> str:
    context: str = json.loads(value)["error"]["context"]
    return context


def test_dcp_open_as_a_consumer_is_not_supported(cluster: SimCluster) -> None:
    with connect(cluster) as client:
        client.connect("travel")
        # Without the producer bit the client asks the node to be its consumer (to push
        # changes into it): a simulated node only produces.
        refused = client.dcp_open("app:consumer", flags=DcpOpenFlags.INCLUDE_XATTRS)
        assert refused.status == Status.NOT_SUPPORTED
        assert "producer" in refusal_context(refused.value)
        assert client.stream_request(0).status == Status.EINVAL  # nothing was opened
        assert client.dcp_open("app:consumer").status == Status.SUCCESS
        assert client.stream_request(0).status == Status.SUCCESS


def test_dcp_open_skipping_deletes_in_backfills_is_not_supported(cluster: SimCluster) -> None:
    with connect(cluster) as client:
        client.connect("travel")
        skip_deletes = PRODUCER_FLAGS | DcpOpenFlags.SKIP_DELETES_IN_INITIAL_BACKFILL
        refused = client.dcp_open("app:skip", flags=skip_deletes)
        assert refused.status == Status.NOT_SUPPORTED
        assert "deletes" in refusal_context(refused.value)
        assert client.stream_request(0).status == Status.EINVAL  # nothing was opened
        assert client.dcp_open("app:skip").status == Status.SUCCESS
        assert client.stream_request(0).status == Status.SUCCESS
