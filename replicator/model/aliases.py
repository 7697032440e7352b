"""Type aliases more than one layer uses, in one place (as Delta's python/delta/_typing.py).

Aliases private to one module stay in that module.
"""

from __future__ import annotations

from collections.abc import Callable

from replicator.model.positions import FailoverLog, SeqnoRange, VbucketPosition

__all__ = ["CommittedPosition", "DocumentKey", "FaultHook", "SeqnoRange"]

FaultHook = Callable[[str], None]
"""Called with the name of each step a test may fail at (fault injection); what it raises acts as
a fault at that step. The step names are the FAULT_STEPS of the module that calls it."""

CommittedPosition = Callable[[int], tuple[VbucketPosition, FailoverLog | None]]
"""The answer to "where does vbucket N resume?": its committed boundary and the failover log
persisted with it (None when there is none yet, only valid at seqno 0)."""

DocumentKey = tuple[int, str]
"""(collection_id, key): a document's identity within one vbucket."""
