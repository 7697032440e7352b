"""The machine a benchmark ran on: CPU, cores, memory, and the versions of the stack."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from replicator.bench.procfs import load_average

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True, slots=True)
class MachineDescription:
    """Enough to tell two benchmark runs' machines apart."""

    cpu_model: str
    cores: int
    memory_gib: float
    os: str
    python: str
    java: str
    spark: str
    delta: str
    pyarrow: str
    load_average_at_start: tuple[float, float, float]

    def one_line(self) -> str:
        """`AMD EPYC, 2 cores, 23.4 GiB; Python 3.11.9, Java 17.0.15, Spark 4.0.1, Delta 4.0.1`."""
        return (
            f"{self.cpu_model}, {self.cores} cores, {self.memory_gib:.1f} GiB RAM, {self.os}; "
            f"Python {self.python}, Java {self.java}, Spark {self.spark}, Delta {self.delta}, "
            f"pyarrow {self.pyarrow}"
        )


def cpu_model(cpuinfo: str) -> str:
    """The `model name` of the first CPU in /proc/cpuinfo text ('unknown' if absent)."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("model name", "Processor", "cpu model") and value.strip():
            return value.strip()
    return "unknown"


def memory_gib(meminfo: str) -> float:
    """MemTotal of /proc/meminfo text, in GiB (0.0 if absent)."""
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        if name == "MemTotal":
            return int(value.split()[0]) / (1024 * 1024)
    return 0.0


def describe_machine(spark: SparkSession) -> MachineDescription:
    """Describe this machine and the running Spark session's stack."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return MachineDescription(
        cpu_model=cpu_model(_read("/proc/cpuinfo")),
        cores=os.cpu_count() or 0,
        memory_gib=memory_gib(_read("/proc/meminfo")),
        os=f"{platform.system()} {platform.release()}",
        python=platform.python_version(),
        java=str(jvm.java.lang.System.getProperty("java.version")),
        spark=spark.version,
        delta=metadata.version("delta-spark"),
        pyarrow=metadata.version("pyarrow"),
        load_average_at_start=load_average(),
    )


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
