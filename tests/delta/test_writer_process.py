"""The steady writer's child process: it outlives no parent, ignores the signals its parent
handles, is started again after dying between commits, and its errors reach the caller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from replicator.delta import writer_process
from replicator.delta.schema import DataLayout
from replicator.delta.writer_process import WriterProcess, WriterProcessError


def _gone(pid: int, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as stat:  # a zombie has ended too
            if stat.read().split(")")[-1].split()[0] == "Z":
                return True
        time.sleep(0.05)
    return False


def _child_pid(writer: WriterProcess) -> int:
    writer._started()
    assert writer._process is not None
    return writer._process.pid


def test_the_child_ignores_sigterm_and_sigint_its_parent_handles(tmp_path: Path) -> None:
    writer = WriterProcess(str(tmp_path), DataLayout(64))
    try:
        pid = _child_pid(writer)
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGINT)
        with pytest.raises(WriterProcessError, match="unknown request 'ping'"):
            writer._call("ping")
        assert writer.starts == 1
    finally:
        writer.close()
    assert _gone(pid)  # closing the socket ends it


def test_a_child_found_dead_between_commits_is_started_again(tmp_path: Path) -> None:
    writer = WriterProcess(str(tmp_path), DataLayout(64))
    try:
        first = _child_pid(writer)
        os.kill(first, signal.SIGKILL)
        with pytest.raises(WriterProcessError) as raised:  # however far its exit has gone
            writer._call("ping")
        assert "unknown request" in str(raised.value)
        assert writer.starts == 2 and _child_pid(writer) != first
        # The child's traceback comes with the error.
        assert any("in the steady writer's process" in note for note in raised.value.__notes__)
    finally:
        writer.close()


def test_the_child_dies_with_its_parent(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from replicator.delta.schema import DataLayout
            from replicator.delta.writer_process import WriterProcess
            writer = WriterProcess({str(tmp_path)!r}, DataLayout(64))
            writer._started()
            print(writer._process.pid, flush=True)
            time.sleep(600)
        """)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not _gone(child, timeout_s=0.5)
        parent.kill()  # no clean-up of any kind runs in the parent
        parent.wait(30)
        assert _gone(child)
    finally:
        parent.kill()
        parent.wait(30)


def test_batch_files_of_runs_that_are_gone_are_removed(tmp_path: Path) -> None:
    directory = writer_process._transfer_directory()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = Path(directory) / f"{writer_process.TRANSFER_PREFIX}{gone.stdout.strip()}-x.arrow"
    ours = Path(writer_process._transfer_path())
    stale.write_bytes(b"a batch nobody will read")
    ours.write_bytes(b"a batch of this run")
    try:
        assert writer_process.remove_stale_transfers() >= 1
        assert not stale.exists() and ours.exists()
    finally:
        stale.unlink(missing_ok=True)
        ours.unlink(missing_ok=True)
