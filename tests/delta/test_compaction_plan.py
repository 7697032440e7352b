"""Planning a compaction (pure, no Spark): minor passes, partitions packed whole, staggering."""

from __future__ import annotations

import json

import pytest

from replicator.delta.bin_packing import ALL_FILES
from replicator.delta.compaction import CompactionPolicy, plan_compaction
from replicator.delta.deletion_vectors import DeletionVectorDescriptor
from replicator.delta.log_snapshot import DataFile

MB = 1024 * 1024


def _file(name: str, size: int, *, rows: int = 1000, deleted: int = 0) -> DataFile:
    vector = None
    if deleted:
        vector = DeletionVectorDescriptor("u", f"dv-{name}", 40, deleted, 1)
    stats = json.dumps({"numRecords": rows})
    return DataFile(name, {"vbucket_group": "0"}, size, 0, stats, vector)


def _partition(*sizes_mb: float) -> list[DataFile]:
    return [_file(f"f{i}", int(size * MB)) for i, size in enumerate(sizes_mb)]


def test_a_minor_pass_takes_files_under_a_share_of_the_largest_and_leaves_the_rest() -> None:
    plan = plan_compaction({0: _partition(80, 30, 3, 2)}, CompactionPolicy())

    assert plan.packed_under == {0: 20 * MB}  # a quarter of the 80 MB file
    assert plan.whole == () and plan.waiting == ()


def test_a_partition_past_its_file_limit_or_its_deleted_share_is_packed_whole() -> None:
    crowded = _partition(80, 30, 25, 3, 2)  # four files after a minor pass: over three
    deleted = [_file("old", 80 * MB, deleted=400), *_partition(3)]  # 40% of a file deleted
    healthy = _partition(80, 3)
    policy = CompactionPolicy(whole_share=1.0)

    plan = plan_compaction({0: crowded, 1: deleted, 2: healthy, 3: []}, policy)

    assert plan.whole == (0, 1) and plan.waiting == ()
    assert plan.packed_under == {0: ALL_FILES, 1: ALL_FILES, 2: 20 * MB}  # 3 has no files


def test_partitions_due_at_once_are_packed_whole_over_several_compactions_worst_first() -> None:
    # Sixteen partitions, each with a file past the deleted share; two of them also over
    # their file limit: those go first, then the most deleted.
    files = {
        p: [_file(f"base{p}", 80 * MB, deleted=310 + p), *_partition(3)] for p in range(16)
    }
    files[9] = [*files[9], *_partition(40, 30, 25)]
    files[4] = [*files[4], *_partition(40, 30)]

    plan = plan_compaction(files, CompactionPolicy())

    assert CompactionPolicy().whole_at_once(16) == 2
    assert plan.whole == (4, 9)
    assert plan.waiting == tuple(p for p in range(16) if p not in (4, 9))
    assert all(plan.packed_under[p] == 20 * MB for p in plan.waiting)  # still a minor pass

    later = plan_compaction({p: files[p] for p in plan.waiting}, CompactionPolicy())
    assert later.whole == (14, 15)  # the most deleted of the rest


def test_a_lone_file_without_deleted_rows_is_not_rewritten() -> None:
    plan = plan_compaction({0: _partition(0.5)}, CompactionPolicy())

    assert plan.packed_under == {0: MB} and plan.whole == ()


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_a_whole_share_out_of_range_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="whole_share must be in"):
        CompactionPolicy(whole_share=share)
