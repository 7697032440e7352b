"""The disk filling up while staging spills, as an operator meets it: `replicator run` exits 2
with one line naming the staging directory and what to do, and commits no partial snapshot.

A full disk cannot be made without root (no tiny tmpfs), so the command runs under a driver
that gives `run_replication` a fault hook raising ENOSPC where the stager writes a spill file;
everything else is the real command in a real subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicator.cli.main import EXIT_USAGE
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import Workload
from tests.cli import PASSWORD, REPO, assert_one_line_error, clean_env

DISK_FULL_DRIVER = """
import errno
import sys

import replicator.pipeline.runner as runner

real_run_replication = runner.run_replication


def disk_full(step):
    if step == "before_spill_write":
        raise OSError(errno.ENOSPC, "No space left on device")


def run_with_a_full_disk(config, **options):
    return real_run_replication(config, fault_hook=disk_full, **options)


runner.run_replication = run_with_a_full_disk
from replicator.cli.main import main

sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    bucket = SimBucket("travel", num_vbuckets=2, seed=41)
    # ~11 MB in one disk snapshot per vbucket: more than the 8 MB memory budget holds.
    workload = Workload(seed=41, doc_size=3000)
    workload.ensure_collections(bucket)
    bucket.apply_batch(workload.inserts(3600))
    bucket.evict_checkpoints()
    with SimCluster(bucket, nodes=1, users={"Administrator": PASSWORD}) as running:
        yield running


def committed_files(target: Path) -> list[str]:
    """Data files added by any commit of the Delta table at `target`."""
    added: list[str] = []
    for entry in sorted((target / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                added.append(action["add"]["path"])
    return added


def test_disk_full_while_spilling_exits_2_with_one_line_and_commits_nothing(
    cluster: SimCluster, tmp_path: Path
) -> None:
    target, staging = tmp_path / "mirror", tmp_path / "staging"
    completed = subprocess.run(
        [sys.executable, "-c", DISK_FULL_DRIVER, "run", "--source", cluster.connection_string,
         "--target", str(target), "--staging-dir", str(staging), "--memory-budget-mb", "8",
         "--until-caught-up", "--progress", "off"],
        env=clean_env(), capture_output=True, text=True, timeout=300, cwd=REPO, check=False,
    )

    assert completed.returncode == EXIT_USAGE, completed.stderr
    assert_one_line_error(completed.stderr, "the disk is full", "MiB free", str(staging),
                          "memory_budget_mb")
    assert PASSWORD not in completed.stdout + completed.stderr
    assert completed.stdout == ""
    # The mirror was created, but no partial snapshot reached it, and no spill file is left.
    assert (target / "_delta_log").is_dir()
    assert committed_files(target) == []
    assert [p for p in staging.rglob("*") if p.is_file()] == []
