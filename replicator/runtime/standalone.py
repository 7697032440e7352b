"""A Spark standalone cluster (one master, N workers) on one host, and spark-submit against it.

For tests and benchmarks that must show the replicator works unchanged on a real cluster: the
MERGEs run in executor JVMs started by a worker, not in the driver. The launcher comes with
pyspark (`pyspark/bin/spark-class`); every process gets its own process group so `stop()` also
ends the executors a worker forked.

>>> with StandaloneCluster(Path("/tmp/sa"), worker_cores=2) as cluster:  # doctest: +SKIP
...     result = cluster.submit(Path("jobs/replicate.py"), ["--source", "...", "--target", "..."])
...     executor_task_counts(result.event_log_dir)
{'0': 57}
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from replicator.errors import ReplicatorError
from replicator.runtime.processes import end_process_group, log_tail

DAEMON_MEMORY = "256m"
"""Heap of the master and worker daemons themselves (Spark's default 1g is wasted here)."""

_STOP_GRACE_S = 10.0
"""How long a daemon may take to end after SIGTERM before its process group is killed."""


class StandaloneClusterError(ReplicatorError):
    """The master or a worker did not start, or died; the message names which and its log."""


def spark_home() -> Path:
    """The Spark distribution pyspark ships (holds bin/spark-class and bin/spark-submit)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True, slots=True)
class WorkerState:
    """A worker as the master reports it."""

    worker_id: str
    host: str
    cores: int
    memory_mb: int
    state: str


@dataclass(frozen=True, slots=True)
class ApplicationState:
    """An application (one spark-submit) as the master reports it."""

    app_id: str
    name: str
    state: str
    duration_ms: int


@dataclass(frozen=True, slots=True)
class MasterState:
    """The master's view: its workers, running and finished applications."""

    workers: tuple[WorkerState, ...]
    active_apps: tuple[ApplicationState, ...]
    completed_apps: tuple[ApplicationState, ...]

    @property
    def alive_workers(self) -> tuple[WorkerState, ...]:
        return tuple(w for w in self.workers if w.state == "ALIVE")

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> MasterState:
        """Parse the master's `/json/` answer."""
        workers = tuple(
            WorkerState(
                str(w["id"]), str(w["host"]), int(w["cores"]), int(w["memory"]), str(w["state"])
            )
            for w in document.get("workers", [])
        )

        def apps(key: str) -> tuple[ApplicationState, ...]:
            return tuple(
                ApplicationState(
                    str(a["id"]), str(a["name"]), str(a["state"]), int(a.get("duration", 0))
                )
                for a in document.get(key, [])
            )

        return cls(workers, apps("activeapps"), apps("completedapps"))


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """A finished spark-submit: exit code, output, and where its event log went."""

    returncode: int
    stdout: str
    stderr: str
    event_log_dir: Path
    seconds: float


class StandaloneCluster:
    """A master and `workers` workers on `host`, on free ports, with logs under `work_dir`.

    Each submitted application may take every core (`spark.cores.max`); applications meant
    to run side by side pass a smaller `spark.cores.max` in `conf`, or they queue.

    Application UIs are off (spark-submit gets spark.ui.enabled=false); the master's web port
    stays open because its `/json/` page is how `start()` knows the workers registered.
    """

    def __init__(
        self,
        work_dir: Path,
        *,
        workers: int = 1,
        worker_cores: int = 2,
        worker_memory: str = "1g",
        executor_memory: str | None = None,
        host: str = "127.0.0.1",
        start_timeout_s: float = 120.0,
    ) -> None:
        if workers < 1:
            raise ValueError(f"a cluster needs at least one worker, got {workers}")
        if worker_cores < 1:
            raise ValueError(f"worker_cores must be at least 1, got {worker_cores}")
        self.work_dir = Path(work_dir)
        self.host = host
        self.workers = workers
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        self.executor_memory = executor_memory or worker_memory
        """Per application: a worker fits worker_memory / executor_memory applications."""
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.web_port = 0
        self._processes: list[tuple[str, subprocess.Popen[bytes], Path]] = []

    @property
    def master_url(self) -> str:
        """`spark://host:port`, what spark-submit's --master takes."""
        return f"spark://{self.host}:{self.port}"

    @property
    def web_url(self) -> str:
        return f"http://{self.host}:{self.web_port}"

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> StandaloneCluster:
        """Start the master and the workers; return once every worker is ALIVE."""
        if self._processes:
            return self
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port, self.web_port = free_port(self.host), free_port(self.host)
        try:
            self._launch(
                "master",
                ["org.apache.spark.deploy.master.Master", "--host", self.host,
                 "--port", str(self.port), "--webui-port", str(self.web_port)],
            )
            self._wait_for(lambda: self._try_state() is not None, "the master's web page")
            for index in range(self.workers):
                worker_dir = self.work_dir / f"worker-{index}"
                worker_dir.mkdir(exist_ok=True)
                self._launch(
                    f"worker-{index}",
                    ["org.apache.spark.deploy.worker.Worker", self.master_url,
                     "--host", self.host, "--cores", str(self.worker_cores),
                     "--memory", self.worker_memory, "--work-dir", str(worker_dir),
                     "--webui-port", str(free_port(self.host))],
                )
            self._wait_for(
                lambda: len(self.state().alive_workers) >= self.workers,
                f"{self.workers} worker(s) to register with the master",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """End every process this cluster started (and their children), workers first."""
        for _name, process, _log in reversed(self._processes):
            end_process_group(process, _STOP_GRACE_S)
        self._processes.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- what the master says ---------------------------------------------------------------

    def state(self) -> MasterState:
        """The master's current view; StandaloneClusterError if it does not answer."""
        state = self._try_state()
        if state is None:
            raise StandaloneClusterError(
                f"the Spark master at {self.web_url} does not answer; see "
                f"{self.work_dir / 'master.log'}"
            )
        return state

    def _try_state(self) -> MasterState | None:
        try:
            with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as response:
                return MasterState.from_json(json.load(response))
        except (OSError, ValueError):  # URLError is an OSError
            return None

    # -- submitting ---------------------------------------------------------------------------

    def submit_command(
        self,
        script: Path,
        args: Sequence[str],
        *,
        jars: Sequence[Path] = (),
        conf: Mapping[str, str] | None = None,
        event_log_dir: Path | None = None,
    ) -> list[str]:
        """The spark-submit command line running `script` on this cluster (client mode)."""
        cores = self.worker_cores * self.workers
        settings = {
            # Sized for this small cluster: Delta's defaults (50 snapshot partitions, 200
            # shuffle partitions) mean hundreds of tiny tasks per commit on a few cores.
            "spark.sql.shuffle.partitions": str(2 * cores),
            "spark.default.parallelism": str(cores),
            "spark.databricks.delta.snapshotPartitions": str(cores),
            "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(cores),
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.host": self.host,
            "spark.driver.bindAddress": self.host,
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.executor.memory": self.executor_memory,
            "spark.cores.max": str(cores),
        }
        if event_log_dir is not None:
            settings["spark.eventLog.enabled"] = "true"
            settings["spark.eventLog.dir"] = event_log_dir.resolve().as_uri()
            # One plain JSON-lines file per application, readable without a codec.
            settings["spark.eventLog.compress"] = "false"
            settings["spark.eventLog.rolling.enabled"] = "false"
        settings.update(conf or {})
        command = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master_url]
        if jars:
            command += ["--jars", ",".join(str(path) for path in jars)]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        return [*command, str(script), *args]

    def submit(
        self,
        script: Path,
        args: Sequence[str],
        *,
        jars: Sequence[Path] = (),
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 600.0,
        name: str = "app",
    ) -> SubmitResult:
        """Run `script` with spark-submit on this cluster to completion, with an event log."""
        event_log_dir = self.work_dir / f"events-{name}"
        event_log_dir.mkdir(parents=True, exist_ok=True)
        command = self.submit_command(
            script, args, jars=jars, conf=conf, event_log_dir=event_log_dir
        )
        started = time.monotonic()
        completed = subprocess.run(
            command,
            env=self._environment(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        return SubmitResult(
            completed.returncode, completed.stdout, completed.stderr, event_log_dir,
            time.monotonic() - started,
        )

    # -- internals ------------------------------------------------------------------------

    def _environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if extra is None else extra)
        env.setdefault("SPARK_LOCAL_IP", self.host)
        env["SPARK_HOME"] = str(spark_home())
        env["PYSPARK_PYTHON"] = sys.executable
        env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        return env

    def _launch(self, name: str, arguments: Sequence[str]) -> None:
        log_path = self.work_dir / f"{name}.log"
        env = self._environment()
        env["SPARK_DAEMON_MEMORY"] = DAEMON_MEMORY
        env["SPARK_LOG_DIR"] = str(self.work_dir)
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *arguments],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: stop() reaches the executors
            )
        self._processes.append((name, process, log_path))

    def _wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while not condition():
            for name, process, log_path in self._processes:
                if process.poll() is not None:
                    tail = log_tail(log_path, 5) or f"(no log, or an empty one, at {log_path})"
                    raise StandaloneClusterError(
                        f"the Spark {name} exited with code {process.returncode} while waiting "
                        f"for {what}: {tail}"
                    )
            if time.monotonic() > deadline:
                raise StandaloneClusterError(
                    f"timed out after {self.start_timeout_s:.0f}s waiting for {what}; logs in "
                    f"{self.work_dir}"
                )
            time.sleep(0.25)


def executor_task_counts(event_log_dir: Path) -> dict[str, int]:
    """Finished tasks per executor id, from the Spark event logs in `event_log_dir`.

    On a standalone cluster every task runs in an executor; a driver-only run has none here.
    """
    counts: dict[str, int] = {}
    for log_file in sorted(event_log_dir.rglob("*")):
        if not log_file.is_file() or log_file.suffix in (".zstd", ".lz4", ".snappy", ".lzf"):
            continue
        with log_file.open(encoding="utf-8") as lines:
            for line in lines:
                if '"SparkListenerTaskEnd"' not in line:
                    continue
                info = json.loads(line).get("Task Info", {})
                executor = str(info.get("Executor ID", "?"))
                counts[executor] = counts.get(executor, 0) + 1
    return counts


__all__ = [
    "ApplicationState",
    "MasterState",
    "StandaloneCluster",
    "StandaloneClusterError",
    "SubmitResult",
    "WorkerState",
    "executor_task_counts",
    "free_port",
    "spark_home",
]
