"""What `replicator verify` found, per vbucket and in all, and the key-by-key comparison behind it.

A vbucket is equal, not at the same boundary as the source (its contents cannot be compared),
or different; a different one names its first differing keys. All pure.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replicator.inspect.mirror_scan import MirrorDocument
    from replicator.inspect.source_scan import SourceVbucketScan
    from replicator.model.aliases import DocumentKey


class Verdict(enum.Enum):
    """What verify found for one vbucket."""

    EQUAL = "equal"
    NOT_AT_BOUNDARY = "not at the same boundary"
    DIFFERENT = "different"


class Difference(enum.Enum):
    MISSING = "missing in mirror"
    EXTRA = "extra in mirror"
    CHANGED = "different"


@dataclass(frozen=True, slots=True)
class KeyDifference:
    """One document that differs between the source and the mirror."""

    kind: Difference
    scope: str
    collection: str
    key: str
    source_seqno: int | None
    mirror_seqno: int | None

    def describe(self) -> str:
        where = f"{self.scope}.{self.collection} {self.key!r}"
        seqnos = []
        if self.mirror_seqno is not None:
            seqnos.append(f"mirror seqno {self.mirror_seqno}")
        if self.source_seqno is not None:
            seqnos.append(f"source seqno {self.source_seqno}")
        return f"{self.kind.value}: {where} ({', '.join(seqnos)})"


@dataclass(frozen=True, slots=True)
class VbucketVerdict:
    """The outcome for one vbucket. Counts are complete; `examples` holds the first keys."""

    vbucket: int
    verdict: Verdict
    mirror_seqno: int
    source_seqno: int
    source_documents: int = 0
    mirror_documents: int = 0
    missing: int = 0
    extra: int = 0
    changed: int = 0
    examples: tuple[KeyDifference, ...] = ()
    expired_ignored: int = 0
    source_moved_to: int | None = None

    @property
    def equal(self) -> bool:
        return self.verdict is Verdict.EQUAL

    def describe(self, *, max_keys: int = 10) -> list[str]:
        """Lines for the report (none for an equal vbucket)."""
        if self.verdict is Verdict.EQUAL:
            return []
        if self.verdict is Verdict.NOT_AT_BOUNDARY:
            if self.mirror_seqno > self.source_seqno:
                # What run does about it: a failover rolls the vbucket back, a source that lost
                # data on the same history resyncs it from 0 (both recorded in the history).
                return [
                    f"vbucket {self.vbucket}: the mirror is ahead of the source: mirror at seqno "
                    f"{self.mirror_seqno}, source at seqno {self.source_seqno}, so the source "
                    "lost changes the mirror has; `replicator run --until-caught-up` rolls the "
                    "vbucket back (or resyncs it from 0 when the source kept its history's "
                    "uuid) and records why; then verify again"
                ]
            return [
                f"vbucket {self.vbucket}: not at the same boundary: mirror at seqno "
                f"{self.mirror_seqno}, source at seqno {self.source_seqno}; run "
                "`replicator run --until-caught-up`, then verify again"
            ]
        moved = (
            f"; the source changed during verify (high seqno {self.source_seqno} -> "
            f"{self.source_moved_to}), verify again when it is quiet"
            if self.source_moved_to is not None
            else ""
        )
        lines = [
            f"vbucket {self.vbucket}: different at seqno {self.source_seqno}: {self.missing} "
            f"missing in mirror, {self.extra} extra in mirror, {self.changed} different "
            f"(source {self.source_documents} documents, mirror {self.mirror_documents}){moved}"
        ]
        shown = self.examples[:max_keys]
        lines.extend(f"  {difference.describe()}" for difference in shown)
        hidden = self.missing + self.extra + self.changed - len(shown)
        if hidden > 0:
            lines.append(f"  ... and {hidden} more")
        return lines


def boundary_verdict(vbucket: int, mirror_seqno: int, source_seqno: int) -> VbucketVerdict | None:
    """NOT_AT_BOUNDARY when the mirror's committed seqno is not the source's high seqno."""
    if mirror_seqno == source_seqno:
        return None
    return VbucketVerdict(vbucket, Verdict.NOT_AT_BOUNDARY, mirror_seqno, source_seqno)


def compare_documents(
    vbucket: int,
    seqno: int,
    source: SourceVbucketScan,
    mirror: Mapping[DocumentKey, MirrorDocument],
    mirror_expired: Iterable[DocumentKey] = (),
    *,
    max_examples: int = 100,
) -> VbucketVerdict:
    """Key-by-key comparison of one vbucket at the same boundary `seqno` (pure).

    Documents past their expiry on either side are left out and counted.
    """
    ignored = source.expired_keys() | set(mirror_expired)
    expected = source.live_fingerprints(excluded=ignored)
    held = {key: doc for key, doc in mirror.items() if key not in ignored}
    differences: list[KeyDifference] = []
    counts = collections.Counter[Difference]()

    def note(kind: Difference, key: DocumentKey, source_seqno: int | None,
             mirror_doc: MirrorDocument | None) -> None:
        counts[kind] += 1
        if len(differences) < max_examples:
            scope, name = (
                (mirror_doc.scope, mirror_doc.collection) if mirror_doc is not None
                else source.names.get(key[0], ("?", f"collection {key[0]:#x}"))
            )
            differences.append(
                KeyDifference(kind, scope, name, key[1], source_seqno,
                              mirror_doc.seqno if mirror_doc is not None else None)
            )

    for key in sorted(expected.keys() | held.keys()):
        mirror_doc = held.get(key)
        source_doc = source.documents.get(key)
        source_seqno = source_doc.seqno if source_doc is not None and source_doc.live else None
        if key not in expected:
            note(Difference.EXTRA, key, None, mirror_doc)
        elif mirror_doc is None:
            note(Difference.MISSING, key, source_seqno, None)
        elif mirror_doc.fingerprint != expected[key]:
            note(Difference.CHANGED, key, source_seqno, mirror_doc)
    verdict = Verdict.DIFFERENT if counts else Verdict.EQUAL
    return VbucketVerdict(
        vbucket=vbucket,
        verdict=verdict,
        mirror_seqno=seqno,
        source_seqno=seqno,
        source_documents=len(expected),
        mirror_documents=len(held),
        missing=counts[Difference.MISSING],
        extra=counts[Difference.EXTRA],
        changed=counts[Difference.CHANGED],
        examples=tuple(differences),
        expired_ignored=len(ignored),
    )


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Everything `replicator verify` found."""

    bucket: str
    target: str
    vbuckets: tuple[VbucketVerdict, ...]

    @property
    def equal(self) -> bool:
        return all(vb.equal for vb in self.vbuckets)

    def count(self, verdict: Verdict) -> int:
        return sum(1 for vb in self.vbuckets if vb.verdict is verdict)

    @property
    def documents_compared(self) -> int:
        return sum(vb.source_documents for vb in self.vbuckets if vb.verdict is not (
            Verdict.NOT_AT_BOUNDARY
        ))

    @property
    def expired_ignored(self) -> int:
        return sum(vb.expired_ignored for vb in self.vbuckets)

    def summary(self) -> str:
        outcome = "EQUAL" if self.equal else "DIFFERENT"
        return (
            f"verify of bucket {self.bucket!r} against {self.target}: {outcome}: "
            f"{len(self.vbuckets)} vbuckets, {self.count(Verdict.EQUAL)} equal, "
            f"{self.count(Verdict.NOT_AT_BOUNDARY)} not at the same boundary, "
            f"{self.count(Verdict.DIFFERENT)} different; {self.documents_compared} documents "
            f"compared, {self.expired_ignored} past their expiry ignored"
        )

    def describe(self, *, max_keys: int = 10) -> str:
        """Summary line, then each unequal vbucket with up to `max_keys` differing keys."""
        lines = [self.summary()]
        for vb in self.vbuckets:
            lines.extend(vb.describe(max_keys=max_keys))
        return "\n".join(lines)
