"""The workload: deterministic realistic documents, the write mix, loading and pacing."""

from __future__ import annotations

import json
import threading
import time

import pytest

from replicator.dcp.protocol.events import SnapshotFlags
from replicator.sim.bucket import Delete, SimBucket, Touch, Upsert
from replicator.sim.vbucket import ServedSnapshot
from replicator.sim.workload import (
    DOCUMENT_TYPES,
    Workload,
    WorkloadMix,
    initial_load,
    live_batch_size,
    run_workload,
)

FIXED_TIME = 1_700_000_000.0


def fixed_clock() -> float:
    return FIXED_TIME


def test_same_seed_same_operations_other_seed_other_operations() -> None:
    def ops(seed: int) -> list[object]:
        workload = Workload(seed=seed, doc_size=300, clock=fixed_clock)
        return [*workload.inserts(50), *workload.next_batch(500)]

    assert ops(1) == ops(1)
    assert ops(1) != ops(2)


@pytest.mark.parametrize("doc_size", [200, 1024, 4096])
def test_documents_are_valid_json_of_the_requested_size(doc_size: int) -> None:
    workload = Workload(seed=4, doc_size=doc_size)
    for op in workload.inserts(40):
        assert isinstance(op, Upsert) and isinstance(op.value, bytes)
        assert len(op.value) == doc_size
        assert isinstance(op.key, str)
        assert json.loads(op.value)["type"] == op.key.split("::")[0]


def test_small_size_gives_unpadded_documents() -> None:
    (op,) = Workload(seed=4, doc_size=10).inserts(1)
    assert isinstance(op, Upsert) and isinstance(op.value, bytes)
    assert "pad" not in json.loads(op.value)


def test_inserts_cycle_through_every_type_and_collection() -> None:
    workload = Workload(seed=5, doc_size=128)
    seen = set()
    for op in workload.inserts(8):
        assert isinstance(op, Upsert) and isinstance(op.value, bytes)
        seen.add((json.loads(op.value)["type"], op.collection))
    assert seen == {(t.name, t.collection) for t in DOCUMENT_TYPES}


def test_mix_proportions_follow_the_weights() -> None:
    mix = WorkloadMix(inserts=1, updates=2, deletes=1, expiries=1)
    workload = Workload(seed=6, mix=mix, doc_size=128, clock=fixed_clock)
    known = {op.key for op in workload.inserts(2000)}  # live documents to work on
    counts = {"insert": 0, "update": 0, "delete": 0, "expiry": 0}
    for op in workload.next_batch(5000):
        if isinstance(op, Upsert):
            counts["update" if op.key in known else "insert"] += 1
            known.add(op.key)
        elif isinstance(op, Delete):
            counts["delete"] += 1
        else:
            assert isinstance(op, Touch)
            counts["expiry"] += 1
    for kind, share in {"insert": 0.2, "update": 0.4, "delete": 0.2, "expiry": 0.2}.items():
        assert abs(counts[kind] / 5000 - share) < 0.03, (kind, counts)


def test_expiry_ops_set_times_within_the_ttl_bounds() -> None:
    mix = WorkloadMix(inserts=0, updates=0, deletes=0, expiries=1)
    workload = Workload(seed=7, mix=mix, doc_size=128, expiry_ttl_s=(2, 4), clock=fixed_clock)
    workload.inserts(50)
    touches = workload.next_batch(50)
    assert all(isinstance(op, Touch) for op in touches)
    assert {op.expiry - int(FIXED_TIME) for op in touches if isinstance(op, Touch)} <= {2, 3, 4}
    assert workload.live_documents == 0


def test_batches_apply_cleanly_and_the_bucket_tracks_the_live_set() -> None:
    bucket = SimBucket("shop", num_vbuckets=16, seed=1)
    workload = initial_load(bucket, docs=300, doc_size=256, seed=2)
    for _ in range(20):
        bucket.apply_batch(workload.next_batch(50))  # raises if a delete hits a missing doc
    expired = bucket.run_expiry_pager(int(time.time()) + 3600)
    assert expired > 0
    assert len(bucket.documents()) == workload.live_documents


def test_initial_load_creates_collections_and_ends_on_disk() -> None:
    bucket = SimBucket("shop", num_vbuckets=4, seed=1)
    initial_load(bucket, docs=120, doc_size=512, seed=3)
    assert {c.path for c in bucket.manifest.collections()} >= {t.collection for t in DOCUMENT_TYPES}
    records = bucket.documents()
    assert len(records) == 120
    assert {r.collection for r in records} == {t.collection for t in DOCUMENT_TYPES}
    first = bucket.vbucket(0).open_cursor(0).next_snapshot()
    assert isinstance(first, ServedSnapshot) and first.marker is not None
    assert first.marker.flags & SnapshotFlags.DISK


def test_initial_load_of_100k_documents_writes_them_all() -> None:
    bucket = SimBucket("bench", seed=1)
    initial_load(bucket, docs=100_000, doc_size=1024, seed=1)
    assert sum(bucket.high_seqnos().values()) >= 100_000


def test_run_workload_paces_to_the_rate_and_stops_by_itself() -> None:
    bucket = SimBucket("live", num_vbuckets=8, seed=1)
    workload = initial_load(bucket, docs=100, doc_size=128, seed=1)
    before = sum(bucket.high_seqnos().values())
    report = run_workload(bucket, 400, workload=workload, duration_s=0.5, batch_size=20)
    assert report.elapsed_s >= 0.5  # it ran for its duration, then returned by itself
    assert 0 < report.ops <= 400 * report.elapsed_s + 1  # never faster than the rate
    assert sum(bucket.high_seqnos().values()) >= before + report.ops


def test_default_batches_grow_with_the_rate_not_the_apply_count() -> None:
    assert [live_batch_size(rate) for rate in (20_000, 2_000, 200, 49, 10)] == [400, 40, 4, 1, 1]
    bucket = SimBucket("live", num_vbuckets=8, seed=1)
    workload = initial_load(bucket, docs=100, doc_size=128, seed=1)
    before = sum(bucket.high_seqnos().values())
    report = run_workload(bucket, 2_000, workload=workload, duration_s=0.3)
    # Whole batches of 40 while running, what was due by the deadline at the end: the run
    # applied about rate x duration operations in a few applies, not one apply per operation.
    assert 2_000 * 0.3 * 0.5 <= report.ops <= 2_000 * 0.3
    assert report.batches <= report.ops // 40 + 1
    assert report.batches <= 0.3 * 50 + 1
    assert sum(bucket.high_seqnos().values()) >= before + report.ops


def test_run_workload_stops_when_its_event_is_set() -> None:
    bucket = SimBucket("live", num_vbuckets=8, seed=1)
    stop = threading.Event()
    runner = threading.Thread(target=run_workload, args=(bucket, 50), kwargs={"stop_event": stop})
    runner.start()
    stop.set()
    runner.join(timeout=10)
    assert not runner.is_alive()


def test_run_workload_needs_a_way_to_stop() -> None:
    with pytest.raises(ValueError, match="never stops"):
        run_workload(SimBucket("x", 4), 10)


@pytest.mark.parametrize(
    "weights", [(-1.0, 1.0, 1.0, 1.0), (0.0, 0.0, 0.0, 0.0)], ids=["negative", "all-zero"]
)
def test_mix_rejects_bad_weights(weights: tuple[float, float, float, float]) -> None:
    with pytest.raises(ValueError, match="weights"):
        WorkloadMix(*weights)
