"""Builders of staged changes and batches, and whole-history consistency checks, for Delta tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from replicator.delta.commit_metadata import CommitMetadata
from replicator.delta.table import MirrorTable
from replicator.model.positions import VbucketPosition
from replicator.planning.planner import CommitBatch, CommitTrigger, VbucketCommit
from replicator.staging.rows import CHANGE_SCHEMA, DELETE, UPSERT

UUID = 0xFEEDFACECAFEBEEF
"""A vbucket uuid above 2**63: positions must survive u64 round trips."""


@dataclass(frozen=True)
class Change:
    """One staged change in a test: an upsert of `doc` (JSON text) or a delete."""

    vbucket: int
    key: str
    seqno: int
    doc: str | None = None
    op: str = UPSERT
    collection_id: int = 0
    expiry: datetime | None = None


def upsert(vbucket: int, key: str, seqno: int, doc: str | None = None, **kw: Any) -> Change:
    return Change(vbucket, key, seqno, doc if doc is not None else f'{{"v":{seqno}}}', **kw)


def delete(vbucket: int, key: str, seqno: int, **kw: Any) -> Change:
    return Change(vbucket, key, seqno, None, DELETE, **kw)


def change_table(changes: Iterable[Change]) -> pa.Table:
    """Arrow rows with the staging schema, as the snapshots layer hands them over."""
    changes = list(changes)
    names = {0: ("_default", "_default"), 8: ("inventory", "hotels")}
    columns: dict[str, list[Any]] = {name: [] for name in CHANGE_SCHEMA.names}
    for c in changes:
        scope, collection = names.get(c.collection_id, ("s", f"c{c.collection_id}"))
        columns["vbucket"].append(c.vbucket)
        columns["scope"].append(scope)
        columns["collection"].append(collection)
        columns["collection_id"].append(c.collection_id)
        columns["key"].append(c.key)
        columns["seqno"].append(c.seqno)
        columns["rev_seqno"].append(1)
        columns["cas"].append(1_000 + c.seqno)
        columns["flags"].append(0 if c.op == UPSERT else None)
        columns["expiry"].append(c.expiry)
        columns["op"].append(c.op)
        columns["is_json"].append(c.op == UPSERT)
        columns["doc"].append(c.doc)
        columns["value"].append(None)
        columns["xattrs"].append(None)
    return pa.Table.from_pydict(columns, schema=CHANGE_SCHEMA)


def vbucket_commit(
    vbucket: int,
    changes: Sequence[Change],
    *,
    seqno: int,
    first_load: bool,
    previous_seqno: int = 0,
    spill_files: Sequence[str] = (),
    dropped_collection_ids: Sequence[int] = (),
    uuid: int = UUID,
) -> VbucketCommit:
    """One vbucket's part of a batch, its rows in memory unless `spill_files` are given."""
    table = change_table(c for c in changes if c.vbucket == vbucket)
    return VbucketCommit(
        vbucket=vbucket,
        position=VbucketPosition.at_boundary(vbucket, uuid, seqno),
        previous_seqno=previous_seqno,
        first_load=first_load,
        snapshot_start=previous_seqno + 1,
        snapshot_count=1,
        tables=(table,) if table.num_rows else (),
        spill_files=tuple(spill_files),
        row_count=table.num_rows,
        byte_count=table.get_total_buffer_size(),
        staged_run_ids=(0,),
        dropped_collection_ids=tuple(dropped_collection_ids),
    )


def batch(batch_id: int, *commits: VbucketCommit) -> CommitBatch:
    return CommitBatch(batch_id=batch_id, commits=tuple(commits), trigger=CommitTrigger.FORCED)


def documents(mirror: MirrorTable, vbuckets: Iterable[int], version: int | None = None) -> set[Any]:
    """(vbucket, key, seqno, doc) of the mirror's rows in `vbuckets`."""
    frame = mirror.read(version).where(f"vbucket IN ({', '.join(map(str, vbuckets))})")
    return {tuple(r) for r in frame.select("vbucket", "key", "seqno", "doc").collect()}


def commits_of_batch(mirror: MirrorTable, owner_id: str, batch_id: int) -> list[int]:
    """Versions of the data table commits of one batch (any part)."""
    return [
        record.version
        for record in mirror.commits_after({})
        if record.metadata.owner_id == owner_id and record.metadata.batch_id == batch_id
    ]


ExpectedState = Callable[[int, VbucketPosition], Mapping[tuple[int, str], int] | None]
"""(vbucket, position) -> {(collection_id, key): seqno} the vbucket must hold at that position,
or None when the test has no model of that vbucket."""


def positions_by_version(mirror: MirrorTable) -> dict[int, dict[int, VbucketPosition]]:
    """For every version of the data table, each vbucket's position as its commits say."""
    delta = mirror.delta()
    history = delta.history().select("version", "userMetadata").orderBy("version").collect()
    current: dict[int, VbucketPosition] = {}
    by_version: dict[int, dict[int, VbucketPosition]] = {}
    for row in history:
        metadata = CommitMetadata.from_json(row["userMetadata"])
        if metadata is not None:
            current.update(metadata.positions)
        by_version[int(row["version"])] = dict(current)
    return by_version


def every_version_consistent(
    mirror: MirrorTable,
    expected_state: ExpectedState | None = None,
    *,
    vbuckets: Iterable[int] | None = None,
    from_version: int = 0,
) -> list[str]:
    """Read every version and check it is a set of whole snapshots; return the problems found.

    Without `expected_state`, checks that no vbucket holds a row beyond the position its last
    commit reached (a half-applied snapshot would). With it, checks each vbucket's rows are
    exactly the state at that position. Rollback and resync commits count as positions too.
    `vbuckets` and `from_version` limit the check (tests sharing a mirror keep to their own).
    """
    problems: list[str] = []
    only = None if vbuckets is None else sorted(set(vbuckets))
    for version, all_positions in sorted(positions_by_version(mirror).items()):
        if version < from_version:
            continue
        positions = {vb: p for vb, p in all_positions.items() if only is None or vb in only}
        frame = mirror.read(version)
        if only is not None:
            frame = frame.where(f"vbucket IN ({', '.join(map(str, only))})")
        rows = frame.select("vbucket", "collection_id", "key", "seqno").collect()
        held: dict[int, dict[tuple[int, str], int]] = {}
        for r in rows:
            held.setdefault(int(r["vbucket"]), {})[(int(r["collection_id"]), r["key"])] = int(
                r["seqno"]
            )
        for vbucket, docs in held.items():
            position = positions.get(vbucket)
            if position is None:
                problems.append(f"v{version}: vbucket {vbucket} has rows but no committed position")
                continue
            beyond = {k: s for k, s in docs.items() if s > position.seqno}
            if beyond:
                problems.append(
                    f"v{version}: vbucket {vbucket} at seqno {position.seqno} holds later rows "
                    f"{sorted(beyond.items())}"
                )
        if expected_state is not None:
            for vbucket, position in positions.items():
                model = expected_state(vbucket, position)
                if model is None:
                    continue
                want = dict(model)
                got = held.get(vbucket, {})
                if got != want:
                    problems.append(
                        f"v{version}: vbucket {vbucket} at seqno {position.seqno}: rows {got} "
                        f"!= expected {want}"
                    )
    return problems


def state_at(changes: Sequence[Change]) -> ExpectedState:
    """An ExpectedState from one linear history of changes (no rollbacks)."""

    def expected(vbucket: int, position: VbucketPosition) -> dict[tuple[int, str], int]:
        state: dict[tuple[int, str], int] = {}
        for c in sorted(changes, key=lambda c: c.seqno):
            if c.vbucket != vbucket or c.seqno > position.seqno:
                continue
            if c.op == UPSERT:
                state[(c.collection_id, c.key)] = c.seqno
            else:
                state.pop((c.collection_id, c.key), None)
        return state

    return expected
