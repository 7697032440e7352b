"""The steady writer in a child process of its own, so that its Arrow work never waits for the GIL.

The commit thread shares the interpreter with the replication thread, which runs Python most of
the time at a high change rate. Each call into Arrow or the filesystem gives up the GIL, and
taking it back behind a thread that runs Python waits out that thread's switch interval (README,
"The GIL, handed over in small calls"); a steady commit makes hundreds of such calls. Measured on
the 1,000,000-document steady table, 50,000 changes a commit: 0.55 s alone, 6 to 8 s beside a
thread that runs Python (README, "The steady writer in a process of its own"). In a process of
its own the writer has an interpreter to itself.

`WriterProcess` has the `DeletionVectorMerger`'s surface (`merge`, `pack`, `conflicts`,
`last_rows`): the child holds the merger itself (its key index and row images) and compacts
too, between commits, as the commit thread asks. A batch's rows go to the child
as an Arrow IPC file that it memory-maps; what landed comes back over a socket pair. The child:
- ignores SIGINT and SIGTERM: the parent finishes the commit in flight when asked to stop, then
  closes the socket, and the child exits;
- dies with its parent (Linux's parent-death signal, and a check of its parent at start), so it
  never commits for a parent that is gone;
- is started again when it is found dead between two commits; one that dies during a commit
  fails that commit, which is then exactly as uncertain as a crash of the process would leave
  it (the log entry is published whole or not at all, and recovery reads the table).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
import uuid
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from replicator.delta.conflicts import MergeConflict

if TYPE_CHECKING:
    from collections.abc import Mapping

    from replicator.delta.arrow_append import AppendedCommit
    from replicator.delta.bin_packing import PackedFiles
    from replicator.delta.commit_metadata import CommitMetadata
    from replicator.delta.dv_merge import MergedRows
    from replicator.delta.schema import DataLayout

_log = logging.getLogger(__name__)

TRANSFER_DIRECTORY = "/dev/shm"
"""Where a batch's rows are handed to the child: memory, not disk, where there is one."""

START_TIMEOUT_S = 60.0
"""How long the child may take to import its modules and say it is ready."""


class WriterProcessError(RuntimeError):
    """The writer's child process failed a commit (its error is in the message), or died."""


class WriterProcess:
    """A `DeletionVectorMerger` for the table at `path`, run in a child process."""

    def __init__(self, path: str, layout: DataLayout, *, row_images: bool = True) -> None:
        self.path = path
        self.layout = layout
        self.row_images = row_images
        self.conflicts = 0
        """Plans made again because another writer took the version first (the child's)."""
        self.last_rows: MergedRows | None = None
        self.starts = 0
        """Children started (more than one: one died between commits)."""
        self._process: subprocess.Popen[bytes] | None = None
        self._connection: Connection | None = None
        self._lock = threading.Lock()

    def merge(self, changes: pa.Table, metadata: CommitMetadata) -> AppendedCommit | None:
        """`DeletionVectorMerger.merge` in the child."""
        transfer = _transfer_path()
        try:
            with pa.OSFile(transfer, "wb") as sink, pa.ipc.new_file(sink, changes.schema) as out:
                out.write_table(changes)
            landed, rows, conflicts = self._call("merge", transfer, metadata)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(transfer)
        self.last_rows, self.conflicts = rows, conflicts
        return landed  # type: ignore[no-any-return]

    def pack(self, packed_under: Mapping[int, int]) -> PackedFiles | None:
        """`DeletionVectorMerger.pack` in the child."""
        packed = self._call("pack", dict(packed_under))
        return packed  # type: ignore[no-any-return]

    def close(self) -> None:
        """End the child (it finishes nothing: call between commits)."""
        with self._lock:
            self._stop()

    def _call(self, *request: Any) -> Any:
        with self._lock:
            for attempt in range(2):
                connection = self._started()
                try:
                    connection.send(request)
                    status, payload = connection.recv()
                    break
                except (BrokenPipeError, ConnectionResetError) as exc:
                    # The child's end closed with the request unread: it was ending as the
                    # request came (its threads exiting), and did nothing of it.
                    self._stop()
                    if attempt:
                        raise WriterProcessError(
                            f"the steady writer's process ended twice as it was asked ({exc})"
                        ) from exc
                except (EOFError, OSError) as exc:
                    self._stop()
                    raise WriterProcessError(
                        f"the steady writer's process ended during a {request[0]} "
                        f"({exc or 'no answer'}); whether it landed is read from the table at "
                        "the next start"
                    ) from exc
        if status == "ok":
            return payload
        kind, message, trace = payload
        error: Exception = (
            MergeConflict(message) if kind == "MergeConflict"
            else WriterProcessError(f"the steady writer failed: {kind}: {message}")
        )  # fmt: skip
        error.add_note(f"in the steady writer's process:\n{trace}")
        raise error

    def _started(self) -> Connection:
        alive = self._process is not None and self._process.poll() is None
        # Between requests nothing is there to read: a readable socket is the end of a child
        # that died (it may not be reapable yet, while its threads exit).
        if alive and self._connection is not None and not self._connection.poll(0):
            return self._connection
        if self._process is not None:
            # Between commits (the thread that started it may have ended, and the child with
            # it): nothing was in flight, so another one simply takes over.
            _log.info("the steady writer's process had ended (%s); starting another",
                      self._process.returncode)  # fmt: skip
            self._stop()
        if not self.starts:
            remove_stale_transfers()
        ours, theirs = socket.socketpair()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno()), str(os.getpid())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            )
        finally:
            theirs.close()
        self._connection = Connection(ours.detach())
        self.starts += 1
        self._connection.send((self.path, self.layout.group_width, self.row_images))
        if not self._connection.poll(START_TIMEOUT_S):
            self._stop()
            raise WriterProcessError(f"the steady writer's process did not start within "
                                     f"{START_TIMEOUT_S:.0f} s")  # fmt: skip
        try:
            self._connection.recv()  # ready
        except EOFError as exc:
            self._stop()
            raise WriterProcessError("the steady writer's process ended as it started") from exc
        return self._connection

    def _stop(self) -> None:
        connection, process = self._connection, self._process
        self._connection = self._process = None
        if connection is not None:
            connection.close()  # the child reads the end of its socket and exits
        if process is not None:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


TRANSFER_PREFIX = "replicator-batch-"


def _transfer_directory() -> str:
    return TRANSFER_DIRECTORY if os.access(TRANSFER_DIRECTORY, os.W_OK) else tempfile.gettempdir()


def _transfer_path() -> str:
    name = f"{TRANSFER_PREFIX}{os.getpid()}-{uuid.uuid4()}.arrow"
    return os.path.join(_transfer_directory(), name)


def remove_stale_transfers() -> int:
    """Remove the batch files of runs that are gone (killed between writing one and the child
    opening it: in /dev/shm they would hold memory until the machine restarts)."""
    removed = 0
    directory = _transfer_directory()
    for name in os.listdir(directory):
        if not name.startswith(TRANSFER_PREFIX):
            continue
        pid = name[len(TRANSFER_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(directory, name))
                removed += 1
    return removed


# -- the child ---------------------------------------------------------------------------


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent ends (Linux), and end now if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _serve(connection: Connection) -> None:
    from replicator.delta.dv_merge import DeletionVectorMerger
    from replicator.delta.schema import DataLayout

    path, width, row_images = connection.recv()
    merger = DeletionVectorMerger(path, DataLayout(width), row_images=row_images)
    connection.send("ready")
    while True:
        try:
            kind, *arguments = connection.recv()
        except EOFError:
            return
        try:
            reply: tuple[str, Any]
            if kind == "merge":
                transfer, metadata = arguments
                with pa.memory_map(transfer, "r") as source:
                    changes = pa.ipc.open_file(source).read_all()
                os.remove(transfer)  # mapped: its memory goes once this batch is done
                landed = merger.merge(changes, metadata)
                del changes
                reply = ("ok", (landed, merger.last_rows, merger.conflicts))
            elif kind == "pack":
                (packed_under,) = arguments
                packed = merger.pack(packed_under)
                reply = ("ok", packed)
            else:
                raise ValueError(f"unknown request {kind!r}")
        except Exception as exc:  # told to the parent, which raises it in the commit thread
            reply = ("error", (type(exc).__name__, str(exc), traceback.format_exc()))
        connection.send(reply)


def main(argv: list[str]) -> int:
    descriptor, parent = int(argv[0]), int(argv[1])
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="replicator writer: %(message)s")
    _serve(Connection(descriptor))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
