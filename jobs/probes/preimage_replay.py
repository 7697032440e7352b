"""Probe: successive steady commits of the deletion-vector writer, preimages from Parquet or
from row images, in this process or in the writer's child process, on copies of one mirror
(README, "Preimages by position" and "The steady writer in a process of its own").

A measurement behind a design decision, not product code. It copies a mirror three times and
commits the same batches (80% updates, 10% deletes, 10% inserts of random documents, about 1 KB
each) into each copy: with `DeletionVectorMerger` reading preimages from the data files' Parquet,
with it reading them from row images, and with `WriterProcess` (row images, in a child process);
it times every commit. With `--busy` a thread runs Python the whole time, as the replication
thread does beside the commit thread. The first commit into an images copy writes the images of
the files it touches (a first load leaves none); later ones take from them. All copies must end
with the same rows and change data feed.

    .venv/bin/python -m jobs.probes.preimage_replay SOURCE_MIRROR WORK_DIR \
        [--changes 50000] [--commits 6] [--busy]
"""

from __future__ import annotations

import argparse
import os
import shutil
import threading
import time
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replicator.delta.commit_metadata import COMMIT, CommitMetadata
from replicator.delta.dv_merge import DeletionVectorMerger
from replicator.delta.key_index import KeyIndex
from replicator.delta.log_snapshot import read_snapshot
from replicator.delta.schema import DataLayout
from replicator.delta.writer_process import WriterProcess
from replicator.model.positions import VbucketPosition
from replicator.staging.rows import CHANGE_SCHEMA, DELETE, UPSERT


def _live_keys(root: str) -> pa.Table:
    """Every live document's key columns, file and position."""
    index = KeyIndex(root)
    index.refresh(read_snapshot(root))
    return index.live_rows()


def _layout(root: str) -> DataLayout:
    from deltalake import DeltaTable

    width = int(DeltaTable(root).metadata().configuration["replicator.vbucketGroupWidth"])
    return DataLayout(width)


def _batches(keys: pa.Table, changes: int, commits: int, seed: int) -> list[pa.Table]:
    """`commits` batches of `changes` distinct documents each: updates and deletes of live
    documents, inserts of new ones."""
    rng = np.random.default_rng(seed)
    pad = "x" * 900
    batches = []
    seqno = 10**9
    for number in range(commits):
        chosen = keys.take(pa.array(rng.choice(keys.num_rows, changes, replace=False)))
        inserts = changes // 10
        ops = np.array([UPSERT] * (changes - changes // 10) + [DELETE] * (changes // 10))
        rng.shuffle(ops)
        vbuckets = chosen["vbucket"].to_numpy().copy()
        collection_ids = chosen["collection_id"].to_numpy().copy()
        names = chosen["key"].to_pylist()
        for i in range(inserts):  # the first tenth become new documents
            names[i] = f"new-{number}-{i}"
            ops[i] = UPSERT
        seqnos = np.arange(seqno, seqno + changes)
        seqno += changes
        docs = [None if op == DELETE else f'{{"n":{number},"s":{s},"p":"{pad}"}}'
                for op, s in zip(ops, seqnos, strict=True)]  # fmt: skip
        columns = {
            "vbucket": pa.array(vbuckets, pa.int32()),
            "scope": pa.array(["_default"] * changes),
            "collection": pa.array(["_default"] * changes),
            "collection_id": pa.array(collection_ids, pa.int64()),
            "key": pa.array(names),
            "seqno": pa.array(seqnos, pa.int64()),
            "rev_seqno": pa.array(np.ones(changes, np.int64)),
            "cas": pa.array(seqnos * 1000, pa.int64()),
            "flags": pa.array(np.zeros(changes, np.int64)),
            "expiry": pa.nulls(changes, CHANGE_SCHEMA.field("expiry").type),
            "is_json": pa.array(np.ones(changes, bool)),
            "op": pa.array(ops.tolist()),
            "doc": pa.array(docs, pa.string()),
            "value": pa.nulls(changes, pa.binary()),
            "xattrs": pa.nulls(changes, pa.string()),
        }
        batches.append(pa.table([columns[name] for name in CHANGE_SCHEMA.names],
                                schema=CHANGE_SCHEMA))  # fmt: skip
    return batches


def _metadata(batch_id: int, vbuckets: Sequence[int]) -> CommitMetadata:
    return CommitMetadata(
        kind=COMMIT, batch_id=batch_id, part=1, owner_id="preimage-replay", strategy="merge",
        positions={vb: VbucketPosition(vb, 1, batch_id, batch_id, batch_id) for vb in vbuckets},
    )  # fmt: skip


def _busy(stop: threading.Event) -> None:
    total = 0
    while not stop.is_set():
        for i in range(1000):
            total += i * i


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("source")
    parser.add_argument("work")
    parser.add_argument("--changes", type=int, default=50_000)
    parser.add_argument("--commits", type=int, default=6)
    parser.add_argument("--busy", action="store_true")
    args = parser.parse_args()
    copies = {}
    for name in ("parquet", "images", "child"):
        copy = copies[name] = os.path.join(args.work, name)
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(args.source, copy, ignore=shutil.ignore_patterns("_replicator"))
    keys = _live_keys(copies["parquet"])
    print(f"{keys.num_rows:,} live rows; {len(read_snapshot(copies['parquet']).files)} files")
    batches = _batches(keys, args.changes, args.commits, seed=7)
    vbuckets = sorted(set(keys["vbucket"].to_pylist()))
    stop = threading.Event()
    if args.busy:
        threading.Thread(target=_busy, args=(stop,), daemon=True).start()
    try:
        for name, copy in copies.items():
            merger: DeletionVectorMerger | WriterProcess = (
                WriterProcess(copy, _layout(copy)) if name == "child"
                else DeletionVectorMerger(copy, _layout(copy), row_images=name == "images")
            )  # fmt: skip
            times = []
            for number, changes in enumerate(batches):
                started = time.perf_counter()
                landed = merger.merge(changes, _metadata(number + 1, vbuckets))
                times.append(time.perf_counter() - started)
                assert landed is not None
            hits = ""
            if isinstance(merger, WriterProcess):
                merger.close()
            elif merger.images is not None:
                hits = f", images hit/missed {merger.images.hits}/{merger.images.misses}"
            print(f"{name}: commits " + " ".join(f"{t:.2f}" for t in times) + f" s{hits}")
    finally:
        stop.set()
    tables = {name: _live_keys(copy) for name, copy in copies.items()}
    same = len({table.num_rows for table in tables.values()}) == 1
    feeds = {}
    for name, copy in copies.items():
        files = [os.path.join(folder, f) for folder, _, fs in os.walk(copy + "/_change_data")
                 for f in fs if f.endswith(".parquet")]  # fmt: skip
        # Each change's identity and kind (the rows' contents are Arrow's to copy alike).
        identity = ["vbucket", "key", "seqno", "_change_type"]
        feed = pa.concat_tables(pq.read_table(f, columns=identity) for f in files)
        feeds[name] = feed.sort_by([(column, "ascending") for column in identity])
    print(
        f"same live rows: {same} ({tables['images'].num_rows:,}); same change data feed: "
        f"{all(feed.equals(feeds['parquet']) for feed in feeds.values())} "
        f"({feeds['images'].num_rows:,} rows, "
        f"{pc.sum(pc.equal(feeds['images']['_change_type'], 'update_preimage'))} preimages)"
    )


if __name__ == "__main__":
    main()
