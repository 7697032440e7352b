"""Where history retention is configured and shown: the bucket's settings and their checks,
the collections manifest (data port and REST), the bucket config, and `replicator sim`."""

from __future__ import annotations

import argparse
import json
import signal
from typing import Any

import pytest

from replicator.dcp.cluster.connstr import parse_connection_string
from replicator.dcp.protocol.opcodes import Status
from replicator.dcp.protocol.requests import GetCollectionsManifest
from replicator.errors import ConfigError
from replicator.sim.bucket import SimBucket
from replicator.sim.cli import _build_bucket, _check_options, add_sim_arguments
from replicator.sim.cluster import SimCluster
from replicator.sim.collections import CollectionsManifest
from tests.sim.raw_client import RawClient, producer, serve
from tests.sim.test_server_cli import simulator
from tests.sim.test_server_management import data_port_config, get


def collection_entries(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        f"{scope['name']}.{c['name']}": c
        for scope in manifest["scopes"]
        for c in scope["collections"]
    }


def test_defaults_stay_couchstore_without_history() -> None:
    bucket = SimBucket("b", num_vbuckets=2)
    assert (bucket.storage_backend, bucket.can_retain_history, bucket.retains_history) == (
        "couchstore",
        False,
        False,
    )
    assert bucket.history_start_seqno(0) == 0
    bucket.upsert("a", {"v": 1})
    assert bucket.history_revisions(bucket.vbucket_for("a")) == []
    assert "history" not in json.loads(bucket.manifest_json())["scopes"][0]["collections"][0]
    with pytest.raises(ValueError, match="magma"):
        bucket.create_collection("_default", "c", history=True)


def test_history_settings_make_a_magma_bucket_and_name_their_collections() -> None:
    bucket = SimBucket(
        "b",
        num_vbuckets=4,
        history_retention_bytes=4096,
        history_collections=["app.users"],  # named: the others keep none by default
    )
    assert bucket.storage_backend == "magma" and bucket.retains_history
    assert not bucket.history_collection_default
    bucket.create_scope("app")
    bucket.create_collection("app", "users")
    bucket.create_collection("app", "orders")
    bucket.create_collection("app", "audit", history=True)
    manifest = bucket.manifest
    assert {c.path: c.history for c in manifest.collections()} == {
        "_default._default": False,
        "app.users": True,
        "app.orders": False,
        "app.audit": True,
    }
    # ns_server's default for magma: every collection keeps history.
    default_on = SimBucket("b", num_vbuckets=1, storage_backend="magma")
    assert default_on.manifest.collection("_default").history
    assert not default_on.retains_history


def test_history_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="only a magma bucket"):
        SimBucket("b", num_vbuckets=1, storage_backend="couchstore", history_retention_seconds=5)
    with pytest.raises(ValueError, match="negative"):
        SimBucket("b", num_vbuckets=1, history_retention_bytes=-1)
    with pytest.raises(ValueError, match=r"scope\.collection"):
        SimBucket("b", num_vbuckets=1, history_collections=["a.b.c"])


def test_the_manifest_says_history_true_only_for_collections_with_history() -> None:
    manifest = CollectionsManifest(default_collection_history=True)
    manifest.create_collection("_default", "plain")
    manifest.create_collection("_default", "kept", history=True)
    entries = collection_entries(json.loads(manifest.manifest_json()))
    assert entries["_default._default"] == {"name": "_default", "uid": "0", "history": True}
    assert entries["_default.plain"] == {"name": "plain", "uid": "8"}
    assert entries["_default.kept"]["history"] is True
    rest = collection_entries(json.loads(manifest.rest_json()))
    assert rest["_default.plain"] == {"name": "plain", "uid": "8", "maxTTL": 0, "history": False}


def test_the_data_port_and_the_management_port_show_the_history_settings() -> None:
    bucket = SimBucket(
        "travel",
        num_vbuckets=8,
        history_retention_seconds=600,
        history_retention_bytes=1 << 30,
        history_collections=["_default._default"],
        history_collection_default=False,
    )
    bucket.create_collection("_default", "plain")
    with SimCluster(bucket, nodes=2) as cluster, producer(cluster) as client:
        reply = client.request(GetCollectionsManifest(client.next_opaque()))
        entries = collection_entries(json.loads(reply.value))
        assert entries["_default._default"].get("history") is True
        assert "history" not in entries["_default.plain"]

        config = data_port_config(cluster, 0)
        assert config["storageBackend"] == "magma"
        assert "historyRetentionSeconds" not in config  # not in the terse config
        port = int(config["nodesExt"][0]["services"]["mgmt"])
        status, _, body = get(port, "/pools/default/buckets/travel/scopes")
        assert status == 200
        rest = collection_entries(json.loads(body))
        assert (rest["_default._default"]["history"], rest["_default.plain"]["history"]) == (
            True,
            False,
        )
        status, _, body = get(port, "/pools/default/buckets/travel")
        full = json.loads(body)
        assert (
            full["historyRetentionSeconds"],
            full["historyRetentionBytes"],
            full["historyRetentionCollectionDefault"],
        ) == (600, 1 << 30, False)
        assert json.loads(get(port, "/pools/default/b/travel")[2]) == config


def sim_args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    args = parser.parse_args(["--port", "0", "--vbuckets", "4", *flags])
    _check_options(args, [])
    return args


def test_the_sim_options_build_the_bucket_they_describe() -> None:
    plain = _build_bucket(sim_args())
    assert plain.storage_backend == "couchstore" and not plain.retains_history
    every = _build_bucket(sim_args("--history-retention-seconds", "60"))
    assert every.storage_backend == "magma" and every.history_collection_default
    assert every.history_retention_seconds == 60
    named = _build_bucket(
        sim_args(
            "--history-retention-bytes",
            "4096",
            "--history-collections",
            "_default._default, app.users",
        )
    )
    assert named.manifest.collection("_default._default").history
    assert not named.history_collection_default
    named.create_scope("app")
    named.create_collection("app", "users")
    named.create_collection("app", "orders")
    assert [c.history for c in named.manifest.collections()] == [True, True, False]
    none = _build_bucket(sim_args("--storage-backend", "magma", "--history-collections", "none"))
    assert not none.manifest.collection("_default").history
    with pytest.raises(ConfigError, match="magma"):
        _build_bucket(
            sim_args("--storage-backend", "couchstore", "--history-retention-seconds", "5")
        )
    with pytest.raises(ConfigError, match="negative"):
        sim_args("--history-retention-bytes", "-5")


def test_the_sim_command_serves_change_streams_with_history_options() -> None:
    flags = ("--port", "0", "--vbuckets", "4", "--docs", "20", "--history-retention-seconds", "600")
    with simulator(*flags) as process:
        assert process.stdout is not None
        seed = parse_connection_string(process.stdout.readline().strip()).seeds[0]
        with RawClient(seed.host, seed.port) as client:
            client.connect("default")
            assert client.dcp_open().status == Status.SUCCESS
            assert client.control("change_streams", "true").status == Status.SUCCESS
            reply = client.request(GetCollectionsManifest(client.next_opaque()))
            entries = collection_entries(json.loads(reply.value))
            assert all(entry.get("history") is True for entry in entries.values())
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0


def test_a_change_streams_stream_serves_a_whole_bucket_in_history() -> None:
    bucket = SimBucket("b", num_vbuckets=4, seed=2, history_retention_seconds=3600)
    for n in range(40):
        bucket.upsert(f"k{n % 10}", {"n": n})
    bucket.evict_checkpoints()
    with serve(bucket) as cluster, producer(cluster, controls=(("change_streams", "true"),)) as c:
        for vb in range(4):
            high = bucket.high_seqnos()[vb]
            assert c.stream_request(vb, end=high).status == Status.SUCCESS
            messages = c.stream_until_end(vb)
            seqnos = [getattr(m, "by_seqno", None) for m in messages[1:-1]]
            assert seqnos == [r.by_seqno for r in bucket.history_revisions(vb)]
