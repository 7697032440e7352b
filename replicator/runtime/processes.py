"""Ending a child process and its process group, and reading the end of its log for an error.

Shared by the local services this project starts as children (the Spark standalone cluster, the
private RabbitMQ broker): each runs in a process group of its own (`start_new_session=True`), so
that a stop also reaches what it forked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path


def end_process_group(
    process: subprocess.Popen[bytes],
    grace_s: float,
    *,
    first: signal.Signals | None = signal.SIGTERM,
    whole_group: bool = True,
) -> None:
    """Send `first` (if any, and if the process still runs) to the process's group, or with
    `whole_group` false to the process alone; wait up to `grace_s`; then SIGKILL the group and
    wait again. Its stdin, if a pipe, is closed last."""
    if process.poll() is None and first is not None:
        with contextlib.suppress(ProcessLookupError):
            if whole_group:
                os.killpg(process.pid, first)
            else:
                process.send_signal(first)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(grace_s)
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()


def log_tail(path: Path, lines: int = 8, *, limit: int = 1500) -> str:
    """The last `lines` lines of a log on one line (see `one_line`); "" when it cannot be read
    or holds nothing."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return one_line("\n".join(text[-lines:]), limit)


def one_line(text: str, limit: int = 1500) -> str:
    """`text`'s non-blank lines, stripped, joined by " / "; only its last `limit` characters
    (after "...") when longer, since the end of a log says why something stopped."""
    text = " / ".join(line.strip() for line in text.splitlines() if line.strip())
    return text if len(text) <= limit else "..." + text[-limit:]
