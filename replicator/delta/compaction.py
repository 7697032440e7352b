"""Compaction of the data table by the replicator itself, between its own commits.

Every group commit adds about one file per partition it touches, and every MERGE marks rows of
older files with deletion vectors. Left alone, files pile up and each MERGE reads more of them.
The replicator therefore compacts its own partitions on its commit thread, after a data commit,
so a compaction never races its own MERGEs.

Compactions are tiered, so that their cost follows the changes rather than the table: a
*minor* compaction bin-packs only the files smaller than a share of a partition's size (the
recent commits' files) and the files whose deleted rows passed `max_deleted_share`; when files
of the owned partitions still number more than `max_files_per_partition` each, a *full*
compaction packs each partition into one file. Until a full compaction has measured the
partitions, "small" means under `small_file_bytes`. Files that appends add (first loads, at the
commit's size cap, one per partition) are not what compaction is for: they do not make one due,
so an initial load rewrites nothing (measured in the README, Performance).

Where the table allows it (local, grouped, writer features known), the compactor writes the
compaction itself from Arrow (`bin_packing`), as OPTIMIZE would leave it; elsewhere, or when
asked (`writer="spark"`), Spark's OPTIMIZE runs it.

Shards: a partition is compacted by the owner of its first vbucket only, so no two shards compact
one partition; a compaction that still meets a concurrent commit gives way (it is retried at the
next due point), never failing the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from replicator.delta.arrow_append import grouped_write_refusal
from replicator.delta.bin_packing import COMPACTION_METADATA, PackedFiles, pack_partitions
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
    from replicator.delta.schema import DataLayout

log = logging.getLogger(__name__)

MIN_FILE_SIZE_CONF = "spark.databricks.delta.optimize.minFileSize"
MAX_DELETED_ROWS_RATIO_CONF = "spark.databricks.delta.optimize.maxDeletedRowsRatio"


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When and what to compact.

    A compaction is due once the table holds `files_per_partition` x the partitions this owner
    compacts more files than right after its last compaction. A minor compaction takes files
    under `small_share` of a partition's size (as measured after the last full compaction),
    and at least those under `small_file_bytes`.
    """

    small_file_bytes: int = 1024 * 1024
    small_share: float = 0.25
    max_deleted_share: float = 0.3
    files_per_partition: int = 2
    max_files_per_partition: int = 3

    def __post_init__(self) -> None:
        if self.small_file_bytes < 1:
            raise ValueError(f"small_file_bytes must be positive, got {self.small_file_bytes}")
        if not 0 < self.small_share <= 1:
            raise ValueError(f"small_share must be in (0, 1], got {self.small_share}")
        if not 0 < self.max_deleted_share <= 1:
            raise ValueError(f"max_deleted_share must be in (0, 1], got {self.max_deleted_share}")
        if self.files_per_partition < 1 or self.max_files_per_partition < 1:
            raise ValueError(
                "files_per_partition and max_files_per_partition must be at least 1, got "
                f"{self.files_per_partition} and {self.max_files_per_partition}"
            )

    def minor_file_bytes(self, partition_bytes: float) -> int:
        """Files below this size are taken by a minor compaction (pure).

        >>> CompactionPolicy().minor_file_bytes(64 * 2**20) // 2**20
        16
        >>> CompactionPolicy().minor_file_bytes(100_000)
        1048576
        """
        return max(self.small_file_bytes, int(partition_bytes * self.small_share))


COMPACTION_WRITERS = ("arrow", "spark")
"""Who writes a compaction: the compactor from Arrow where the table allows it, or Spark."""

FULL_COMPACTION_FILE_BYTES = 1024 * 1024 * 1024
"""A full compaction takes files up to OPTIMIZE's target file size (1 GiB): all of them."""


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

    def pack(
        self, partitions: Sequence[int], *, min_file_bytes: int, max_deleted_share: float
    ) -> PackedFiles | None: ...


@dataclass(frozen=True, slots=True)
class CompactionOutcome:
    """One compaction: table files before and after, whether it was full, how long it took."""

    files_before: int
    files_after: int
    seconds: float
    full: bool = False


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
        self._partition_bytes: float | None = None
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
        listed = ", ".join(str(p) for p in self.partitions)
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
        """Compact this owner's partitions now (minor, or full when needed); None when a
        concurrent commit got in the way."""
        before = self.table_files()
        started = time.monotonic()
        small = (
            self.policy.small_file_bytes
            if self._partition_bytes is None
            else self.policy.minor_file_bytes(self._partition_bytes)
        )
        if not self._optimize(small):
            return None
        limit = self.policy.max_files_per_partition * len(self.partitions)
        full = self.owned_files() > limit
        if full:
            if not self._optimize(FULL_COMPACTION_FILE_BYTES):
                return None
            self._partition_bytes = self._mean_file_bytes()
            self.full_compactions += 1
        after = self.table_files()
        self._files_after_last = after
        self.compactions += 1
        outcome = CompactionOutcome(before, after, time.monotonic() - started, full)
        log.info("%s compaction of %d partitions: %d -> %d files in %.1fs",
                 "full" if full else "minor", len(self.partitions), before, after,
                 outcome.seconds)
        return outcome

    def _mean_file_bytes(self) -> float:
        """The table's bytes per file (right after a full compaction: per partition)."""
        if self._reads_log:
            sizes = [data_file.size for data_file in self._newest_log().files.values()]
            return sum(sizes) / max(len(sizes), 1)
        snapshot = delta_snapshot(self.mirror.spark, self.mirror.layout.data)
        return int(snapshot.sizeInBytes()) / max(int(snapshot.numOfFiles()), 1)

    def _optimize(self, min_file_bytes: int) -> bool:
        """Bin-pack the owned partitions' files under `min_file_bytes` (and those with too many
        deleted rows); False when a concurrent commit got in the way."""
        if self.writer == "arrow":
            return self._pack(min_file_bytes)
        spark = self.mirror.spark
        try:
            # delta_write_confs holds the session write lock, which the OPTIMIZE confs need too.
            with delta_write_confs(spark, user_metadata=COMPACTION_METADATA):
                spark.conf.set(MIN_FILE_SIZE_CONF, str(min_file_bytes))
                spark.conf.set(MAX_DELETED_ROWS_RATIO_CONF, str(self.policy.max_deleted_share))
                try:
                    self.mirror.delta().optimize().where(self.partition_filter).executeCompaction()
                finally:
                    spark.conf.unset(MIN_FILE_SIZE_CONF)
                    spark.conf.unset(MAX_DELETED_ROWS_RATIO_CONF)
        except Exception as exc:
            if not is_concurrent_modification(exc):
                raise
            log.info("compaction gave way to a concurrent commit: %s", engine_error_summary(exc))
            return False
        return True

    def _pack(self, min_file_bytes: int) -> bool:
        """`_optimize` written from Arrow (`bin_packing`): by the steady writer where it has
        one (in its own process), else here."""
        packer = self._packer() if self._packer is not None else None
        if packer is not None:
            packed = packer.pack(
                self.partitions, min_file_bytes=min_file_bytes,
                max_deleted_share=self.policy.max_deleted_share,
            )  # fmt: skip
        else:
            packed = pack_partitions(
                local_path(self.mirror.layout.data), self.mirror.data_layout,
                self._newest_log(), self.partitions, min_file_bytes=min_file_bytes,
                max_deleted_share=self.policy.max_deleted_share, images=self._images,
            )  # fmt: skip
        if packed is None:
            log.info("compaction gave way to a concurrent commit")
            return False
        if packed.version is not None:
            checkpoint_if_due(self.mirror.spark, self.mirror.layout.data, packed.version)
        return True
