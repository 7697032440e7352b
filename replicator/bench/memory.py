"""Measurement 6: peak memory while mirroring a vbucket whose first snapshot dwarfs the budget.

One vbucket holds `factor` x the memory budget of documents, so its first (disk) snapshot
must be staged mostly in spill files. The replication runs in a process of its own
(`replicator.bench.memory_probe`) against a producer in another, so the peaks (VmHWM) of its
Python driver and of its JVM are this run's alone.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass

from replicator.bench.simulator import SIM_PASSWORD, SimulatorProcess
from replicator.errors import ReplicatorError

MIB = 1024 * 1024


class MemoryProbeError(ReplicatorError):
    """The memory probe process failed or printed no result."""


@dataclass(frozen=True, slots=True)
class MemoryResult:
    """Peak resident memory of the driver (Python) and of its JVM, in MiB.

    `peak_staged_mib` is the most the stager held in memory (Arrow bytes, bounded by the
    budget; the rest of the snapshot went to spill files).
    """

    memory_budget_mb: int
    snapshot_docs: int
    snapshot_megabytes: float
    rows: int
    complete: bool
    seconds: float
    python_peak_rss_mib: float
    jvm_peak_rss_mib: float
    peak_staged_mib: float


def measure_memory(
    *,
    memory_budget_mb: int,
    docs: int,
    doc_size: int,
    work_dir: str,
    jvm_options: str = "",
    timeout_s: float = 1800.0,
) -> MemoryResult:
    """Mirror one vbucket of `docs` documents with `memory_budget_mb` in a probe process.

    `jvm_options` are extra driver JVM options of the probe's Spark (default: none).
    """
    with SimulatorProcess(
        "memory", docs=docs, doc_size=doc_size, vbuckets=1, log_path=f"{work_dir}/sim-memory.log"
    ) as simulator:
        command = [
            sys.executable, "-m", "replicator.bench.memory_probe",
            "--source", simulator.connection_string,
            "--target", f"{work_dir}/memory-mirror",
            "--staging-dir", f"{work_dir}/staging-memory",
            "--memory-budget-mb", str(memory_budget_mb),
        ]  # fmt: skip
        env = {**os.environ, "REPLICATOR_PASSWORD": SIM_PASSWORD}
        env.pop("PYSPARK_SUBMIT_ARGS", None)  # the probe's JVM is launched as a fresh driver's
        if jvm_options:
            env["PYSPARK_SUBMIT_ARGS"] = (
                f"--driver-memory 2g --driver-java-options {shlex.quote(jvm_options)} "
                "pyspark-shell"
            )
        with open(f"{work_dir}/memory-probe.log", "wb") as log_file:
            finished = subprocess.run(
                command, stdout=subprocess.PIPE, stderr=log_file, env=env, timeout=timeout_s,
                check=False,
            )
    lines = finished.stdout.decode().strip().splitlines()
    if finished.returncode != 0 or not lines:
        raise MemoryProbeError(
            f"the memory probe exited with code {finished.returncode} "
            f"(log: {work_dir}/memory-probe.log)"
        )
    outcome = json.loads(lines[-1])
    return MemoryResult(
        memory_budget_mb=memory_budget_mb,
        snapshot_docs=docs,
        snapshot_megabytes=docs * doc_size / MIB,
        rows=int(outcome["rows"]),
        complete=bool(outcome["caught_up"]) and int(outcome["rows"]) == docs,
        seconds=float(outcome["seconds"]),
        python_peak_rss_mib=outcome["python_peak_rss_bytes"] / MIB,
        jvm_peak_rss_mib=outcome["jvm_peak_rss_bytes"] / MIB,
        peak_staged_mib=outcome["peak_staged_bytes"] / MIB,
    )
