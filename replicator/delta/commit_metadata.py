"""What every replicator commit says about itself: its kind, owner, batch and positions.

A data commit's userMetadata is a `CommitMetadata`: the commit itself says which positions it
reached, so the checkpoints table can always be repaired from the data table's history. Its
Delta idempotency ids (`txn_app_id`, `txn_version`) come from the same owner and batch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from replicator.delta.schema import FORMAT_VERSION
from replicator.model.positions import VbucketPosition

COMMIT = "commit"
ROLLBACK = "rollback"
RESYNC = "resync"
COMMIT_KINDS = (COMMIT, ROLLBACK, RESYNC)

VBUCKET_DETAILS = "vbuckets"
"""The details key of a commit that rolls back several vbuckets: one mapping per vbucket."""


def txn_version(batch_id: int, part: int) -> int:
    """The Delta txnVersion of part `part` (0 or 1) of batch `batch_id`.

    A batch may become two commits (append part, merge part); each needs its own version,
    and versions must only grow with batch ids.
    """
    if batch_id < 0 or part not in (0, 1):
        raise ValueError(f"no txn version for batch {batch_id} part {part}")
    return batch_id * 2 + part


def txn_app_id(owner_id: str) -> str:
    """The Delta txnAppId of every commit an owner makes (data and checkpoints alike)."""
    return f"replicator-{owner_id}"


def _position_array(position: VbucketPosition) -> list[int]:
    """A position as few numbers as say it all: commits at 1024 vbuckets carry 1024 of them.

    [uuid, seqno] for a boundary with nothing purged and the default manifest (the usual
    case), [uuid, seqno, purge, manifest] for another boundary, else all six fields.

    >>> _position_array(VbucketPosition.at_boundary(3, 7, 40))
    [7, 40]
    >>> _parse_position(3, [7, 40]) == VbucketPosition.at_boundary(3, 7, 40)
    True
    """
    p = position
    if p.snapshot_start == p.snapshot_end == p.seqno:
        if p.purge_seqno == 0 and p.manifest_uid == 0:
            return [p.vbucket_uuid, p.seqno]
        return [p.vbucket_uuid, p.seqno, p.purge_seqno, p.manifest_uid]
    return [p.vbucket_uuid, p.seqno, p.snapshot_start, p.snapshot_end, p.purge_seqno,
            p.manifest_uid]


def _parse_position(vbucket: int, values: list[Any]) -> VbucketPosition:
    numbers = [int(n) for n in values]
    if len(numbers) == 2:
        uuid, seqno = numbers
        return VbucketPosition(vbucket, uuid, seqno, seqno, seqno, 0, 0)
    if len(numbers) == 4:
        uuid, seqno, purge, manifest = numbers
        return VbucketPosition(vbucket, uuid, seqno, seqno, seqno, purge, manifest)
    if len(numbers) == 6:
        return VbucketPosition(vbucket, *numbers)
    raise ValueError(f"vbucket {vbucket}: a position has 2, 4 or 6 numbers, got {len(numbers)}")


_HEADER = re.compile(
    r'\{"replicator":(\d+),"kind":"(\w+)","batch":(\d+),"part":(\d+),"owner":"([^"\\]*)"'
)
"""The fixed start of CommitMetadata.to_json: its keys come first, in this order."""


@dataclass(frozen=True, slots=True)
class CommitHeader:
    """Who made a replicator commit and what kind it is, without its positions.

    A commit's metadata holds a position per vbucket it moved (1024 for a group commit of a
    whole bucket); readers that only filter commits by owner or kind read this instead.
    """

    kind: str
    batch_id: int
    part: int
    owner_id: str

    @classmethod
    def from_json(cls, text: str | None) -> CommitHeader | None:
        """The header of a commit's userMetadata; None when the replicator did not make it."""
        if not text:
            return None
        match = _HEADER.match(text)
        if match is not None:
            if int(match[1]) != FORMAT_VERSION:
                return None
            return cls(match[2], int(match[3]), int(match[4]), match[5])
        # Written some other way (another key order, escapes in the owner id): parse it all.
        try:
            metadata = CommitMetadata.from_json(text)
        except ValueError:
            return None
        if metadata is None:
            return None
        return cls(metadata.kind, metadata.batch_id, metadata.part, metadata.owner_id)


@dataclass(frozen=True, slots=True)
class CommitMetadata:
    """The userMetadata of one data commit: who made it, for which batch, reaching which positions.

    `details` holds kind-specific facts (a rollback's from/to seqnos, failover log, reason):
    flat for one vbucket, a list under VBUCKET_DETAILS for a commit that rolls back several
    (see `vbucket_details`).
    """

    kind: str
    batch_id: int
    part: int
    owner_id: str
    strategy: str
    positions: Mapping[int, VbucketPosition]
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in COMMIT_KINDS:
            raise ValueError(f"unknown commit kind {self.kind!r}; expected one of {COMMIT_KINDS}")

    @property
    def txn_version(self) -> int:
        return txn_version(self.batch_id, self.part)

    def to_json(self) -> str:
        """Compact JSON for `spark.databricks.delta.commitInfo.userMetadata`."""
        document: dict[str, Any] = {
            "replicator": FORMAT_VERSION,
            "kind": self.kind,
            "batch": self.batch_id,
            "part": self.part,
            "owner": self.owner_id,
            "strategy": self.strategy,
            "positions": {str(vb): _position_array(p) for vb, p in sorted(self.positions.items())},
        }
        for key, value in self.details.items():
            document.setdefault(key, value)
        return json.dumps(document, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> CommitMetadata | None:
        """Parse a commit's userMetadata; None when the commit was not made by the replicator."""
        if not text:
            return None
        try:
            document = json.loads(text)
        except ValueError:
            return None
        if not isinstance(document, dict) or document.get("replicator") != FORMAT_VERSION:
            return None
        try:
            positions = {
                int(vb): _parse_position(int(vb), values)
                for vb, values in document["positions"].items()
            }
            known = {"replicator", "kind", "batch", "part", "owner", "strategy", "positions"}
            return cls(
                kind=str(document["kind"]),
                batch_id=int(document["batch"]),
                part=int(document["part"]),
                owner_id=str(document["owner"]),
                strategy=str(document["strategy"]),
                positions=positions,
                details={k: v for k, v in document.items() if k not in known},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed replicator commit metadata: {exc}") from exc

    def vbucket_details(self) -> dict[int, Mapping[str, Any]]:
        """Per vbucket, the facts of a rollback or resync (each mapping names its `vbucket`).

        A one-vbucket commit keeps them flat, as every release before multi-vbucket rollbacks
        wrote them; a flat mapping without `vbucket` belongs to the commit's only vbucket.
        """
        listed = self.details.get(VBUCKET_DETAILS)
        if isinstance(listed, list):
            return {int(facts["vbucket"]): facts for facts in listed if isinstance(facts, dict)}
        vbucket = self.details.get("vbucket")
        if vbucket is None and len(self.positions) == 1:
            vbucket = next(iter(self.positions))
        return {} if vbucket is None else {int(vbucket): self.details}


def rollback_details(facts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The details of a commit rolling back the vbuckets `facts` describe (each has `vbucket`):
    flat for one, so one-vbucket rollbacks read as they always did."""
    if len(facts) == 1:
        return dict(facts[0])
    return {VBUCKET_DETAILS: [dict(f) for f in sorted(facts, key=lambda f: int(f["vbucket"]))]}
