"""The collections manifest: ids, uids, system events and the manifest JSON."""

from __future__ import annotations

import json

import pytest

from replicator.dcp.protocol.events import SystemEventType
from replicator.sim.collections import (
    FIRST_USER_ID,
    CollectionsManifest,
    UnknownCollectionError,
    UnknownScopeError,
    split_collection_path,
)


def test_new_manifest_has_only_the_default_scope_and_collection() -> None:
    manifest = CollectionsManifest()
    assert manifest.uid == 0
    assert json.loads(manifest.manifest_json()) == {
        "uid": "0",
        "scopes": [
            {"name": "_default", "uid": "0", "collections": [{"name": "_default", "uid": "0"}]}
        ],
    }
    assert manifest.collection("_default._default").collection_id == 0
    assert manifest.changes == ()


def test_ids_start_after_the_reserved_range_and_uid_counts_changes() -> None:
    manifest = CollectionsManifest()
    (scope_event,) = manifest.create_scope("app")
    (users,) = manifest.create_collection("app", "users")
    (orders,) = manifest.create_collection("app", "orders")
    assert scope_event.scope_id == FIRST_USER_ID
    assert (users.collection_id, orders.collection_id) == (FIRST_USER_ID, FIRST_USER_ID + 1)
    assert [c.manifest_uid for c in manifest.changes] == [1, 2, 3]
    assert manifest.uid == 3
    assert [c.sequence for c in manifest.changes] == [0, 1, 2]


def test_create_events_name_what_they_create() -> None:
    manifest = CollectionsManifest()
    (scope_event,) = manifest.create_scope("app")
    (collection_event,) = manifest.create_collection("app", "users")
    assert scope_event.event is SystemEventType.SCOPE_CREATED
    assert (scope_event.name, scope_event.collection_id) == ("app", None)
    assert collection_event.event is SystemEventType.COLLECTION_CREATED
    assert collection_event.name == "users"
    assert collection_event.scope_id == scope_event.scope_id


def test_manifest_json_uses_hex_uids() -> None:
    manifest = CollectionsManifest()
    for index in range(20):
        manifest.create_scope(f"s{index}")
    manifest.create_collection("s19", "c")
    document = json.loads(manifest.manifest_json())
    assert document["uid"] == "15"  # 21 changes
    last_scope = document["scopes"][-1]
    assert last_scope == {"name": "s19", "uid": "1b", "collections": [{"name": "c", "uid": "8"}]}


def test_drop_collection_removes_it_but_keeps_its_id_known() -> None:
    manifest = CollectionsManifest()
    manifest.create_scope("app")
    (created,) = manifest.create_collection("app", "users")
    (dropped,) = manifest.drop_collection("app", "users")
    assert dropped.event is SystemEventType.COLLECTION_DROPPED
    assert dropped.collection_id == created.collection_id
    assert dropped.name == ""
    assert dropped.manifest_uid == manifest.uid == 3
    assert created.collection_id is not None
    assert not manifest.is_live(created.collection_id)
    assert manifest.collection_by_id(created.collection_id).path == "app.users"
    with pytest.raises(UnknownCollectionError, match=r"app\.users"):
        manifest.collection("app.users")


def test_recreated_collection_gets_a_new_id() -> None:
    manifest = CollectionsManifest()
    (first,) = manifest.create_collection("_default", "c")
    manifest.drop_collection("_default", "c")
    (second,) = manifest.create_collection("_default", "c")
    assert second.collection_id != first.collection_id


def test_drop_scope_drops_its_collections_and_stamps_only_the_last_event() -> None:
    manifest = CollectionsManifest()
    manifest.create_scope("app")
    manifest.create_collection("app", "a")
    manifest.create_collection("app", "b")
    manifest.create_collection("_default", "other")
    events = manifest.drop_scope("app")
    assert [e.event for e in events] == [
        SystemEventType.COLLECTION_DROPPED,
        SystemEventType.COLLECTION_DROPPED,
        SystemEventType.SCOPE_DROPPED,
    ]
    assert [e.manifest_uid for e in events] == [4, 4, 5]
    assert [c.path for c in manifest.collections()] == ["_default._default", "_default.other"]
    assert [s.name for s in manifest.scopes()] == ["_default"]


def test_default_collection_can_be_dropped_but_not_the_default_scope() -> None:
    manifest = CollectionsManifest()
    manifest.drop_collection("_default", "_default")
    assert not manifest.is_live(0)
    with pytest.raises(ValueError, match="_default scope"):
        manifest.drop_scope("_default")


@pytest.mark.parametrize("name", ["", "_private", "%x", "has.dot", "spa ce", "x" * 252])
def test_invalid_names_are_refused(name: str) -> None:
    manifest = CollectionsManifest()
    with pytest.raises(ValueError, match="invalid scope name"):
        manifest.create_scope(name)
    with pytest.raises(ValueError, match="invalid collection name"):
        manifest.create_collection("_default", name)
    assert manifest.uid == 0


def test_duplicates_and_unknown_scopes_are_refused() -> None:
    manifest = CollectionsManifest()
    manifest.create_scope("app")
    manifest.create_collection("app", "users")
    with pytest.raises(ValueError, match="already exists"):
        manifest.create_scope("app")
    with pytest.raises(ValueError, match="already exists"):
        manifest.create_collection("app", "users")
    with pytest.raises(UnknownScopeError, match="nowhere"):
        manifest.create_collection("nowhere", "users")
    with pytest.raises(UnknownScopeError):
        manifest.drop_scope("nowhere")
    assert manifest.uid == 2


def test_split_collection_path() -> None:
    assert split_collection_path("app.users") == ("app", "users")
    assert split_collection_path("users") == ("_default", "users")
    with pytest.raises(ValueError, match=r"scope\.collection"):
        split_collection_path("a.b.c")
