"""One `replicator run` subprocess that can be killed outright, JVM included.

The run starts in a session of its own, so the JVM PySpark launches shares its process group
and one SIGKILL to the group ends both. What a restart costs is mostly the JVM's: class loading
and JIT compilation of Spark and Delta, and the code Spark generates for each query. `JvmTuning`
trims that for short runs: the C1 compiler only, the serial collector, a class-data-sharing
archive of the classes a run loads (written once by a run that exits cleanly and reused by every
later run), and query plans without generated code or adaptive re-planning.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from replicator.runtime.spark import SMALL_DATA_CONF

FAST_START_FLAGS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
"""Cheaper JIT and GC for runs that live seconds to minutes; they change no behaviour."""


def default_class_archive() -> Path:
    """Where the class archive of this interpreter's PySpark lives (one per installation)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    installation = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    return base / "replicator" / "cds" / f"spark-{installation}.jsa"


@dataclass(frozen=True, slots=True)
class JvmTuning:
    """How the replicator's JVM is started; `class_archive` None turns class sharing off."""

    class_archive: Path | None = None
    driver_memory: str = "1g"

    @property
    def archive_ready(self) -> bool:
        return self.class_archive is not None and self.class_archive.is_file()

    def java_options(self, *, write_archive_to: Path | None = None) -> str:
        """The JVM flags (for --driver-java-options or spark.*.extraJavaOptions).

        `write_archive_to` makes the JVM dump its loaded classes there when it exits cleanly.
        """
        flags = list(FAST_START_FLAGS)
        if write_archive_to is not None:
            flags.append(f"-XX:ArchiveClassesAtExit={write_archive_to}")
        elif self.archive_ready:
            flags.append(f"-XX:SharedArchiveFile={self.class_archive}")
        return " ".join(flags)

    def submit_args(self, *, write_archive_to: Path | None = None) -> str:
        """PYSPARK_SUBMIT_ARGS for a run (replicator.runtime.spark keeps a value set in the
        environment)."""
        options = shlex.quote(self.java_options(write_archive_to=write_archive_to))
        conf = " ".join(f"--conf {key}={value}" for key, value in SMALL_DATA_CONF.items())
        return (
            f"--driver-memory {self.driver_memory} --driver-java-options {options} {conf} "
            "pyspark-shell"
        )


KEPT_SETTINGS = ("REPLICATOR_JAR_CACHE", "REPLICATOR_DELTA_JARS")
"""REPLICATOR_* settings of the machine itself (where the jars are) that a child still needs."""


def replicator_environment(password: str | None, **extra: str) -> dict[str, str]:
    """This process's environment for a `replicator` child: no REPLICATOR_* setting of ours
    leaks into it (but KEPT_SETTINGS), the password is set (unless None), then `extra`."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("REPLICATOR_") or name in KEPT_SETTINGS
    }
    if password is not None:
        env["REPLICATOR_PASSWORD"] = password
    env.update(extra)
    return env


def replicator_command() -> list[str]:
    """The `replicator` script beside this interpreter, else `python -m replicator.cli`."""
    script = Path(sys.executable).parent / "replicator"
    return [str(script)] if script.exists() else [sys.executable, "-m", "replicator.cli"]


class ReplicatorProcess:
    """A started `replicator ARGS` whose output goes to `log_path`."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self.started_at = time.monotonic()
        self._log: IO[str] = log_path.open("w", encoding="utf-8")
        self._process = subprocess.Popen(
            [*replicator_command(), *args],
            env=dict(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """The exit code once the process ended (negative: killed by that signal)."""
        return self._process.poll()

    def wait(self, timeout: float) -> int | None:
        """Wait up to `timeout` seconds for the process to end; its exit code or None."""
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self, timeout: float = 30.0) -> float:
        """SIGKILL the whole process group and wait until none of it runs any more.

        Returns the CPU seconds the group had used (a load-independent cost of the run).
        """
        cpu_seconds = group_cpu_seconds(self.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self._process.wait(timeout)
        if not self._group_ended_within(timeout, resend=signal.SIGKILL):
            raise RuntimeError(f"process group {self.pid} survived SIGKILL for {timeout}s")
        self._log.close()
        return cpu_seconds

    def stop(self, timeout: float) -> int:
        """SIGTERM the replicator (it finishes its commit and exits); its exit code, once its
        JVM (same process group), which may still be writing a class archive, ended too."""
        self._process.send_signal(signal.SIGTERM)
        code = self.wait(timeout)
        if code is not None and not self._group_ended_within(timeout):
            code = None
        if code is None:
            self.kill()
            raise RuntimeError(f"replicator {self.pid} did not stop within {timeout}s of SIGTERM")
        self._log.close()
        return code

    def _group_ended_within(self, timeout: float, resend: signal.Signals | None = None) -> bool:
        """Wait until no process of the group runs (its JVM may outlive the Python process),
        sending `resend` to the group again on each look; False if it still runs at `timeout`."""
        deadline = time.monotonic() + timeout
        while _group_alive(self.pid):
            if time.monotonic() > deadline:
                return False
            if resend is not None:
                try:
                    os.killpg(self.pid, resend)
                except ProcessLookupError:
                    return True
            time.sleep(0.05)  # nothing to wait on but /proc
        return True

    def output(self) -> str:
        """What the process has printed so far (all of it, once the process was stopped)."""
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def _group_stats(group: int) -> list[list[str]]:
    """The /proc/PID/stat fields (after the command name) of every process of `group`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:
            members.append(fields)
    return members


def group_cpu_seconds(group: int) -> float:
    """User + system CPU seconds of the live processes of `group` (0.0 without /proc)."""
    if not Path("/proc").is_dir():
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(f[11]) + int(f[12]) for f in _group_stats(group)) / ticks


def _group_alive(group: int) -> bool:
    """True while a process of `group` runs (zombies, waiting to be reaped, do not count)."""
    if not Path("/proc").is_dir():
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        return True
    return any(fields[0] != "Z" for fields in _group_stats(group))
