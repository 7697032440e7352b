"""Compaction of the data table by the replicator itself, between its own commits.

Every group commit adds about one file per partition it touches, and every MERGE marks rows of
older files with deletion vectors. Left alone, files pile up and each MERGE reads more of them.
The replicator therefore compacts its own partitions on its commit thread, after a data commit,
so a compaction never races its own MERGEs.

Compactions are tiered, so that their cost follows the changes rather than the table, and
staggered, so that no one compaction rewrites the table. Each partition is planned on its own
(`plan_compaction`, pure): a *minor* pass packs the files smaller than a share of the
partition's largest file (the recent commits' files, however large the partition); a partition
left with more than `max_files_per_partition` files, or holding a file whose deleted rows passed
`max_deleted_share`, is *packed whole* instead. Updates spread evenly bring every partition to
that point in the same commit, so at most `whole_share` of the partitions are packed whole in one
compaction, those furthest past their limits first; the others wait for the next (measured in
the README, "Staggered compactions"). Files that appends add (first loads, at the commit's size
cap, one per partition) are not what compaction is for: they do not make one due, so an initial
load rewrites nothing (measured in the README, Performance).

Where the table allows it (local, grouped, writer features known), the compactor writes the
compaction itself from Arrow (`bin_packing`), as OPTIMIZE would leave it; elsewhere, or when
asked (`writer="spark"`), Spark's OPTIMIZE runs it.

Shards: a partition is compacted by the owner of its first vbucket only, so no two shards compact
one partition; a compaction that still meets a concurrent commit gives way (it is retried at the
next due point), never failing the run.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from replicator.delta.arrow_append import grouped_write_refusal
from replicator.delta.bin_packing import (
    ALL_FILES,
    COMPACTION_METADATA,
    PackedFiles,
    candidates,
    deleted_share,
    files_by_partition,
    pack_partitions,
)
from replicator.delta.conflicts import is_concurrent_modification
from replicator.delta.log_checkpoints import checkpoint_if_due
from replicator.delta.log_snapshot import LogSnapshot, LogSnapshotError, read_snapshot
from replicator.delta.paths import local_path, on_local_filesystem
from replicator.delta.row_images import RowImages
from replicator.delta.table import (
    MirrorTable,
    delta_snapshot,
    delta_write_confs,
    engine_error_summary,
)

if TYPE_CHECKING:
    from replicator.delta.log_snapshot import DataFile
    from replicator.delta.schema import DataLayout

log = logging.getLogger(__name__)

MIN_FILE_SIZE_CONF = "spark.databricks.delta.optimize.minFileSize"
MAX_DELETED_ROWS_RATIO_CONF = "spark.databricks.delta.optimize.maxDeletedRowsRatio"


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When and what to compact.

    A compaction is due once the table holds `files_per_partition` x the partitions this owner
    compacts more files than right after its last compaction. A minor pass takes a partition's
    files under `small_share` of its largest file, and at least those under `small_file_bytes`.
    A partition left with more than `max_files_per_partition` files, or with a file whose
    deleted rows passed `max_deleted_share`, is packed whole; `whole_share` of the partitions
    (at least one) at most in one compaction.
    """

    small_file_bytes: int = 1024 * 1024
    small_share: float = 0.25
    max_deleted_share: float = 0.3
    files_per_partition: int = 2
    max_files_per_partition: int = 3
    whole_share: float = 0.125

    def __post_init__(self) -> None:
        if self.small_file_bytes < 1:
            raise ValueError(f"small_file_bytes must be positive, got {self.small_file_bytes}")
        if not 0 < self.small_share <= 1:
            raise ValueError(f"small_share must be in (0, 1], got {self.small_share}")
        if not 0 < self.max_deleted_share <= 1:
            raise ValueError(f"max_deleted_share must be in (0, 1], got {self.max_deleted_share}")
        if not 0 < self.whole_share <= 1:
            raise ValueError(f"whole_share must be in (0, 1], got {self.whole_share}")
        if self.files_per_partition < 1 or self.max_files_per_partition < 1:
            raise ValueError(
                "files_per_partition and max_files_per_partition must be at least 1, got "
                f"{self.files_per_partition} and {self.max_files_per_partition}"
            )

    def minor_file_bytes(self, largest_file_bytes: float) -> int:
        """A partition's files below this size are taken by a minor pass (pure).

        >>> CompactionPolicy().minor_file_bytes(64 * 2**20) // 2**20
        16
        >>> CompactionPolicy().minor_file_bytes(100_000)
        1048576
        """
        return max(self.small_file_bytes, int(largest_file_bytes * self.small_share))

    def whole_at_once(self, partitions: int) -> int:
        """How many of `partitions` one compaction packs whole at most (pure).

        >>> CompactionPolicy().whole_at_once(16), CompactionPolicy().whole_at_once(2)
        (2, 1)
        """
        return max(1, math.ceil(partitions * self.whole_share))


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """What one compaction packs: each partition's size bound (`ALL_FILES` for a partition
    packed whole), and the partitions due to be packed whole that wait for a later one."""

    packed_under: Mapping[int, int]
    whole: tuple[int, ...]
    waiting: tuple[int, ...]


def plan_compaction(
    files: Mapping[int, Sequence[DataFile]], policy: CompactionPolicy
) -> CompactionPlan:
    """Plan a compaction of the partitions `files` holds (pure): partition -> its live files.

    Partitions due to be packed whole are ranked by the files they would keep past the limit,
    then by their most deleted file's share; a partition without files needs nothing.
    """
    bounds: dict[int, int] = {}
    due: list[tuple[int, float, int]] = []
    for partition, partition_files in files.items():
        if not partition_files:
            continue
        bound = policy.minor_file_bytes(max(f.size for f in partition_files))
        bounds[partition] = bound
        # Deleted rows are not a minor pass's concern: a file past the share means the whole
        # partition, which the ranking below staggers.
        picked = candidates(partition_files, bound, max_deleted_share=1.0)
        kept = len(partition_files) - len(picked) + (1 if picked else 0)
        excess = kept - policy.max_files_per_partition
        most_deleted = max(deleted_share(f) for f in partition_files)
        if excess > 0 or most_deleted > policy.max_deleted_share:
            due.append((excess, most_deleted, partition))
    due.sort(key=lambda d: (-d[0], -d[1], d[2]))
    at_once = policy.whole_at_once(len(files))
    whole = tuple(sorted(partition for _, _, partition in due[:at_once]))
    for partition in whole:
        bounds[partition] = ALL_FILES
    waiting = tuple(sorted(partition for _, _, partition in due[at_once:]))
    return CompactionPlan(bounds, whole, waiting)


COMPACTION_WRITERS = ("arrow", "spark")
"""Who writes a compaction: the compactor from Arrow where the table allows it, or Spark."""

FULL_COMPACTION_FILE_BYTES = 1024 * 1024 * 1024
"""Spark's OPTIMIZE of a partition packed whole takes files up to its target file size (1 GiB)."""


def compacted_partitions(layout: DataLayout, vbuckets: Iterable[int]) -> list[int]:
    """The partitions an owner of `vbuckets` compacts: those whose first vbucket it owns (pure).

    >>> from replicator.delta.schema import DataLayout
    >>> compacted_partitions(DataLayout(64), range(32, 200))
    [1, 2, 3]
    >>> compacted_partitions(DataLayout(None), [4, 9])
    [4, 9]
    """
    owned = set(vbuckets)
    if layout.group_width is None:
        return sorted(owned)
    return [g for g in layout.groups(owned) if g * layout.group_width in owned]


class Packer(Protocol):
    """Who writes a compaction from Arrow for the compactor (the steady writer)."""

    def pack(self, packed_under: Mapping[int, int]) -> PackedFiles | None: ...


@dataclass(frozen=True, slots=True)
class CompactionOutcome:
    """One compaction: table files before and after, how long it took, the partitions it
    packed whole and those due to be that wait for a later compaction."""

    files_before: int
    files_after: int
    seconds: float
    whole: tuple[int, ...] = ()
    waiting: tuple[int, ...] = ()

    @property
    def full(self) -> bool:
        """Whether it packed a partition whole."""
        return bool(self.whole)


class Compactor:
    """Compacts one owner's partitions of a mirror when enough files have accumulated."""

    def __init__(
        self,
        mirror: MirrorTable,
        vbuckets: Iterable[int],
        policy: CompactionPolicy | None = None,
        writer: str = "arrow",
        *,
        row_images: bool = True,
        packer: Callable[[], Packer | None] | None = None,
    ) -> None:
        if writer not in COMPACTION_WRITERS:
            raise ValueError(f"writer must be one of {COMPACTION_WRITERS}, not {writer!r}")
        self.mirror = mirror
        self.policy = policy or CompactionPolicy()
        self.partitions = compacted_partitions(mirror.data_layout, vbuckets)
        self._files_after_last: int | None = None
        # On local disk the files are counted from the log itself: after a version committed
        # without Spark, Delta's snapshot counts them with Spark jobs (2 s and more a look on
        # the 1M mirror), and the owned partitions' files took a Spark job every compaction.
        self._log: LogSnapshot | None = None
        self._reads_log = on_local_filesystem(mirror.layout.data)
        self.writer = writer
        if writer == "arrow":
            refusal = grouped_write_refusal(mirror.layout.data, mirror.data_layout)
            if refusal is not None:
                log.info("compactions are run by Spark's OPTIMIZE: %s", refusal)
                self.writer = "spark"
        self._packer = packer
        self._images = None
        if self.writer == "arrow" and row_images:
            # The steady writer's images (`row_images`): read instead of decoding Parquet.
            self._images = RowImages(local_path(mirror.layout.data))
        self.compactions = 0
        self.full_compactions = 0

    def table_files(self) -> int:
        """Files in the data table's newest version."""
        if self._reads_log:
            return len(self._newest_log().files)
        return int(delta_snapshot(self.mirror.spark, self.mirror.layout.data).numOfFiles())

    @property
    def partition_filter(self) -> str:
        """The predicate naming the partitions this owner compacts."""
        return self._filter(self.partitions)

    def _filter(self, partitions: Iterable[int]) -> str:
        listed = ", ".join(str(p) for p in partitions)
        return f"{self.mirror.data_layout.partition_column} IN ({listed})"

    def owned_files(self) -> int:
        """Files in the partitions this owner compacts."""
        if not self._reads_log:
            return len(self.mirror.read().where(self.partition_filter).inputFiles())
        column = self.mirror.data_layout.partition_column
        owned = {str(p) for p in self.partitions}
        return sum(
            1
            for data_file in self._newest_log().files.values()
            if data_file.partition_values.get(column) in owned
        )

    def _newest_log(self) -> LogSnapshot:
        """The table's log at its newest version (only the commits since the last look read)."""
        try:
            self._log = read_snapshot(self.mirror.layout.data, since=self._log)
        except LogSnapshotError:
            if self._log is None:
                raise
            # The commits after the last look are gone (log retention): from the checkpoint.
            self._log = read_snapshot(self.mirror.layout.data)
        return self._log

    def due(self, table_files: int | None = None) -> bool:
        """Whether enough files have accumulated; `table_files` is the table's file count when
        the last commit's writer gave it (Delta's snapshot counts them with Spark jobs after a
        version committed without Spark: about 2 s a batch on the 1M mirror)."""
        if not self.partitions:
            return False
        files = self.table_files() if table_files is None else table_files
        if self._files_after_last is None:
            self._files_after_last = files
        allowance = self.policy.files_per_partition * len(self.partitions)
        return files >= self._files_after_last + allowance

    def compact_if_due(self, table_files: int | None = None) -> CompactionOutcome | None:
        return self.compact() if self.due(table_files) else None

    def note_appended(self, table_files: int | None = None) -> None:
        """The commits since the last look only appended: their files count as healthy.

        `table_files` is the table's file count after them when the writer gave it (no look
        at Delta's snapshot then)."""
        if self.partitions:
            self._files_after_last = self.table_files() if table_files is None else table_files

    def compact(self) -> CompactionOutcome | None:
        """Compact this owner's partitions now (`plan_compaction`); None when a concurrent
        commit got in the way."""
        started = time.monotonic()
        if self._reads_log:
            snapshot = self._newest_log()
            before = len(snapshot.files)  # the log just read: no second look
            files = files_by_partition(snapshot, self.mirror.data_layout, self.partitions)
            plan = plan_compaction({p: files.get(p, []) for p in self.partitions}, self.policy)
        else:
            before = self.table_files()
            plan = self._plan_from_spark()
        if plan.packed_under and not self._optimize(plan):
            return None
        after = self.table_files()
        self._files_after_last = after
        self.compactions += 1
        self.full_compactions += bool(plan.whole)
        outcome = CompactionOutcome(
            before, after, time.monotonic() - started, plan.whole, plan.waiting
        )
        log.info("compaction of %d partitions, %d packed whole (%d more waiting): "
                 "%d -> %d files in %.1fs", len(self.partitions), len(plan.whole),
                 len(plan.waiting), before, after, outcome.seconds)  # fmt: skip
        return outcome

    def _plan_from_spark(self) -> CompactionPlan:
        """Off local disk the log is not read here: a minor pass over the owned partitions,
        and all of them packed whole when they hold more files than their limit."""
        minor = dict.fromkeys(self.partitions, self.policy.small_file_bytes)
        if self.owned_files() <= self.policy.max_files_per_partition * len(self.partitions):
            return CompactionPlan(minor, (), ())
        return CompactionPlan(dict.fromkeys(self.partitions, ALL_FILES), tuple(self.partitions), ())

    def _optimize(self, plan: CompactionPlan) -> bool:
        """Pack what `plan` says; False when a concurrent commit got in the way."""
        if self.writer == "arrow":
            return self._pack(plan.packed_under)
        # Spark's OPTIMIZE takes one size bound a command: the partitions packed whole, then the
        # others under the smallest of their bounds.
        minor = {p: b for p, b in plan.packed_under.items() if p not in plan.whole}
        passes = [(plan.whole, FULL_COMPACTION_FILE_BYTES, self.policy.max_deleted_share)]
        if minor:
            passes.append((tuple(minor), min(minor.values()), 1.0))
        spark = self.mirror.spark
        try:
            for partitions, min_file_bytes, deleted_ratio in passes:
                if not partitions:
                    continue
                # delta_write_confs holds the session write lock, which the OPTIMIZE confs
                # need too.
                with delta_write_confs(spark, user_metadata=COMPACTION_METADATA):
                    spark.conf.set(MIN_FILE_SIZE_CONF, str(min_file_bytes))
                    spark.conf.set(MAX_DELETED_ROWS_RATIO_CONF, str(deleted_ratio))
                    try:
                        self.mirror.delta().optimize().where(
                            self._filter(partitions)
                        ).executeCompaction()
                    finally:
                        spark.conf.unset(MIN_FILE_SIZE_CONF)
                        spark.conf.unset(MAX_DELETED_ROWS_RATIO_CONF)
        except Exception as exc:
            if not is_concurrent_modification(exc):
                raise
            log.info("compaction gave way to a concurrent commit: %s", engine_error_summary(exc))
            return False
        return True

    def _pack(self, packed_under: Mapping[int, int]) -> bool:
        """`_optimize` written from Arrow (`bin_packing`): by the steady writer where it has
        one (in its own process), else here."""
        packer = self._packer() if self._packer is not None else None
        if packer is not None:
            packed = packer.pack(packed_under)
        else:
            packed = pack_partitions(
                local_path(self.mirror.layout.data), self.mirror.data_layout,
                self._newest_log(), packed_under, images=self._images,
            )  # fmt: skip
        if packed is None:
            log.info("compaction gave way to a concurrent commit")
            return False
        if packed.version is not None:
            checkpoint_if_due(self.mirror.spark, self.mirror.layout.data, packed.version)
        return True
