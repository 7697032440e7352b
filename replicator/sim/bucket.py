"""The simulated Couchbase bucket: vbuckets and collections behind the API tests drive.

Slightly over 500 lines on purpose: it is the one `SimBucket` API, with the op and record types
its methods take and return; its methods are short delegations that splitting would scatter.

Tests write documents, change collections, fail vbuckets over, purge tombstones and run the
expiry pager; the embedded DCP server serves the same bucket through `StreamCursor`s. One lock
(a `threading.Condition`) guards it all; the server waits on it, or registers a listener that
is called with the changed vbuckets after each change, outside the lock.

>>> bucket = SimBucket("travel", num_vbuckets=16, seed=7)
>>> mutation = bucket.upsert("airline_10", {"name": "40-Mile Air"})
>>> [record.key for record in bucket.documents()]
[b'airline_10']

A magma bucket can retain history (Couchbase 7.2+ change streams):

>>> history = SimBucket("cdc", num_vbuckets=1, history_retention_seconds=3600)
>>> for name in ("Ada", "Bo"):
...     _ = history.upsert("user::1", {"name": name})
>>> [item.value for item in history.history_revisions(0)]
[b'{"name":"Ada"}', b'{"name":"Bo"}']
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from replicator.dcp.protocol.events import Deletion, Expiration, Mutation
from replicator.model.positions import FailoverLog
from replicator.sim.collections import (
    DEFAULT_COLLECTION_ID,
    DEFAULT_COLLECTION_PATH,
    CollectionsManifest,
    ManifestChange,
    split_collection_path,
)
from replicator.sim.history_items import DocumentItem, DocumentWrite, HistoryItem, WriteKind
from replicator.sim.vbmap import vbucket_for_key
from replicator.sim.vbucket import DEFAULT_CHECKPOINT_MAX_ITEMS, VBucket

DocumentValue = bytes | str | Mapping[str, object]
"""A document body: bytes as they are, str as UTF-8, a mapping as compact JSON."""

ChangeListener = Callable[[frozenset[int]], None]
"""Called with the vbuckets that changed, after the bucket's lock is released."""

StorageBackend = Literal["couchstore", "magma"]
"""How the bucket stores its data; only magma can retain history (change streams)."""


@dataclass(frozen=True, slots=True)
class Upsert:
    """Create or replace a document. `expiry` is absolute unix seconds (0: never)."""

    key: bytes | str
    value: DocumentValue
    collection: str = DEFAULT_COLLECTION_PATH
    expiry: int = 0
    flags: int = 0
    xattrs: Mapping[str, str] | None = None
    is_json: bool = True


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete an existing document."""

    key: bytes | str
    collection: str = DEFAULT_COLLECTION_PATH


@dataclass(frozen=True, slots=True)
class Touch:
    """Set an existing document's expiry (absolute unix seconds); a new mutation."""

    key: bytes | str
    expiry: int
    collection: str = DEFAULT_COLLECTION_PATH


@dataclass(frozen=True, slots=True)
class Expire:
    """Expire an existing document now, as the expiry pager or a read past its expiry would."""

    key: bytes | str
    collection: str = DEFAULT_COLLECTION_PATH


BucketOp = Upsert | Delete | Touch | Expire
"""One document change for `SimBucket.apply_batch`."""


@dataclass(frozen=True, slots=True)
class DocumentRecord:
    """One live document exactly as the bucket holds it, for comparison with a mirror."""

    key: bytes
    collection: str
    collection_id: int
    vbucket: int
    seqno: int
    rev_seqno: int
    cas: int
    flags: int
    expiry: int
    value: bytes
    is_json: bool
    xattrs: tuple[tuple[str, str], ...]


class SimBucket:
    """A Couchbase bucket in memory: `num_vbuckets` vbuckets and a collections manifest.

    Deterministic from `seed` (vbucket uuids) and `clock_ns` (CAS, delete times). With
    `may_contain_duplicates`, memory snapshots keep every version of a key and carry flag 0x20.
    `checkpoint_max_items` is how many recent items a vbucket keeps in memory checkpoints;
    streams further behind are backfilled from "disk". `superseded_window` (None: keep every
    version) frees versions replaced more than that many seqnos ago in their vbucket, so that
    memory follows the live documents rather than the writes; failovers and `state_at` then
    reach back that far only (see `replicator.sim.vbucket`).

    History retention, as kv_engine's bucket settings of the same names (0 is off for each):
    `history_retention_seconds` keeps revisions whose CAS time is at most that old,
    `history_retention_bytes` the newest revisions within the budget, split evenly over the
    vbuckets (bytes // num_vbuckets each, as magma does). Which collections keep history:
    `history_collections` names them ("scope.collection"; `_default._default` for the default
    collection, also ones created later), and `history_collection_default` (ns_server's
    historyRetentionCollectionDefault; None means true on magma unless `history_collections`
    names some) gives history to every other collection. `storage_backend` None means magma
    when any history setting is given, else couchstore; couchstore cannot retain history (and
    refuses DCP change streams).
    """

    def __init__(
        self,
        name: str,
        num_vbuckets: int = 1024,
        *,
        seed: int = 0,
        may_contain_duplicates: bool = False,
        checkpoint_max_items: int = DEFAULT_CHECKPOINT_MAX_ITEMS,
        clock_ns: Callable[[], int] = time.time_ns,
        history_retention_seconds: int = 0,
        history_retention_bytes: int = 0,
        history_collections: Iterable[str] = (),
        history_collection_default: bool | None = None,
        storage_backend: StorageBackend | None = None,
        superseded_window: int | None = None,
    ) -> None:
        if not name:
            raise ValueError("a bucket needs a name")
        if not 0 < num_vbuckets <= 0x10000:
            raise ValueError(f"num_vbuckets must be in 1..65536, got {num_vbuckets}")
        if history_retention_seconds < 0 or history_retention_bytes < 0:
            raise ValueError("history retention seconds and bytes must not be negative")
        history_paths = frozenset(_collection_path(path) for path in history_collections)
        wants_history = bool(
            history_retention_seconds
            or history_retention_bytes
            or history_paths
            or history_collection_default
        )
        if storage_backend is None:
            storage_backend = "magma" if wants_history else "couchstore"
        if storage_backend not in ("couchstore", "magma"):
            raise ValueError(
                f"storage_backend must be couchstore or magma, not {storage_backend!r}"
            )
        if storage_backend == "couchstore" and wants_history:
            raise ValueError("only a magma bucket can retain history")
        self.name = name
        self.num_vbuckets = num_vbuckets
        self.storage_backend: StorageBackend = storage_backend
        self.history_retention_seconds = history_retention_seconds
        self.history_retention_bytes = history_retention_bytes
        if history_collection_default is None:
            # ns_server's default on magma, unless the collections with history are named.
            history_collection_default = storage_backend == "magma" and not history_paths
        self.history_collection_default = history_collection_default
        self._history_paths = history_paths
        self.condition = threading.Condition(threading.RLock())
        self._clock_ns = clock_ns
        self._rng = random.Random(seed)
        default_history = self._collection_history(DEFAULT_COLLECTION_PATH, None)
        self._manifest = CollectionsManifest(default_collection_history=default_history)
        self._history_ids: set[int] = {DEFAULT_COLLECTION_ID} if default_history else set()
        self._listeners: list[ChangeListener] = []
        # magma splits the bucket's byte budget evenly over its vbuckets.
        vbucket_bytes = (
            max(1, history_retention_bytes // num_vbuckets) if history_retention_bytes else 0
        )
        self._vbuckets = tuple(
            VBucket(
                vb,
                rng=random.Random(self._rng.getrandbits(64)),
                lock=self.condition,
                may_contain_duplicates=may_contain_duplicates,
                checkpoint_max_items=checkpoint_max_items,
                clock_ns=clock_ns,
                history_retention_seconds=history_retention_seconds,
                history_retention_bytes=vbucket_bytes,
                history_collections=self._history_ids,
                superseded_window=superseded_window,
            )
            for vb in range(num_vbuckets)
        )

    # -- reading ------------------------------------------------------------------------

    def vbucket(self, vbucket: int) -> VBucket:
        """The vbucket with this id (the server streams from it)."""
        if not 0 <= vbucket < self.num_vbuckets:
            raise ValueError(
                f"bucket {self.name!r} has vbuckets 0..{self.num_vbuckets - 1}, not {vbucket}"
            )
        return self._vbuckets[vbucket]

    def vbucket_for(self, key: bytes | str) -> int:
        """The vbucket a key lives in."""
        return vbucket_for_key(_key_bytes(key), self.num_vbuckets)

    def keys_in_vbucket(self, vbucket: int, count: int, prefix: str) -> list[str]:
        """The first `count` keys `{prefix}-0`, `{prefix}-1`, ... that live in `vbucket`.

        For aiming writes (and faults) at one vbucket; the keys need not exist.
        """
        if not 0 <= vbucket < self.num_vbuckets:
            raise ValueError(f"vbucket {vbucket} is not in 0..{self.num_vbuckets - 1}")
        keys: list[str] = []
        index = 0
        while len(keys) < count:
            key = f"{prefix}-{index}"
            if self.vbucket_for(key) == vbucket:
                keys.append(key)
            index += 1
        return keys

    @property
    def can_retain_history(self) -> bool:
        """True for a magma bucket: it may retain history and serve DCP change streams."""
        return self.storage_backend == "magma"

    @property
    def retains_history(self) -> bool:
        """True when history retention is on (by age, by bytes or both)."""
        return bool(self.history_retention_seconds or self.history_retention_bytes)

    def history_start_seqno(self, vbucket: int) -> int:
        """Where a vbucket's history window starts (0: no history retained)."""
        return self.vbucket(vbucket).history_start_seqno

    def history_revisions(self, vbucket: int) -> list[DocumentItem]:
        """Every revision a vbucket retains as history (collections with history), by seqno:
        what a change-streams consumer receives of those collections from the window start."""
        return self.vbucket(vbucket).history_revisions()

    @property
    def manifest(self) -> CollectionsManifest:
        """The collections manifest; change it only through the bucket's methods."""
        return self._manifest

    def manifest_json(self) -> str:
        """The GET_COLLECTIONS_MANIFEST answer."""
        with self.condition:
            return self._manifest.manifest_json()

    def manifest_rest_json(self) -> str:
        """The management API's answer for the bucket's scopes and collections."""
        with self.condition:
            return self._manifest.rest_json()

    def high_seqnos(self) -> dict[int, int]:
        """High seqno of every vbucket (GET_ALL_VB_SEQNOS)."""
        with self.condition:
            return {vb.vbucket: vb.high_seqno for vb in self._vbuckets}

    def failover_log(self, vbucket: int) -> FailoverLog:
        """A vbucket's failover log, newest first."""
        return self.vbucket(vbucket).failover_log()

    def documents(
        self, *, vbucket: int | None = None, collection: str | None = None
    ) -> list[DocumentRecord]:
        """The exact live state, by vbucket then seqno, optionally of one vbucket or collection."""
        with self.condition:
            wanted = None if collection is None else self._manifest.collection(collection)
            vbuckets = self._vbuckets if vbucket is None else (self.vbucket(vbucket),)
            return [
                self._record(item)
                for vb in vbuckets
                for item in vb.documents()
                if wanted is None or item.collection_id == wanted.collection_id
            ]

    def state_at(self, vbucket: int, seqno: int) -> list[DocumentRecord]:
        """The live documents of one vbucket as of `seqno` (a mirror's committed boundary)."""
        with self.condition:
            return [self._record(item) for item in self.vbucket(vbucket).state_at(seqno)]

    # -- documents ----------------------------------------------------------------------

    def upsert(
        self,
        key: bytes | str,
        value: DocumentValue,
        *,
        collection: str = DEFAULT_COLLECTION_PATH,
        expiry: int = 0,
        flags: int = 0,
        xattrs: Mapping[str, str] | None = None,
        is_json: bool = True,
    ) -> Mutation:
        """Create or replace one document; returns the mutation written."""
        item = self.apply_batch([Upsert(key, value, collection, expiry, flags, xattrs, is_json)])
        assert isinstance(item[0], Mutation)
        return item[0]

    def delete(self, key: bytes | str, *, collection: str = DEFAULT_COLLECTION_PATH) -> Deletion:
        """Delete one existing document (DocumentNotFoundError otherwise)."""
        item = self.apply_batch([Delete(key, collection)])
        assert isinstance(item[0], Deletion)
        return item[0]

    def touch(
        self, key: bytes | str, expiry: int, *, collection: str = DEFAULT_COLLECTION_PATH
    ) -> Mutation:
        """Set an existing document's expiry (absolute unix seconds)."""
        item = self.apply_batch([Touch(key, expiry, collection)])
        assert isinstance(item[0], Mutation)
        return item[0]

    def expire(self, key: bytes | str, *, collection: str = DEFAULT_COLLECTION_PATH) -> Expiration:
        """Expire an existing document now."""
        item = self.apply_batch([Expire(key, collection)])
        assert isinstance(item[0], Expiration)
        return item[0]

    def apply_batch(self, ops: Iterable[BucketOp]) -> tuple[HistoryItem, ...]:
        """Apply ops together: one memory snapshot per affected vbucket; returns the items.

        While the bucket retains history, a second revision of a key of a collection with
        history starts a new memory snapshot (kv_engine's checkpoints then never dedupe it).

        Items come back in the order of `ops`. Every op is checked first (collection exists,
        deleted/touched/expired documents exist), so a failing batch changes nothing.
        """
        with self.condition:
            collection_ids: dict[str, int] = {}
            by_vbucket: dict[int, list[DocumentWrite]] = {}
            order: list[tuple[int, int]] = []
            for op in ops:
                write = self._document_write(op, collection_ids)
                vb = vbucket_for_key(write.key, self.num_vbuckets)
                group = by_vbucket.setdefault(vb, [])
                order.append((vb, len(group)))
                group.append(write)
            for vb, writes in by_vbucket.items():
                self._vbuckets[vb].check_writes(writes)
            written = {vb: self._vbuckets[vb].apply_writes(w) for vb, w in by_vbucket.items()}
            result = tuple(written[vb][index] for vb, index in order)
        self._notify(by_vbucket)
        return result

    # -- collections --------------------------------------------------------------------

    def create_scope(self, name: str) -> int:
        """Create a scope; returns its id."""
        with self.condition:
            (change,) = self._manifest.create_scope(name)
            self._apply_manifest((change,))
        self._notify(range(self.num_vbuckets))
        return change.scope_id

    def create_collection(self, scope: str, name: str, *, history: bool | None = None) -> int:
        """Create a collection in a scope; returns its id.

        `history` None takes the bucket's setting (`history_collections`, else
        `history_collection_default`); history needs a magma bucket.
        """
        with self.condition:
            keeps_history = self._collection_history(f"{scope}.{name}", history)
            (change,) = self._manifest.create_collection(scope, name, history=keeps_history)
            assert change.collection_id is not None
            if keeps_history:
                self._history_ids.add(change.collection_id)
            self._apply_manifest((change,))
        self._notify(range(self.num_vbuckets))
        return change.collection_id

    def drop_collection(self, scope: str, name: str) -> None:
        """Drop a collection: its documents are gone, consumers get a COLLECTION_DROPPED."""
        with self.condition:
            self._apply_manifest(self._manifest.drop_collection(scope, name))
        self._notify(range(self.num_vbuckets))

    def drop_scope(self, name: str) -> None:
        """Drop a scope and all its collections."""
        with self.condition:
            self._apply_manifest(self._manifest.drop_scope(name))
        self._notify(range(self.num_vbuckets))

    # -- operations on the cluster ------------------------------------------------------

    def lose_history(self, vbucket: int, lose_last: int) -> FailoverLog:
        """Forget a vbucket's last `lose_last` items and keep its uuid (a broken producer);
        returns its failover log, unchanged."""
        return self._rewind(vbucket, lambda vb: vb.lose_history(lose_last))

    def failover(self, vbucket: int, lose_last: int) -> FailoverLog:
        """Fail a vbucket over to a replica that lacked its last `lose_last` items.

        Returns the new failover log.
        """
        return self._rewind(vbucket, lambda vb: vb.failover(lose_last))

    def _rewind(self, vbucket: int, rewind: Callable[[VBucket], object]) -> FailoverLog:
        """Take a vbucket's history back with `rewind`; manifest changes it lost are written
        again right after (as ns_server pushes the manifest to a new active)."""
        with self.condition:
            vb = self.vbucket(vbucket)
            rewind(vb)
            missing = self._manifest.changes[vb.manifest_events_applied :]
            vb.apply_manifest_changes(missing)
            log = vb.failover_log()
        self._notify((vbucket,))
        return log

    def purge_tombstones(self, vbucket: int, up_to: int | None = None) -> int:
        """Purge a vbucket's tombstones up to a seqno (default: all); returns the purge seqno."""
        with self.condition:
            purge_seqno = self.vbucket(vbucket).purge_tombstones(up_to)
        self._notify((vbucket,))
        return purge_seqno

    def run_expiry_pager(self, now: int | None = None) -> int:
        """Expire every document whose expiry is at or before `now` (default: the clock).

        Returns how many were expired; each vbucket writes its expirations as one batch.
        """
        if now is None:
            now = self._clock_ns() // 1_000_000_000
        with self.condition:
            expired = {vb.vbucket: len(vb.run_expiry_pager(now)) for vb in self._vbuckets}
        changed = [vb for vb, count in expired.items() if count]
        self._notify(changed)
        return sum(expired.values())

    def evict_checkpoints(self, vbucket: int | None = None) -> None:
        """Expel in-memory checkpoints (all vbuckets by default): streams behind backfill."""
        with self.condition:
            targets = self._vbuckets if vbucket is None else (self.vbucket(vbucket),)
            for vb in targets:
                vb.evict_checkpoints()

    # -- notification -------------------------------------------------------------------

    def add_change_listener(self, listener: ChangeListener) -> Callable[[], None]:
        """Call `listener(vbuckets)` after each change; returns a function that unregisters it.

        Listeners run on the writer's thread, outside the lock; an asyncio server would hand
        the call over with `loop.call_soon_threadsafe`.
        """
        with self.condition:
            self._listeners.append(listener)

        def remove() -> None:
            with self.condition:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def _notify(self, vbuckets: Iterable[int]) -> None:
        changed = frozenset(vbuckets)
        if not changed:
            return
        with self.condition:
            listeners = tuple(self._listeners)
        for listener in listeners:
            listener(changed)

    # -- internals ----------------------------------------------------------------------

    def _apply_manifest(self, changes: Sequence[ManifestChange]) -> None:
        # kv_engine writes every manifest change into every vbucket's history.
        for vb in self._vbuckets:
            vb.apply_manifest_changes(changes)

    def _collection_history(self, path: str, history: bool | None) -> bool:
        if history is None:
            history = path in self._history_paths or self.history_collection_default
        if history and not self.can_retain_history:
            raise ValueError(f"collection {path}: history needs a magma bucket")
        return history

    def _document_write(self, op: BucketOp, collection_ids: dict[str, int]) -> DocumentWrite:
        collection_id = collection_ids.get(op.collection)
        if collection_id is None:
            collection_id = self._manifest.collection(op.collection).collection_id
            collection_ids[op.collection] = collection_id
        key = _key_bytes(op.key)
        if isinstance(op, Upsert):
            value, is_json = _value_bytes(op.value, op.is_json)
            xattrs = tuple(sorted(op.xattrs.items())) if op.xattrs else ()
            return DocumentWrite(
                WriteKind.UPSERT, collection_id, key, value, is_json, op.flags, op.expiry, xattrs
            )
        if isinstance(op, Delete):
            return DocumentWrite(WriteKind.DELETE, collection_id, key)
        if isinstance(op, Touch):
            return DocumentWrite(WriteKind.TOUCH, collection_id, key, expiry=op.expiry)
        return DocumentWrite(WriteKind.EXPIRE, collection_id, key)

    def _record(self, item: Mutation) -> DocumentRecord:
        return DocumentRecord(
            key=item.key,
            collection=self._manifest.collection_by_id(item.collection_id).path,
            collection_id=item.collection_id,
            vbucket=item.vbucket,
            seqno=item.by_seqno,
            rev_seqno=item.rev_seqno,
            cas=item.cas,
            flags=item.flags,
            expiry=item.expiration,
            value=item.value,
            is_json=item.is_json,
            xattrs=item.xattrs,
        )


def _collection_path(path: str) -> str:
    scope, collection = split_collection_path(path)
    return f"{scope}.{collection}"


def _key_bytes(key: bytes | str) -> bytes:
    encoded = key.encode() if isinstance(key, str) else key
    if not 0 < len(encoded) <= 250:
        raise ValueError(f"a document key is 1 to 250 bytes, got {len(encoded)}: {encoded!r:.60}")
    return encoded


def _value_bytes(value: DocumentValue, is_json: bool) -> tuple[bytes, bool]:
    if isinstance(value, bytes):
        return value, is_json
    if isinstance(value, str):
        return value.encode(), is_json
    return json.dumps(value, separators=(",", ":")).encode(), True
