"""The bucket's test API: documents, batches, collections, failover, purge, expiry, listeners."""

from __future__ import annotations

import json
import threading

import pytest

from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    SnapshotFlags,
    SystemEvent,
    SystemEventType,
)
from replicator.sim.bucket import Delete, DocumentRecord, Expire, SimBucket, Touch, Upsert
from replicator.sim.collections import UnknownCollectionError
from replicator.sim.history_items import DocumentNotFoundError
from replicator.sim.vbmap import vbucket_for_key
from replicator.sim.vbucket import ServedSnapshot, StreamCursor

NOW_S = 1_700_000_000


def new_bucket(num_vbuckets: int = 8, **options: object) -> SimBucket:
    return SimBucket(
        "test",
        num_vbuckets,
        seed=3,
        clock_ns=lambda: NOW_S * 1_000_000_000,
        **options,  # type: ignore[arg-type]
    )


def drain(cursor: StreamCursor) -> list[ServedSnapshot]:
    parts = []
    while (part := cursor.next_snapshot()) is not None:
        assert isinstance(part, ServedSnapshot)
        parts.append(part)
    return parts


def test_upsert_lands_in_the_key_s_vbucket_and_reads_back_exactly() -> None:
    bucket = new_bucket()
    mutation = bucket.upsert(
        "user::1", {"name": "Ada"}, expiry=NOW_S + 60, flags=0x02000006, xattrs={"_meta": "{}"}
    )
    vb = vbucket_for_key(b"user::1", 8)
    assert mutation.vbucket == vb == bucket.vbucket_for("user::1")
    (record,) = bucket.documents()
    assert record == DocumentRecord(
        key=b"user::1",
        collection="_default._default",
        collection_id=0,
        vbucket=vb,
        seqno=1,
        rev_seqno=1,
        cas=mutation.cas,
        flags=0x02000006,
        expiry=NOW_S + 60,
        value=b'{"name":"Ada"}',
        is_json=True,
        xattrs=(("_meta", "{}"),),
    )
    assert bucket.high_seqnos() == {v: (1 if v == vb else 0) for v in range(8)}


def test_values_may_be_bytes_text_or_mappings() -> None:
    bucket = new_bucket()
    bucket.upsert(b"raw", b"\x00\x01", is_json=False)
    bucket.upsert("text", "plain words", is_json=False)
    values = {r.key: (r.value, r.is_json) for r in bucket.documents()}
    assert values == {b"raw": (b"\x00\x01", False), b"text": (b"plain words", False)}


def test_batch_makes_one_memory_snapshot_per_affected_vbucket() -> None:
    bucket = new_bucket()
    keys = [f"doc-{i}" for i in range(40)]
    items = bucket.apply_batch([Upsert(k, {"i": i}) for i, k in enumerate(keys)])
    assert [i.key for i in items if isinstance(i, Mutation)] == [k.encode() for k in keys]
    per_vbucket: dict[int, int] = {}
    for key in keys:
        vb = vbucket_for_key(key.encode(), 8)
        per_vbucket[vb] = per_vbucket.get(vb, 0) + 1
    for vb, count in per_vbucket.items():
        parts = drain(bucket.vbucket(vb).open_cursor(0))
        assert len(parts) == 1
        (part,) = parts
        assert part.marker is not None
        assert part.marker.flags == SnapshotFlags.MEMORY | SnapshotFlags.CHECKPOINT
        assert (part.marker.end_seqno, len(part.items)) == (count, count)


def test_failing_batch_changes_nothing() -> None:
    bucket = new_bucket()
    bucket.upsert("a", {})
    before = bucket.high_seqnos()
    with pytest.raises(DocumentNotFoundError):
        bucket.apply_batch([Upsert("b", {}), Delete("missing")])
    with pytest.raises(UnknownCollectionError):
        bucket.apply_batch([Upsert("b", {}), Upsert("c", {}, collection="app.none")])
    assert bucket.high_seqnos() == before


def test_delete_touch_expire_write_the_matching_items() -> None:
    bucket = new_bucket()
    bucket.upsert("a", {"v": 1})
    touched = bucket.touch("a", NOW_S + 5)
    assert (touched.expiration, touched.value) == (NOW_S + 5, b'{"v":1}')
    expired = bucket.expire("a")
    assert isinstance(expired, Expiration)
    bucket.upsert("b", {})
    deleted = bucket.delete("b")
    assert isinstance(deleted, Deletion)
    assert bucket.documents() == []
    with pytest.raises(DocumentNotFoundError):
        bucket.apply_batch([Touch("b", 0)])
    with pytest.raises(DocumentNotFoundError):
        bucket.apply_batch([Expire("b")])


def test_collection_changes_write_a_system_event_into_every_vbucket() -> None:
    bucket = new_bucket()
    scope_id = bucket.create_scope("app")
    collection_id = bucket.create_collection("app", "users")
    assert bucket.high_seqnos() == dict.fromkeys(range(8), 2)
    for vb in range(8):
        first, second = bucket.vbucket(vb).item_at(1), bucket.vbucket(vb).item_at(2)
        assert isinstance(first, SystemEvent) and isinstance(second, SystemEvent)
        assert (first.event, first.scope_id, first.name, first.manifest_uid) == (
            SystemEventType.SCOPE_CREATED,
            scope_id,
            "app",
            1,
        )
        assert (second.event, second.collection_id, second.name, second.manifest_uid) == (
            SystemEventType.COLLECTION_CREATED,
            collection_id,
            "users",
            2,
        )
    manifest = json.loads(bucket.manifest_json())
    assert manifest["uid"] == "2"
    assert manifest["scopes"][1] == {
        "name": "app",
        "uid": f"{scope_id:x}",
        "collections": [{"name": "users", "uid": f"{collection_id:x}"}],
    }


def test_documents_by_collection_and_drop() -> None:
    bucket = new_bucket()
    bucket.create_scope("app")
    bucket.create_collection("app", "users")
    bucket.upsert("u1", {}, collection="app.users")
    bucket.upsert("d1", {})
    assert [r.key for r in bucket.documents(collection="app.users")] == [b"u1"]
    assert [r.collection for r in bucket.documents(collection="app.users")] == ["app.users"]
    bucket.drop_scope("app")
    assert [r.key for r in bucket.documents()] == [b"d1"]
    with pytest.raises(UnknownCollectionError):
        bucket.upsert("u2", {}, collection="app.users")
    # 2 creations + 1 collection drop + 1 scope drop in every vbucket, plus the documents.
    assert sum(bucket.high_seqnos().values()) == 8 * 4 + 2


def test_failover_returns_the_new_log_and_rewrites_lost_manifest_events() -> None:
    bucket = new_bucket(num_vbuckets=1)
    bucket.upsert("a", {"v": 1})
    bucket.create_collection("_default", "late")
    old_log = bucket.failover_log(0)
    log = bucket.failover(0, lose_last=1)  # loses the collection's creation
    assert log.entries[1:] == old_log.entries
    assert log.newest.seqno == 1
    recreated = bucket.vbucket(0).item_at(2)
    assert isinstance(recreated, SystemEvent)
    assert (recreated.event, recreated.name) == (SystemEventType.COLLECTION_CREATED, "late")
    bucket.upsert("b", {}, collection="late")
    assert [r.key for r in bucket.documents(collection="late")] == [b"b"]


def test_state_at_gives_a_vbucket_s_documents_at_a_seqno() -> None:
    bucket = new_bucket(num_vbuckets=1)
    bucket.upsert("a", {"v": 1})
    bucket.upsert("a", {"v": 2})
    bucket.delete("a")
    assert [r.value for r in bucket.state_at(0, 1)] == [b'{"v":1}']
    assert [r.value for r in bucket.state_at(0, 2)] == [b'{"v":2}']
    assert bucket.state_at(0, 3) == []


def test_purge_and_expiry_pager_through_the_bucket() -> None:
    bucket = new_bucket(num_vbuckets=2)
    bucket.apply_batch([Upsert(f"k{i}", {}, expiry=NOW_S - 1) for i in range(6)])
    bucket.upsert("keep", {})
    assert bucket.run_expiry_pager() == 6
    assert [r.key for r in bucket.documents()] == [b"keep"]
    for vb in range(2):
        high = bucket.vbucket(vb).high_seqno
        assert bucket.purge_tombstones(vb) == high
    served = [
        item
        for vb in range(2)
        for part in drain(bucket.vbucket(vb).open_cursor(0))
        for item in part.items
    ]
    assert [i.key for i in served if not isinstance(i, SystemEvent)] == [b"keep"]


def test_unknown_vbucket_is_named_in_the_error() -> None:
    bucket = new_bucket()
    with pytest.raises(ValueError, match=r"0\.\.7, not 8"):
        bucket.vbucket(8)


def test_listeners_hear_which_vbuckets_changed_until_removed() -> None:
    bucket = new_bucket()
    heard: list[frozenset[int]] = []
    lock_free: list[bool] = []

    def listener(vbuckets: frozenset[int]) -> None:
        heard.append(vbuckets)

        # Outside the lock: another thread can take it right now.
        def probe() -> None:
            acquired = bucket.condition.acquire(blocking=False)
            lock_free.append(acquired)
            if acquired:
                bucket.condition.release()

        prober = threading.Thread(target=probe)
        prober.start()
        prober.join()

    remove = bucket.add_change_listener(listener)
    bucket.apply_batch([Upsert("a", {}), Upsert("b", {})])
    bucket.create_scope("app")
    remove()
    bucket.upsert("c", {})
    expected = frozenset({bucket.vbucket_for("a"), bucket.vbucket_for("b")})
    assert heard == [expected, frozenset(range(8))]
    assert lock_free == [True, True]


def test_condition_wakes_a_waiting_server_thread() -> None:
    bucket = new_bucket()
    cursor = bucket.vbucket(bucket.vbucket_for("x")).open_cursor(0)
    woke = threading.Event()

    def serve() -> None:
        if cursor.wait_for_items(timeout=10):
            woke.set()

    server = threading.Thread(target=serve)
    with bucket.condition:
        server.start()
        assert not woke.is_set()
    bucket.upsert("x", {})
    server.join(timeout=10)
    assert woke.is_set()


def test_seed_makes_vbucket_uuids_reproducible() -> None:
    first = [SimBucket("a", 4, seed=9).failover_log(vb) for vb in range(4)]
    again = [SimBucket("a", 4, seed=9).failover_log(vb) for vb in range(4)]
    other = [SimBucket("a", 4, seed=10).failover_log(vb) for vb in range(4)]
    assert first == again
    assert first != other
    assert len({log.newest.vbucket_uuid for log in first}) == 4
