"""The producer in its own process: `python -m replicator.sim`, as an operator would run it.

The benchmark never shares a process (or a GIL) with the producer it measures against: the
simulator's first stdout line is its connection string, its log goes to a file.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from replicator.errors import ReplicatorError
from replicator.sim.cli import PASSWORD_ENV
from replicator.sim.cluster import DEFAULT_PASSWORD, DEFAULT_USERNAME

SIM_USERNAME = DEFAULT_USERNAME
SIM_PASSWORD = DEFAULT_PASSWORD
"""The simulator's dev-cluster credentials (only ever on 127.0.0.1)."""


class SimulatorStartError(ReplicatorError):
    """The simulator process exited or stayed silent instead of printing where to connect."""


class SimulatorProcess:
    """A running `python -m replicator.sim` with `docs` documents loaded, optionally writing
    `rate` changes a second; use as a context manager, which stops it on exit.

    >>> with SimulatorProcess("bench", docs=1000, doc_size=256, vbuckets=8,
    ...                       log_path="/tmp/sim.log") as sim:  # doctest: +SKIP
    ...     sim.connection_string
    'couchbase://127.0.0.1:40123/bench'
    """

    def __init__(
        self,
        bucket: str,
        *,
        docs: int,
        doc_size: int,
        vbuckets: int,
        log_path: str | os.PathLike[str],
        rate: float = 0.0,
        seed: int = 0,
        start_timeout_s: float = 900.0,
        superseded_window: int | None = None,
    ) -> None:
        self.bucket = bucket
        self._command = [
            sys.executable, "-m", "replicator.sim",
            "--port", "0",
            "--bucket", bucket,
            "--docs", str(docs),
            "--doc-size", str(doc_size),
            "--vbuckets", str(vbuckets),
            "--rate", str(rate),
            "--seed", str(seed),
        ]  # fmt: skip
        if superseded_window is not None:
            self._command += ["--superseded-window", str(superseded_window)]
        self._log_path = Path(log_path)
        self._start_timeout = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self.connection_string = ""

    @property
    def pid(self) -> int:
        """The simulator's process id (raises before start)."""
        if self._process is None:
            raise RuntimeError("the simulator is not started")
        return self._process.pid

    def start(self) -> SimulatorProcess:
        """Launch the process and wait (up to the start timeout) for its connection string."""
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, PASSWORD_ENV: SIM_PASSWORD}
        with open(self._log_path, "ab") as log_file:
            self._process = subprocess.Popen(
                self._command, stdout=subprocess.PIPE, stderr=log_file, env=env
            )
        try:
            self.connection_string = self._read_first_line()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit within 30 s. Idempotent."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> SimulatorProcess:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _read_first_line(self) -> str:
        process = self._process
        assert process is not None and process.stdout is not None
        deadline = time.monotonic() + self._start_timeout
        received = b""
        fd = process.stdout.fileno()
        while b"\n" not in received:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SimulatorStartError(
                    f"the simulator printed no connection string within {self._start_timeout:.0f}"
                    f" s (log: {self._log_path})"
                )
            readable, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if not readable:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                raise SimulatorStartError(
                    f"the simulator exited with code {process.wait()} before printing its "
                    f"connection string (log: {self._log_path})"
                )
            received += chunk
        line = received.split(b"\n", 1)[0].decode().strip()
        if not line.startswith("couchbase://"):
            raise SimulatorStartError(f"the simulator printed {line!r}, not a connection string")
        return line
