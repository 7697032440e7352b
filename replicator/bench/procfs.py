"""What Linux's /proc says about a process's memory and about the machine's load."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PROC = Path("/proc")


def status_kib(pid: int | str, field: str) -> int:
    """A `kB` field of /proc/<pid>/status (VmHWM: peak resident set, VmRSS: current)."""
    text = (PROC / str(pid) / "status").read_text()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0])
    raise ValueError(f"/proc/{pid}/status has no field {field!r}")


def peak_rss_bytes(pid: int | str = "self") -> int:
    """The process's peak resident set size so far (VmHWM), in bytes."""
    return status_kib(pid, "VmHWM") * 1024


def spark_jvm_pid(spark: SparkSession) -> int:
    """The pid of the JVM behind a local SparkSession (the driver's py4j gateway)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return int(jvm.java.lang.ProcessHandle.current().pid())


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages."""
    return os.getloadavg()


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU time the process has used so far (all its threads), in seconds."""
    text = (PROC / str(pid) / "stat").read_text()
    # The command name (field 2) may hold spaces: the fields we want follow its ')'.
    fields = text.rsplit(")", 1)[1].split()
    user_ticks, system_ticks = int(fields[11]), int(fields[12])
    return (user_ticks + system_ticks) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds used by a set of processes between `start()` and `stop()`."""

    def __init__(self, **pids: int | str) -> None:
        self._pids = pids
        self._started: dict[str, float] = {}

    def start(self) -> CpuMeter:
        self._started = {name: cpu_seconds(pid) for name, pid in self._pids.items()}
        return self

    def stop(self) -> dict[str, float]:
        """CPU seconds per process name since `start()`."""
        return {
            name: cpu_seconds(pid) - self._started[name] for name, pid in self._pids.items()
        }
