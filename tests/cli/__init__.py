"""Tests of the operator commands, run as an operator would: in subprocesses, against the
embedded producer on 127.0.0.1, the password only in the environment.

Shared by this package's modules: how to run the command and what a user error must look like.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from replicator.soak.process import JvmTuning, replicator_command, replicator_environment

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "Tr1cky-Pa55-7741"
"""The simulated cluster's password: no output may ever contain it."""

FAST_START = JvmTuning(driver_memory="2g")
"""JIT, GC and query-planning settings for the short-lived Spark drivers tests start, as the crash
loop's runs use (no class archive): a cold `replicator run` costs about 21 CPU seconds instead of
48, and behaves the same. Operators' runs keep the JVM's and Spark's defaults; the spark-submit
tests (local and standalone) keep Spark's query planning defaults, so that path is tested too."""
FAST_START_JAVA_OPTIONS = FAST_START.java_options()
"""For spark-submit's --driver-java-options and spark.*.extraJavaOptions (JVM flags only)."""
FAST_START_SUBMIT_ARGS = FAST_START.submit_args()
"""PYSPARK_SUBMIT_ARGS for a Python process that starts its own Spark driver."""


def clean_env(password: str | None = PASSWORD, **extra: str) -> dict[str, str]:
    """This environment without REPLICATOR_* settings, plus the password, FAST_START's settings
    for a `replicator` child's Spark driver, and `extra`."""
    return replicator_environment(
        password, **{"PYSPARK_SUBMIT_ARGS": FAST_START_SUBMIT_ARGS, **extra}
    )


@dataclass(frozen=True)
class CliRun:
    """A finished command: exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120.0
) -> CliRun:
    """Run `replicator ARGS` to completion."""
    completed = subprocess.run(
        [*replicator_command(), *args],
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )
    return CliRun(completed.returncode, completed.stdout, completed.stderr)


def run_and_signal(
    args: Sequence[str],
    *,
    until: Callable[[], bool],
    what: str,
    timeout: float,
    logs: Path,
    cwd: Path,
    env: dict[str, str],
    signals: Sequence[signal.Signals] = (signal.SIGTERM,),
    to_group: bool = False,
    before_signals: Callable[[int], None] | None = None,
) -> CliRun:
    """Start `replicator ARGS` in a session of its own and, once `until()` holds (it must still
    be running then), deliver `signals` to the driver or to its whole process group, each after
    the run logged receiving the one before. `before_signals` gets the driver's pid first.
    Returns how it ended; its output goes to `logs`.out / .err. The group is killed if the run
    outlives the wait or the stop."""
    stdout_path, stderr_path = logs.with_suffix(".out"), logs.with_suffix(".err")
    with stdout_path.open("w") as stdout, stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [*replicator_command(), *args], stdout=stdout, stderr=stderr, env=env, cwd=cwd,
            start_new_session=True,
        )  # fmt: skip
        try:
            wait_until(lambda: process.poll() is not None or until(), timeout, what)
            assert process.poll() is None, stderr_path.read_text()
            if before_signals is not None:
                before_signals(process.pid)
            for count, sig in enumerate(signals, start=1):
                if process.poll() is not None:
                    break  # it stopped before this signal: the caller's assertions say so
                if to_group:
                    os.killpg(process.pid, sig)
                else:
                    process.send_signal(sig)
                wait_until(
                    lambda n=count: process.poll() is not None
                    or stderr_path.read_text().count("received SIG") >= n,
                    timeout, f"the run to take signal {count} ({sig.name})",
                )  # fmt: skip
            returncode = process.wait(timeout)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)
    return CliRun(returncode, stdout_path.read_text(), stderr_path.read_text())


def assert_one_line_error(stderr: str, *fragments: str) -> str:
    """The command failed with exactly one `replicator: ...` line, its last, and no traceback.

    Returns that line; it must contain every fragment.
    """
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("replicator:")]
    assert len(errors) == 1, stderr
    assert stderr.strip().splitlines()[-1] == errors[0], stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Return once `condition()` holds; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)
