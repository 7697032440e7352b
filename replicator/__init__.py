"""replicator: mirror a Couchbase bucket into Delta Lake through DCP, on Spark.

The public Python surface, importable from `replicator` itself:

- running a replication: `ReplicatorConfig`, `run_replication`, `BackgroundRun`,
  `ReplicationSummary`;
- the errors a caller may catch (all are `ReplicatorError`s);
- the audit API: a document's versions, the mirror as of a time or a source seqno, the changes
  between two versions, rollbacks and commit activity, `MirrorHistory`;
- the read side: `read_status`, `run_verify`, `collection_frame` and
  `register_collection_views` (one DataFrame or view per collection).

Names resolve on first use, so `import replicator` (and the embedded producer, which imports
only `replicator.sim`) does not import Spark or the DCP client.

>>> import replicator
>>> replicator.ConfigError.__mro__[1].__name__
'ReplicatorError'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replicator.config import ReplicatorConfig
    from replicator.errors import (
        AuthenticationError,
        BucketNotFoundError,
        ConfigError,
        ConnectionLostError,
        DeltaJarsMissing,
        NodeError,
        NodeUnreachableError,
        NotAMirrorError,
        OwnershipConflict,
        ProtocolError,
        ReplicatorError,
        TlsError,
        UnsupportedCommandError,
    )
    from replicator.inspect.collections import collection_frame, register_collection_views
    from replicator.inspect.commits import (
        CommitActivity,
        RollbackRecord,
        commit_activity,
        rollbacks,
    )
    from replicator.inspect.documents import DocumentVersion, FieldChange, document_history
    from replicator.inspect.mirror_history import (
        HistoryUnavailableError,
        MirrorHistory,
        VersionOutOfRangeError,
        VersionVacuumedError,
    )
    from replicator.inspect.status import MirrorStatus, read_status
    from replicator.inspect.time_travel import (
        changes_between,
        changes_table,
        mirror_as_of,
        mirror_at_source_seqno,
    )
    from replicator.inspect.verify import run_verify
    from replicator.pipeline.replication import ReplicationSummary
    from replicator.pipeline.runner import BackgroundRun, run_replication

_HOMES = {
    "replicator.config": ("ReplicatorConfig",),
    "replicator.errors": (
        "AuthenticationError", "BucketNotFoundError", "ConfigError", "ConnectionLostError",
        "DeltaJarsMissing", "NodeError", "NodeUnreachableError", "NotAMirrorError",
        "OwnershipConflict", "ProtocolError", "ReplicatorError", "TlsError",
        "UnsupportedCommandError",
    ),
    "replicator.pipeline.runner": ("BackgroundRun", "run_replication"),
    "replicator.pipeline.replication": ("ReplicationSummary",),
    "replicator.inspect.documents": ("DocumentVersion", "FieldChange", "document_history"),
    "replicator.inspect.time_travel": (
        "changes_between", "changes_table", "mirror_as_of", "mirror_at_source_seqno",
    ),
    "replicator.inspect.commits": (
        "CommitActivity", "RollbackRecord", "commit_activity", "rollbacks",
    ),
    "replicator.inspect.mirror_history": (
        "HistoryUnavailableError", "MirrorHistory", "VersionOutOfRangeError",
        "VersionVacuumedError",
    ),
    "replicator.inspect.status": ("MirrorStatus", "read_status"),
    "replicator.inspect.verify": ("run_verify",),
    "replicator.inspect.collections": ("collection_frame", "register_collection_views"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "AuthenticationError",
    "BackgroundRun",
    "BucketNotFoundError",
    "CommitActivity",
    "ConfigError",
    "ConnectionLostError",
    "DeltaJarsMissing",
    "DocumentVersion",
    "FieldChange",
    "HistoryUnavailableError",
    "MirrorHistory",
    "MirrorStatus",
    "NodeError",
    "NodeUnreachableError",
    "NotAMirrorError",
    "OwnershipConflict",
    "ProtocolError",
    "ReplicationSummary",
    "ReplicatorConfig",
    "ReplicatorError",
    "RollbackRecord",
    "TlsError",
    "UnsupportedCommandError",
    "VersionOutOfRangeError",
    "VersionVacuumedError",
    "changes_between",
    "changes_table",
    "collection_frame",
    "commit_activity",
    "document_history",
    "mirror_as_of",
    "mirror_at_source_seqno",
    "read_status",
    "register_collection_views",
    "rollbacks",
    "run_replication",
    "run_verify",
]


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'replicator' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
