"""The simulated Couchbase bucket: vbuckets and collections behind the API tests drive.

Tests write documents, change collections, fail vbuckets over, purge tombstones and run the
expiry pager; the embedded DCP server serves the same bucket through `StreamCursor`s. One lock
(a `threading.Condition`) guards it all; the server waits on it, or registers a listener that
is called with the changed vbuckets after each change, outside the lock.

>>> bucket = SimBucket("travel", num_vbuckets=16, seed=7)
>>> mutation = bucket.upsert("airline_10", {"name": "40-Mile Air"})
>>> [record.key for record in bucket.documents()]
[b'airline_10']
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from replicator.dcp.events import Deletion, Expiration, Mutation
from replicator.dcp.positions import FailoverLog
from replicator.sim.collections import (
    DEFAULT_COLLECTION_PATH,
    CollectionsManifest,
    ManifestChange,
)
from replicator.sim.vbmap import vbucket_for_key
from replicator.sim.vbucket import (
    DEFAULT_CHECKPOINT_MAX_ITEMS,
    DocumentWrite,
    HistoryItem,
    VBucket,
    WriteKind,
)

DocumentValue = bytes | str | Mapping[str, object]
"""A document body: bytes as they are, str as UTF-8, a mapping as compact JSON."""

ChangeListener = Callable[[frozenset[int]], None]
"""Called with the vbuckets that changed, after the bucket's lock is released."""


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
    streams further behind are backfilled from "disk".
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
    ) -> None:
        if not name:
            raise ValueError("a bucket needs a name")
        if not 0 < num_vbuckets <= 0x10000:
            raise ValueError(f"num_vbuckets must be in 1..65536, got {num_vbuckets}")
        self.name = name
        self.num_vbuckets = num_vbuckets
        self.condition = threading.Condition(threading.RLock())
        self._clock_ns = clock_ns
        self._rng = random.Random(seed)
        self._manifest = CollectionsManifest()
        self._listeners: list[ChangeListener] = []
        self._vbuckets = tuple(
            VBucket(
                vb,
                rng=random.Random(self._rng.getrandbits(64)),
                lock=self.condition,
                may_contain_duplicates=may_contain_duplicates,
                checkpoint_max_items=checkpoint_max_items,
                clock_ns=clock_ns,
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
    def manifest(self) -> CollectionsManifest:
        """The collections manifest; change it only through the bucket's methods."""
        return self._manifest

    def manifest_json(self) -> str:
        """The GET_COLLECTIONS_MANIFEST answer."""
        with self.condition:
            return self._manifest.manifest_json()

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

    def create_collection(self, scope: str, name: str) -> int:
        """Create a collection in a scope; returns its id."""
        with self.condition:
            (change,) = self._manifest.create_collection(scope, name)
            self._apply_manifest((change,))
        self._notify(range(self.num_vbuckets))
        assert change.collection_id is not None
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
