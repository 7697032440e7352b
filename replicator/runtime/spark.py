"""The one place every SparkSession is built: jobs, tests, notebooks and the demo all come here.

Delta's extension and catalog are set explicitly, the jars come from `replicator.runtime.jars`, and
local runs get defaults sized for a small machine (few shuffle partitions, no UI).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from replicator.errors import DeltaJarsMissing
from replicator.runtime.jars import DELTA_ARTIFACTS, OVERRIDE_ENV, locate_delta_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

SESSION_DEFAULTS = {
    # Timestamps (expiry, commit times) are written and compared as UTC on every master.
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}
"""Applied on any master, unless spark-submit already set the key."""

LOCAL_DEFAULTS = {
    **SESSION_DEFAULTS,
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    # Delta rebuilds table state with 50 partitions by default: pure overhead on two cores.
    "spark.databricks.delta.snapshotPartitions": "2",
    # VACUUM and file listing fan out to 10000 tasks by default.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
}

WAREHOUSE_CONF = "spark.sql.warehouse.dir"
"""Where Spark keeps catalog tables. The replicator names every table by path and never uses
it, but Spark creates it when a session starts, by default as `spark-warehouse/` in the current
directory; local sessions put it under the temporary directory instead (`local_scratch_dir`)."""

QUIET_LOGGERS = {
    # Delta's MERGE materializes its source as a locally checkpointed RDD, so that both of its
    # passes read the same rows, and unpersists that RDD once the MERGE is done. Spark warns
    # at every such unpersist ("RDD N was locally checkpointed, its lineage has been truncated
    # and cannot be recomputed after unpersisting"): nothing recomputes the source after its
    # MERGE, so the warning is harmless, and it came with every data commit. RDD.unpersist
    # logs as the RDD's class, MapPartitionsRDD here: other RDD classes, and errors, still log.
    "org.apache.spark.rdd.MapPartitionsRDD": "ERROR",
}
"""Loggers of the driver's JVM held above WARN: each entry says why its warnings are harmless."""


SMALL_DATA_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.adaptive.enabled": "false",
}
"""For drivers that only ever see a few thousand rows (the tests' and the crash loop's): compiling
each query's generated code and re-planning it cost more than they save there. A restart
committing one change took 21.7 CPU s instead of 25.7 (mean of 4). Results are the same; nothing
applies these by default."""


QUIET_LOG4J = Path(__file__).with_name("log4j2-quiet.properties")
"""The log4j 2 configuration of driver JVMs this package starts: errors only."""

JVM_NOISE = (b"WARNING: Using incubator modules",)
"""Lines the JVM prints at start whatever log4j says; dropped from a quiet driver's stderr."""

LOG4J_ENV = "LOG4J_CONFIGURATION_FILE"


def _is_local(master: str) -> bool:
    return master.startswith("local")


def local_scratch_dir() -> Path:
    """This user's directory for what a local Spark driver writes outside any table.

    One stable path, not a fresh one per session: a killed driver leaves nothing new behind,
    and every session of a process asks for the same static settings.
    """
    return Path(tempfile.gettempdir()) / f"replicator-{os.getuid()}"


def build_session(
    app_name: str = "replicator",
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    driver_memory: str = "2g",
    provide_jars: bool | None = None,
    quiet: bool | None = None,
) -> SparkSession:
    """Return the SparkSession with Delta Lake enabled, creating it if needed.

    `master` defaults to `local[2]` unless spark-submit already set one. Local masters get
    defaults sized for a small machine; any other master (`spark://...`) keeps what
    spark-submit set and only gains SESSION_DEFAULTS it did not set. `provide_jars` decides
    whether the Delta jars from the cache (or `REPLICATOR_DELTA_JARS`) are added; by default they
    are, unless the launching spark-submit already brings Delta with `--packages` or `--jars`.
    `quiet` (by default: unless the `replicator` logger is at DEBUG, as `-v` sets it) starts a
    driver JVM that prints only errors (QUIET_LOG4J) and none of the JVM's start-up lines;
    under spark-submit the operator's logging configuration is left alone.

    >>> spark = build_session("example")  # doctest: +SKIP
    >>> spark.range(3).write.format("delta").save("/tmp/example")  # doctest: +SKIP
    """
    from pyspark.sql import SparkSession

    submitted = _submit_conf()
    settings: dict[str, str] = {}
    if master is not None:
        settings["spark.master"] = master
    elif "spark.master" not in submitted:
        settings["spark.master"] = "local[2]"
    effective_master = settings.get("spark.master") or submitted.get("spark.master", "")
    if _is_local(effective_master):
        settings.update(LOCAL_DEFAULTS)
        if WAREHOUSE_CONF not in submitted:
            settings[WAREHOUSE_CONF] = str(local_scratch_dir() / "spark-warehouse")
    else:
        # A cluster (spark://, yarn, k8s): the operator's spark-submit settings win; nothing
        # here may assume the driver's host or disk.
        settings.update({k: v for k, v in SESSION_DEFAULTS.items() if k not in submitted})
    settings.update(DELTA_CONF)

    if provide_jars is None:
        provide_jars = not _brings_delta(submitted)
    if provide_jars:
        location = locate_delta_jars()
        settings["spark.jars"] = ",".join(str(p) for p in location.paths)
    settings.update(conf or {})

    if _is_local(effective_master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if _is_local(effective_master) and "PYSPARK_SUBMIT_ARGS" not in os.environ:
        # Driver memory must be known when the JVM starts; a builder setting comes too late.
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--driver-memory {driver_memory} pyspark-shell"

    if quiet is None:
        quiet = not logging.getLogger("replicator").isEnabledFor(logging.DEBUG)
    quiet = quiet and "PYSPARK_GATEWAY_PORT" not in os.environ

    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    _launch_jvm_in_its_own_session(settings, quiet=quiet)
    sigint_handler = signal.getsignal(signal.SIGINT)
    spark = builder.getOrCreate()
    _keep_sigint_handler(sigint_handler)
    spark.sparkContext.setLogLevel("ERROR" if quiet else "WARN")
    _quiet_loggers(spark)
    ensure_delta_loaded(spark)
    return spark


def _launch_jvm_in_its_own_session(settings: Mapping[str, str], *, quiet: bool) -> None:
    """Start the driver JVM in a session (process group) of its own, if this process starts it.

    Ctrl-C in a terminal, `timeout`, systemd and Kubernetes signal a whole process group: the
    JVM must not die under a run that is finishing its commit. It still ends with the driver,
    however the driver ends: PySpark's JVM exits when its stdin pipe from the driver closes.
    Under spark-submit the JVM started first and is the driver's parent; nothing to do.
    A `quiet` JVM's stderr passes through a filter that drops JVM_NOISE.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if "PYSPARK_GATEWAY_PORT" in os.environ or SparkContext._gateway is not None:
        return
    conf = SparkConf(loadDefaults=False).setAll(list(settings.items()))
    popen_kwargs: dict[str, object] = {"start_new_session": True}
    if quiet:
        popen_kwargs["stderr"] = subprocess.PIPE
    with _quiet_log4j_environment(quiet):
        gateway = launch_gateway(conf, popen_kwargs=popen_kwargs)  # type: ignore[no-untyped-call]
    if quiet:
        process = gateway.proc
        threading.Thread(
            target=_forward_stderr, args=(process.stderr,), name="jvm-stderr", daemon=True
        ).start()
    SparkContext._ensure_initialized(gateway=gateway)


@contextlib.contextmanager
def _quiet_log4j_environment(quiet: bool) -> Iterator[None]:
    """While the JVM is launched, point log4j at QUIET_LOG4J through its environment variable.

    Not a -D option: `--driver-java-options` in PYSPARK_SUBMIT_ARGS would replace it. A
    `-Dlog4j2.configurationFile` the operator passes there still wins (system properties come
    before the environment in log4j's lookup), and so does a LOG4J_CONFIGURATION_FILE already set.
    """
    if not quiet or LOG4J_ENV in os.environ:
        yield
        return
    os.environ[LOG4J_ENV] = QUIET_LOG4J.as_uri()
    try:
        yield
    finally:
        os.environ.pop(LOG4J_ENV, None)


def _forward_stderr(stream: object) -> None:
    """Copy the JVM's stderr to ours, line by line, without the JVM's start-up noise.

    To file descriptor 2 itself: whatever replaced sys.stderr since (a test's capture), this
    thread must keep draining the pipe, or the JVM would block on its next write.
    """
    for line in iter(stream.readline, b""):  # type: ignore[attr-defined]
        if not line.startswith(JVM_NOISE):
            with contextlib.suppress(OSError):
                os.write(2, line)


def _keep_sigint_handler(handler: object) -> None:
    """Put back a SIGINT handler the caller installed before the SparkContext replaced it.

    PySpark's own handler cancels every job and raises KeyboardInterrupt wherever the driver
    is, often inside a py4j call; a run that stops itself on SIGINT (`replicator run`) must
    keep its handler. The default handler is left to PySpark (notebooks and the shell).
    """
    if (
        callable(handler)
        and handler is not signal.default_int_handler
        and threading.current_thread() is threading.main_thread()
    ):
        signal.signal(signal.SIGINT, handler)


def _quiet_loggers(spark: SparkSession) -> None:
    """Raise QUIET_LOGGERS' levels in the driver JVM's log4j configuration.

    Set on the running JVM rather than through a log4j2.properties file: a file must be named
    before the JVM starts (which spark-submit does before any Python runs) and would replace
    the operator's own configuration.
    """
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    log4j = jvm.org.apache.logging.log4j
    for name, level in QUIET_LOGGERS.items():
        log4j.core.config.Configurator.setLevel(name, log4j.Level.toLevel(level))


def ensure_delta_loaded(spark: SparkSession) -> None:
    """Raise DeltaJarsMissing when the running JVM cannot load Delta's classes."""
    from py4j.java_gateway import JavaClass

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    # py4j resolves through Spark's classloader (which holds spark.jars); a name it cannot
    # load comes back as a JavaPackage instead of a JavaClass.
    if not isinstance(jvm.io.delta.tables.DeltaTable, JavaClass):
        raise DeltaJarsMissing(
            "the Spark JVM cannot load Delta Lake (io.delta.tables.DeltaTable): the jars "
            + ", ".join(DELTA_ARTIFACTS)
            + f" are not on its classpath. Run `make jars`, set {OVERRIDE_ENV}, or pass them to "
            "spark-submit with --jars."
        )


def _submit_conf() -> dict[str, str]:
    """Settings spark-submit passed to this Python driver, if it launched us.

    spark-submit starts the JVM first and hands its gateway port down; its settings live in
    that JVM's system properties, which a SparkConf only sees once the gateway is connected
    (an unconnected SparkConf is empty, and the session would silently run on local[2]).
    """
    from pyspark import SparkConf, SparkContext

    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return {}
    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


def _brings_delta(submitted: Mapping[str, str]) -> bool:
    """Whether spark-submit's `--jars`/`--packages` already put Delta on the classpath."""
    return any("delta" in submitted.get(key, "") for key in ("spark.jars", "spark.jars.packages"))


__all__ = [
    "DELTA_CONF", "JVM_NOISE", "LOCAL_DEFAULTS", "QUIET_LOG4J", "QUIET_LOGGERS", "SESSION_DEFAULTS",
    "WAREHOUSE_CONF",
    "build_session", "ensure_delta_loaded", "local_scratch_dir",
]
