"""Realistic JSON documents and a steady write mix for the simulated bucket.

Four document types live in three scopes (`app.users`, `app.orders`, `catalog.products`, and
events in `_default._default`). Everything is deterministic from a seed (and, for expiry times,
the clock given). Bodies come from per-type templates padded to the requested size, so a 1M
document load costs little per document.

>>> from replicator.sim.bucket import SimBucket
>>> bucket = SimBucket("shop", num_vbuckets=8, seed=1)
>>> workload = initial_load(bucket, docs=100, doc_size=256, seed=1)
>>> len(bucket.documents())
100
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from replicator.sim.bucket import BucketOp, Delete, SimBucket, Touch, Upsert
from replicator.sim.collections import DEFAULT_SCOPE, split_collection_path

_PAD_FIELD = ',"pad":""'
_MIX_MULTIPLIER = 0x9E3779B97F4A7C15  # Fibonacci hashing: spreads serial numbers over 64 bits
_MIX_MASK = (1 << 64) - 1
_PAD_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
_CITIES = ("Oslo", "Lyon", "Porto", "Austin", "Osaka", "Quito", "Perth", "Tunis", "Riga")
_NAMES = ("Ada", "Bo", "Chen", "Dara", "Emil", "Fatou", "Goran", "Hana", "Ines", "Jon")
_STATUSES = ("new", "paid", "packed", "shipped", "delivered", "returned")
_EVENT_KINDS = ("view", "click", "search", "add_to_cart", "checkout", "logout")
_TAGS = ("eco", "sale", "new", "gift", "bulk", "premium")


@dataclass(frozen=True, slots=True)
class DocumentType:
    """A kind of document the workload writes: its key prefix and collection."""

    name: str
    collection: str


DOCUMENT_TYPES = (
    DocumentType("user", "app.users"),
    DocumentType("order", "app.orders"),
    DocumentType("product", "catalog.products"),
    DocumentType("event", "_default._default"),
)


@dataclass(frozen=True, slots=True)
class WorkloadMix:
    """Relative weights of the operations `Workload.next_batch` produces.

    Updates, deletes and expiries need live documents; without any, an insert is made instead.
    """

    inserts: float = 0.4
    updates: float = 0.45
    deletes: float = 0.1
    expiries: float = 0.05

    def __post_init__(self) -> None:
        weights = (self.inserts, self.updates, self.deletes, self.expiries)
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"workload weights must be >= 0 with a positive sum, got {weights}")


@dataclass(frozen=True, slots=True)
class WorkloadReport:
    """What `run_workload` did."""

    ops: int
    batches: int
    expired: int
    elapsed_s: float


class Workload:
    """A deterministic stream of document writes that knows which documents it left alive.

    `expiry_ttl_s` bounds the time-to-live that expiry operations set (relative to `clock`).
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        mix: WorkloadMix | None = None,
        doc_size: int = 1024,
        expiry_ttl_s: tuple[int, int] = (1, 5),
        clock: Callable[[], float] = time.time,
    ) -> None:
        if doc_size < 1:
            raise ValueError(f"doc_size must be positive, got {doc_size}")
        low, high = expiry_ttl_s
        if not 0 < low <= high:
            raise ValueError(f"expiry_ttl_s must be (low, high) with 0 < low <= high: {low, high}")
        self.doc_size = doc_size
        self.mix = mix if mix is not None else WorkloadMix()
        self._rng = random.Random(seed)
        self._ttl = expiry_ttl_s
        self._clock = clock
        self._counters = [0] * len(DOCUMENT_TYPES)
        self._live: list[tuple[int, int]] = []  # (document type index, document number)
        self._pad = "".join(self._rng.choice(_PAD_ALPHABET) for _ in range(max(doc_size, 64)))
        self._serial = 0
        self._salt = self._rng.getrandbits(64)

    @property
    def live_documents(self) -> int:
        """How many documents this workload has created and not yet deleted or expired."""
        return len(self._live)

    def ensure_collections(self, bucket: SimBucket) -> None:
        """Create the scopes and collections the document types use, if missing."""
        live = {c.path for c in bucket.manifest.collections()}
        scopes = {s.name for s in bucket.manifest.scopes()}
        for doc_type in DOCUMENT_TYPES:
            scope, name = split_collection_path(doc_type.collection)
            if scope not in scopes and scope != DEFAULT_SCOPE:
                bucket.create_scope(scope)
                scopes.add(scope)
            if doc_type.collection not in live:
                bucket.create_collection(scope, name)
                live.add(doc_type.collection)

    def inserts(self, n: int) -> list[BucketOp]:
        """`n` new documents, the types in turn."""
        return [self._insert() for _ in range(n)]

    def next_batch(self, n: int) -> list[BucketOp]:
        """`n` operations drawn from the mix (the same seed gives the same operations)."""
        mix = self.mix
        total = mix.inserts + mix.updates + mix.deletes + mix.expiries
        update_at = mix.inserts / total
        delete_at = update_at + mix.updates / total
        expire_at = delete_at + mix.deletes / total
        ops: list[BucketOp] = []
        rng = self._rng
        for _ in range(n):
            draw = rng.random()
            if draw < update_at or not self._live:
                ops.append(self._insert())
            elif draw < delete_at:
                type_index, number = self._live[rng.randrange(len(self._live))]
                ops.append(self._upsert(type_index, number))
            else:
                type_index, number = self._take_live()
                doc_type = DOCUMENT_TYPES[type_index]
                key = _key(doc_type, number)
                if draw < expire_at:
                    ops.append(Delete(key, doc_type.collection))
                else:
                    expiry = int(self._clock()) + rng.randint(*self._ttl)
                    ops.append(Touch(key, expiry, doc_type.collection))
        return ops

    def _insert(self) -> Upsert:
        type_index = sum(self._counters) % len(DOCUMENT_TYPES)
        number = self._counters[type_index]
        self._counters[type_index] += 1
        self._live.append((type_index, number))
        return self._upsert(type_index, number)

    def _take_live(self) -> tuple[int, int]:
        # Swap-remove: O(1), and still deterministic.
        live = self._live
        index = self._rng.randrange(len(live))
        live[index], live[-1] = live[-1], live[index]
        return live.pop()

    def _upsert(self, type_index: int, number: int) -> Upsert:
        doc_type = DOCUMENT_TYPES[type_index]
        self._serial += 1
        bits = (self._salt ^ self._serial) * _MIX_MULTIPLIER & _MIX_MASK
        body = _BODIES[type_index](bits, number, self._serial)
        room = self.doc_size - len(body) - len(_PAD_FIELD)
        if room > 0:
            if room > len(self._pad):
                self._pad = self._pad * (room // len(self._pad) + 1)
            body = f'{body[:-1]},"pad":"{self._pad[:room]}"}}'
        return Upsert(_key(doc_type, number), body.encode(), doc_type.collection)


def _key(doc_type: DocumentType, number: int) -> str:
    return f"{doc_type.name}::{number:08d}"


def _pick(options: tuple[str, ...], bits: int) -> str:
    return options[bits % len(options)]


# Field values are derived from a per-write hash instead of the random generator: as
# deterministic, and several times cheaper per document, which matters for 1M-document loads.


def _user(bits: int, number: int, serial: int) -> str:
    name = _pick(_NAMES, bits)
    return (
        f'{{"type":"user","id":{number},"name":"{name} {number}",'
        f'"email":"{name.lower()}.{number}@example.com","age":{18 + (bits >> 8) % 72},'
        f'"city":"{_pick(_CITIES, bits >> 16)}","version":{serial}}}'
    )


def _order(bits: int, number: int, serial: int) -> str:
    return (
        f'{{"type":"order","id":{number},"user":"user::{(bits >> 4) % 1_000_000:08d}",'
        f'"lines":{1 + (bits >> 24) % 9},"total":{(100 + (bits >> 28) % 99_900) / 100},'
        f'"status":"{_pick(_STATUSES, bits >> 44)}","version":{serial}}}'
    )


def _product(bits: int, number: int, serial: int) -> str:
    return (
        f'{{"type":"product","sku":"SKU-{number:06d}","name":"Item {number}",'
        f'"price":{(99 + (bits >> 4) % 49_900) / 100},"stock":{(bits >> 20) % 500},'
        f'"tags":["{_pick(_TAGS, bits >> 32)}"],"version":{serial}}}'
    )


def _event(bits: int, number: int, serial: int) -> str:
    return (
        f'{{"type":"event","id":{number},"kind":"{_pick(_EVENT_KINDS, bits)}",'
        f'"session":{bits >> 16 & 0xFFFFFFFF},"ts":{1_700_000_000 + serial},"version":{serial}}}'
    )


_BODIES: tuple[Callable[[int, int, int], str], ...] = (_user, _order, _product, _event)


def initial_load(
    bucket: SimBucket,
    docs: int,
    doc_size: int,
    *,
    seed: int = 0,
    mix: WorkloadMix | None = None,
    batch_size: int = 10_000,
    evict_checkpoints: bool = True,
) -> Workload:
    """Create the collections and `docs` documents of about `doc_size` bytes each.

    With `evict_checkpoints`, the load ends up "on disk" as after a real bulk load, so a new
    stream backfills it. Returns the workload, which knows the live documents, to go on with.
    """
    if docs < 0:
        raise ValueError(f"docs must not be negative, got {docs}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    workload = Workload(seed=seed, mix=mix, doc_size=doc_size)
    workload.ensure_collections(bucket)
    for done in range(0, docs, batch_size):
        bucket.apply_batch(workload.inserts(min(batch_size, docs - done)))
    if evict_checkpoints:
        bucket.evict_checkpoints()
    return workload


LIVE_APPLIES_PER_SECOND = 50
"""How often `run_workload` applies a batch by default, whatever the rate: each apply takes the
bucket's lock and wakes every stream, so a fast workload writes larger batches, not more."""


def live_batch_size(rate_per_s: float) -> int:
    """The default batch of `run_workload` at `rate_per_s`: about rate / 50, at least 1.

    >>> live_batch_size(20_000), live_batch_size(200), live_batch_size(10)
    (400, 4, 1)
    """
    return max(1, round(rate_per_s / LIVE_APPLIES_PER_SECOND))


def run_workload(
    bucket: SimBucket,
    rate_per_s: float,
    *,
    workload: Workload | None = None,
    duration_s: float | None = None,
    stop_event: threading.Event | None = None,
    batch_size: int | None = None,
    pager_interval_s: float = 1.0,
) -> WorkloadReport:
    """Apply the workload's mix at `rate_per_s` operations a second, in real time.

    Operations are applied `batch_size` at a time once that many are due (default
    `live_batch_size(rate_per_s)`, about 50 applies a second). Stops after `duration_s`
    (applying what is due by then) or when `stop_event` is set, whichever comes first (at
    least one must be given). Runs the expiry pager every `pager_interval_s`. Meant for a
    thread.
    """
    if rate_per_s <= 0:
        raise ValueError(f"rate_per_s must be positive, got {rate_per_s}")
    if duration_s is None and stop_event is None:
        raise ValueError("give duration_s or stop_event, or the workload never stops")
    if batch_size is None:
        batch_size = live_batch_size(rate_per_s)
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if workload is None:
        workload = Workload()
        workload.ensure_collections(bucket)
    stop = stop_event if stop_event is not None else threading.Event()
    started = time.monotonic()
    deadline = None if duration_s is None else started + duration_s
    next_pager = started + pager_interval_s
    ops = batches = expired = 0
    while not stop.is_set():
        now = time.monotonic()
        ended = False
        if deadline is not None and now >= deadline:
            ended = True
            now = deadline  # what was due by the deadline, not what came due since
        if now >= next_pager and not ended:
            expired += bucket.run_expiry_pager()
            next_pager = now + pager_interval_s
        due = int((now - started) * rate_per_s) - ops
        if due >= batch_size or (ended and due > 0):
            count = min(due, batch_size)
            bucket.apply_batch(workload.next_batch(count))
            ops += count
            batches += 1
            continue
        if ended:
            break
        # Pacing: sleep until a whole batch is due, waking at once if asked to stop.
        wake = started + (ops + batch_size) / rate_per_s
        for limit in (deadline, next_pager):
            if limit is not None:
                wake = min(wake, limit)
        stop.wait(max(0.0, wake - now))
    return WorkloadReport(ops, batches, expired, time.monotonic() - started)
