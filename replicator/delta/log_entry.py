"""Log entries written by the replicator's own writers (deletion-vector merges, compaction).

An entry is created exclusively: when another writer took the version, the caller plans again
on the newer table (or gives way), and removes the files it wrote for the entry that did not
land.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import Any


def publish_entry(log_file: str, actions: Sequence[Mapping[str, Any]]) -> bool:
    """Write the log entry `log_file` whole or not at all; False when it exists already.

    Written to a temporary file first, then hard-linked to its name: a link never replaces a
    file, and a reader sees the entry complete or not at all (a crash mid-write leaves only
    the temporary file).
    """
    temporary = f"{os.path.dirname(log_file)}/.{os.path.basename(log_file)}.{uuid.uuid4()}.tmp"
    with open(temporary, "x", encoding="utf-8") as out:
        out.writelines(json.dumps(action) + "\n" for action in actions)
        out.flush()
        os.fsync(out.fileno())
    try:
        os.link(temporary, log_file)
    except FileExistsError:
        return False
    finally:
        os.remove(temporary)
    return True


def remove_files(paths: Sequence[str]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
