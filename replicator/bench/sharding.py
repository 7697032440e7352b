"""Measurement: the initial load as one replicator and as two shards, on a standalone cluster.

A Spark standalone master and worker(s) on 127.0.0.1 (replicator.runtime.standalone), the
producer in its own process. First one `spark-submit jobs/replicate.py --until-caught-up` loads
every vbucket with all the cluster's cores; then two, `--vbuckets 1/2` and `2/2`, run side by side
into another fresh target, each with half the cores (the second starts once the first has
created the mirror). The clock of a run goes from the first submit to the last exit, so it
includes what an operator waits for: JVM and executor start-up.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from replicator.bench.simulator import SIM_PASSWORD, SIM_USERNAME, SimulatorProcess
from replicator.errors import ReplicatorError
from replicator.runtime.jars import locate_delta_jars
from replicator.runtime.standalone import StandaloneCluster, SubmitResult
from replicator.soak.process import replicator_environment

JOB = Path(__file__).resolve().parents[2] / "jobs" / "replicate.py"
_CAUGHT_UP = re.compile(r"caught up: (\d+) changes")


class ShardedLoadFailed(ReplicatorError):
    """A shard's spark-submit did not end caught up; the message holds its last output."""


@dataclass(frozen=True, slots=True)
class ShardRun:
    """One load: how many shards ran side by side, the wall clock, and each shard's own."""

    shards: int
    cores_per_shard: int
    seconds: float
    shard_seconds: tuple[float, ...]
    changes_committed: int

    @property
    def docs_per_second(self) -> float:
        return self.changes_committed / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class TwoShardLoadResult:
    """The same initial load as one shard and as two, on the same standalone cluster."""

    docs: int
    doc_size: int
    vbuckets: int
    workers: int
    worker_cores: int
    one_shard: ShardRun
    two_shards: ShardRun

    @property
    def speedup(self) -> float:
        """One shard's time over two shards' (above 1: sharding paid)."""
        return self.one_shard.seconds / self.two_shards.seconds


def measure_two_shard_load(
    docs: int,
    doc_size: int,
    vbuckets: int,
    *,
    work_dir: Path,
    workers: int = 1,
    worker_cores: int = 2,
    executor_memory_mb: int = 1024,
    timeout_s: float = 1800.0,
) -> TwoShardLoadResult:
    """Start a standalone cluster and a producer with `docs` documents, then time both loads.

    Each worker gets memory for two executors, so both shards' executors fit at once.
    """
    if docs < 1 or doc_size < 1 or vbuckets < 2:
        raise ValueError("needs docs >= 1, doc_size >= 1 and vbuckets >= 2 (two shards)")
    if not JOB.is_file():
        raise ShardedLoadFailed(f"the spark-submit job is not at {JOB}: run from a source tree")
    work_dir.mkdir(parents=True, exist_ok=True)
    jars = locate_delta_jars().paths
    total_cores = workers * worker_cores
    with (
        SimulatorProcess(
            "shards", docs=docs, doc_size=doc_size, vbuckets=vbuckets,
            log_path=work_dir / "simulator.log",
        ) as simulator,
        StandaloneCluster(
            work_dir / "cluster", workers=workers, worker_cores=worker_cores,
            worker_memory=f"{2 * executor_memory_mb}m",
            executor_memory=f"{executor_memory_mb}m",
        ) as cluster,
    ):
        def load(shards: tuple[str, ...], cores: int, name: str) -> ShardRun:
            return _load(
                cluster, simulator.connection_string, jars, work_dir / name, shards, cores,
                timeout_s=timeout_s,
            )

        one = load(("all",), total_cores, "one-shard")
        two = load(("1/2", "2/2"), max(1, total_cores // 2), "two-shards")
    return TwoShardLoadResult(
        docs=docs, doc_size=doc_size, vbuckets=vbuckets, workers=workers,
        worker_cores=worker_cores, one_shard=one, two_shards=two,
    )


def _load(
    cluster: StandaloneCluster,
    source: str,
    jars: Sequence[Path],
    target: Path,
    shards: tuple[str, ...],
    cores: int,
    *,
    timeout_s: float,
) -> ShardRun:
    """One timed load of `target`: a spark-submit per shard, side by side."""
    results: dict[str, SubmitResult] = {}
    errors: list[BaseException] = []

    def submit(shard: str) -> None:
        try:
            results[shard] = cluster.submit(
                JOB,
                ["--source", source, "--target", str(target), "--username", SIM_USERNAME,
                 "--vbuckets", shard, "--until-caught-up", "--progress", "off"],
                jars=jars,
                conf={"spark.cores.max": str(cores)},
                env=replicator_environment(SIM_PASSWORD),
                timeout_s=timeout_s,
                name=f"{target.name}-{shard.replace('/', 'of')}",
            )
        except BaseException as exc:  # reported below, with the other shard's result
            errors.append(exc)

    started = time.monotonic()
    threads = [threading.Thread(target=submit, args=(shard,)) for shard in shards]
    threads[0].start()
    # The others start once the first has created the mirror and claimed, so that they do
    # not all race to create it.
    first_claim = target / "_replicator" / "owners" / "_delta_log" / f"{1:020d}.json"
    deadline = time.monotonic() + timeout_s
    while threads[0].is_alive() and not first_claim.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - started
    if errors:
        raise ShardedLoadFailed(f"{target.name}: {errors[0]}") from errors[0]
    changes = 0
    for shard in shards:
        result = results[shard]
        found = _CAUGHT_UP.search(result.stdout)
        if result.returncode != 0 or found is None:
            tail = " / ".join(result.stderr.strip().splitlines()[-3:])
            raise ShardedLoadFailed(
                f"{target.name}: shard {shard} exited {result.returncode} without catching up: "
                f"{tail}"
            )
        changes += int(found.group(1))
    return ShardRun(
        shards=len(shards),
        cores_per_shard=cores,
        seconds=seconds,
        shard_seconds=tuple(results[shard].seconds for shard in shards),
        changes_committed=changes,
    )


__all__ = ["ShardRun", "ShardedLoadFailed", "TwoShardLoadResult", "measure_two_shard_load"]
