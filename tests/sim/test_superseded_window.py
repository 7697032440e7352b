"""A producer whose memory follows its live documents: `superseded_window` frees old versions."""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence

import pytest

from replicator.errors import ConfigError
from replicator.sim.cli import _build_bucket, _check_options, add_sim_arguments
from replicator.sim.history_items import DocumentWrite
from replicator.sim.vbucket import ServedSnapshot, StreamCursor, VBucket
from tests.sim.test_vbucket import Snapshot, delete, new_vbucket, snapshots, upsert

WINDOW = 20


def batches(seed: int, count: int, keys: int = 6) -> list[list[DocumentWrite]]:
    """`count` batches of upserts and deletes over a few keys: most writes replace a version."""
    rng = random.Random(seed)
    live: set[str] = set()
    out = []
    for _ in range(count):
        batch: list[DocumentWrite] = []
        for _ in range(rng.randint(1, 4)):
            key = f"k{rng.randrange(keys)}"
            if key in live and rng.random() < 0.2 and all(w.key != key.encode() for w in batch):
                batch.append(delete(key))
                live.discard(key)
            elif all(w.key != key.encode() for w in batch):
                batch.append(upsert(key, f'{{"v":{rng.random()}}}'))
                live.add(key)
        out.append(batch)
    return out


def twins(writes: Sequence[list[DocumentWrite]]) -> tuple[VBucket, VBucket]:
    """The same writes into a vbucket keeping every version and one with the window, both with
    checkpoints of WINDOW items (the window caps them)."""
    kept = new_vbucket(checkpoint_max_items=WINDOW)
    windowed = new_vbucket(superseded_window=WINDOW)
    for batch in writes:
        kept.apply_writes(batch)
        windowed.apply_writes(batch)
    return kept, windowed


def served(snaps: Sequence[Snapshot]) -> list[tuple[int, int, list[int]]]:
    return [(s.marker.start_seqno, s.marker.end_seqno, [i.by_seqno for i in s.items])
            for s in snaps]


def test_old_versions_are_freed_and_the_live_state_is_unchanged() -> None:
    kept, windowed = twins(batches(1, 200))
    high = windowed.high_seqno
    freed = windowed.earliest_state_seqno
    assert high - 2 * WINDOW <= freed <= high - WINDOW  # checkpoints hold at most WINDOW items
    assert windowed.documents() == kept.documents()
    for seqno in range(freed, high + 1):
        assert windowed.state_at(seqno) == kept.state_at(seqno)
    with pytest.raises(ValueError, match="superseded_window 20"):
        windowed.state_at(freed - 1)
    replaced = [s for s in range(1, freed) if kept.item_at(s) not in kept.documents()]
    assert replaced, "the workload replaced versions below the freed seqno"
    with pytest.raises(ValueError, match=f"seqno {replaced[0]} was replaced and freed"):
        windowed.item_at(replaced[0])


def test_a_new_stream_is_served_exactly_what_a_full_history_serves() -> None:
    kept, windowed = twins(batches(2, 300))
    for start in (0, windowed.earliest_state_seqno - 5, windowed.high_seqno - 3):
        assert served(snapshots(windowed.open_cursor(start), 7)) == served(
            snapshots(kept.open_cursor(start), 7)
        )


def test_a_backfill_in_progress_keeps_the_versions_of_its_end_seqno() -> None:
    writes = batches(3, 400)
    kept, windowed = twins(writes[:100])
    end = windowed.high_seqno
    windowed.evict_checkpoints()  # a new stream now backfills up to `end`
    kept.evict_checkpoints()
    cursors = (kept.open_cursor(0), windowed.open_cursor(0))
    first = [cursor.next_snapshot(2) for cursor in cursors]  # the disk snapshot has begun
    assert first[0] == first[1]
    assert first[1] is not None and first[1].marker is not None  # type: ignore[union-attr]
    assert first[1].marker.end_seqno == end and first[1].from_disk  # type: ignore[union-attr]
    for batch in writes[100:]:  # replaces every version it is still to serve, many times over
        kept.apply_writes(batch)
        windowed.apply_writes(batch)
    # Versions replaced after `end` stay while the backfill needs them; the rest went.
    assert windowed.earliest_state_seqno <= end
    with pytest.raises(ValueError, match="was replaced and freed"):
        windowed.item_at(next(s for s in range(1, end) if s not in kept_live_at(kept, end)))
    rest = [served_items(cursor) for cursor in cursors]
    assert rest[0] == rest[1]
    # Once it is served, they go too.
    windowed.apply_writes([upsert("k0", '{"last":1}')])
    assert windowed.earliest_state_seqno > end


def test_a_memory_snapshot_in_progress_keeps_its_versions() -> None:
    kept, windowed = twins(batches(6, 50))
    cursors = [kept.open_cursor(kept.high_seqno), windowed.open_cursor(windowed.high_seqno)]
    batch = [upsert(f"m{n}", f'{{"first":{n}}}') for n in range(WINDOW - 5)]
    for vbucket in (kept, windowed):
        vbucket.apply_writes(batch)
    first = [cursor.next_snapshot(3) for cursor in cursors]  # a part of that memory snapshot
    assert first[0] == first[1]
    assert first[1] is not None and not first[1].from_disk  # type: ignore[union-attr]
    for round_ in range(10):  # every document of the snapshot replaced, 10 times over
        again = [upsert(f"m{n}", f'{{"round":{round_}}}') for n in range(WINDOW - 5)]
        kept.apply_writes(again)
        windowed.apply_writes(again)
    assert windowed.earliest_state_seqno > 0
    rest = [served_items(cursor) for cursor in cursors]
    assert rest[0] == rest[1]


def kept_live_at(vbucket: VBucket, seqno: int) -> set[int]:
    return {document.by_seqno for document in vbucket.state_at(seqno)}


def served_items(cursor: StreamCursor) -> list[tuple[int, int]]:
    """(seqno, revision) of everything a cursor serves now, markers and parts aside."""
    out: list[tuple[int, int]] = []
    while (part := cursor.next_snapshot(3)) is not None:
        if isinstance(part, ServedSnapshot):
            out.extend((item.by_seqno, getattr(item, "rev_seqno", 0)) for item in part.items)
    return out


def test_a_failover_within_the_window_restores_the_versions_it_uncovers() -> None:
    kept, windowed = twins(batches(4, 200))
    kept.failover(WINDOW)
    windowed.failover(WINDOW)
    assert windowed.documents() == kept.documents()
    windowed.apply_writes([upsert("k1", '{"after":1}')])
    assert windowed.documents()[-1].value == b'{"after":1}'


def test_a_failover_beyond_the_freed_versions_is_refused_and_changes_nothing() -> None:
    _kept, windowed = twins(batches(5, 200))
    high, documents = windowed.high_seqno, windowed.documents()
    too_far = high - windowed.earliest_state_seqno + 1
    with pytest.raises(ValueError, match=r"were freed: superseded_window 20"):
        windowed.failover(too_far)
    assert (windowed.high_seqno, windowed.documents()) == (high, documents)


def test_the_window_cannot_go_with_history_retention_or_be_empty() -> None:
    with pytest.raises(ValueError, match="retains history"):
        new_vbucket(superseded_window=10, history_retention_seconds=60)
    with pytest.raises(ValueError, match="must be positive"):
        new_vbucket(superseded_window=0)


def sim_args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    args = parser.parse_args(["--port", "0", "--vbuckets", "4", *flags])
    _check_options(args, [kind for kind in args.faults.split(",") if kind])
    return args


def test_the_command_line_window_reaches_every_vbucket() -> None:
    bucket = _build_bucket(sim_args("--superseded-window", "3"))
    vbucket = bucket.vbucket(2)
    for round_ in range(10):
        vbucket.apply_writes([upsert("same", f'{{"v":{round_}}}')])
    assert vbucket.earliest_state_seqno == 7
    assert [d.value for d in vbucket.documents()] == [b'{"v":9}']


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--superseded-window", "0"], "--superseded-window must be positive, got 0"),
        (
            ["--superseded-window", "100", "--history-retention-seconds", "60"],
            "cannot go with --history-retention",
        ),
        (
            ["--superseded-window", "5", "--faults", "failover", "--failover-lose", "10"],
            "--superseded-window 5 is below --failover-lose 10",
        ),
    ],
)
def test_the_command_line_names_a_window_it_cannot_use(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        sim_args(*flags)
