"""Staged change rows: the Arrow schema and the fast conversion of DCP items into rows.

Just over 500 lines on purpose: the two conversions (of columnar runs and of single events)
must build the same rows, so they stay side by side.

One row per document change. Mutations become upserts; deletions, expirations and mutations
whose expiry has already passed become deletes. System events and SEQNO_ADVANCED produce no row
(they still move the vbucket's position, which the snapshot carries). Rows are built column by
column in Python lists and turned into one RecordBatch per chunk: this runs once per document.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replicator.dcp.protocol.events import (
    DELETION_OPCODE,
    EXPIRATION_OPCODE,
    MUTATION_OPCODE,
    Deletion,
    DocumentChanges,
    Expiration,
    ItemEvent,
    Mutation,
    SeqnoAdvanced,
    SystemEvent,
)
from replicator.errors import ProtocolError
from replicator.staging.collections import (
    CollectionLearner,
    CollectionNames,
    default_collection_names,
)

UPSERT = "upsert"
"""`op` of a row that writes the document."""
DELETE = "delete"
"""`op` of a row that removes the document (deleted, expired, or already past its expiry)."""

_MAX_INT64 = 2**63 - 1

_Change = Mutation | Deletion | Expiration

CHANGE_SCHEMA = pa.schema(
    [
        pa.field("vbucket", pa.int32(), nullable=False),
        pa.field("scope", pa.string(), nullable=False),
        pa.field("collection", pa.string(), nullable=False),
        pa.field("collection_id", pa.int64(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("seqno", pa.int64(), nullable=False),
        pa.field("rev_seqno", pa.int64(), nullable=False),
        pa.field("cas", pa.int64(), nullable=False),
        pa.field("flags", pa.int64()),
        pa.field("expiry", pa.timestamp("us", tz="UTC")),
        pa.field("op", pa.string(), nullable=False),
        pa.field("is_json", pa.bool_(), nullable=False),
        pa.field("doc", pa.string()),
        pa.field("value", pa.binary()),
        pa.field("xattrs", pa.string()),
    ]
)
"""Schema of a staged change row (and of spill files).

`flags` and `expiry` are null for deletions and expirations; `expiry` is null when the document
never expires. `doc` holds JSON bodies, `value` other bodies; both are null on deletes.
`xattrs` is a JSON object of the document's extended attributes, null when it has none.
"""

DOCUMENT = ("vbucket", "collection_id", "key")
"""The columns that name one document of the mirror (the same key in another collection or
vbucket is another document)."""


class ChangeRowConverter:
    """Turns a chunk of one stream's items into a RecordBatch of CHANGE_SCHEMA rows.

    `now` gives unix seconds; it is read once per chunk to decide which mutations have already
    expired. System events are passed to `collection_names` when it can learn from them, in
    stream order, so a collection created in a chunk names that chunk's later rows.
    """

    def __init__(
        self,
        collection_names: CollectionNames = default_collection_names,
        *,
        now: Callable[[], float] = time.time,
    ) -> None:
        self._names = collection_names
        self._learner = (
            collection_names if isinstance(collection_names, CollectionLearner) else None
        )
        self._now = now

    def convert(self, items: Iterable[ItemEvent | DocumentChanges]) -> pa.RecordBatch:
        """Rows for the document changes among `items` (in order); ProtocolError on bad input.

        Columnar runs (`DocumentChanges`) are converted column by column, several runs at once;
        typed events one by one. A system event between them is learned in its place.
        """
        now = self._now()
        names_cache: dict[int, tuple[str, str]] = {}
        segments: list[pa.RecordBatch] = []
        events: list[ItemEvent] = []
        runs: list[DocumentChanges] = []
        for item in items:
            if type(item) is DocumentChanges:
                if events:
                    segments.append(self._convert_events(events, now, names_cache))
                    events = []
                runs.append(item)
                continue
            if runs:
                segments.append(self._convert_runs(runs, now, names_cache))
                runs = []
            if type(item) is SystemEvent and self._learner is not None:
                if events:  # rows before the event use the names from before it
                    segments.append(self._convert_events(events, now, names_cache))
                    events = []
                self._learner.learn(item)
                names_cache.clear()
                continue
            events.append(cast(ItemEvent, item))
        if events:
            segments.append(self._convert_events(events, now, names_cache))
        if runs:
            segments.append(self._convert_runs(runs, now, names_cache))
        if not segments:
            return pa.RecordBatch.from_pylist([], schema=CHANGE_SCHEMA)
        if len(segments) == 1:
            return segments[0]
        return pa.concat_batches(segments)

    def _names_of(
        self, collection_id: int, names_cache: dict[int, tuple[str, str]], where: str
    ) -> tuple[str, str]:
        names = names_cache.get(collection_id)
        if names is None:
            try:
                names = self._names(collection_id)
            except LookupError as exc:
                raise ProtocolError(f"{where}: {exc}") from None
            names_cache[collection_id] = names
        return names

    def _convert_events(
        self, items: list[ItemEvent], now: float, names_cache: dict[int, tuple[str, str]]
    ) -> pa.RecordBatch:
        vbuckets: list[int] = []
        scopes: list[str] = []
        collections: list[str] = []
        collection_ids: list[int] = []
        keys: list[bytes] = []
        seqnos: list[int] = []
        rev_seqnos: list[int] = []
        cases: list[int] = []
        flags: list[int | None] = []
        expiries: list[int | None] = []
        ops: list[str] = []
        json_flags: list[bool] = []
        docs: list[bytes | None] = []
        values: list[bytes | None] = []
        xattrs: list[str | None] = []

        for item in items:
            # Exact type checks: the cheapest dispatch in a loop that runs per document.
            kind = type(item)
            if kind is SystemEvent or kind is SeqnoAdvanced:
                continue
            if kind is not Mutation and kind is not Deletion and kind is not Expiration:
                raise TypeError(f"not a DCP item: {kind.__name__}")
            change = cast(_Change, item)

            collection_id = change.collection_id
            names = names_cache.get(collection_id)
            if names is None:
                names = self._names_of(collection_id, names_cache, _where(change))
            if change.cas > _MAX_INT64:
                raise _row_error(change, f"cas {change.cas:#x} does not fit a signed 64-bit int")

            vbuckets.append(change.vbucket)
            scopes.append(names[0])
            collections.append(names[1])
            collection_ids.append(collection_id)
            keys.append(change.key)
            seqnos.append(change.by_seqno)
            rev_seqnos.append(change.rev_seqno)
            cases.append(change.cas)
            if kind is Mutation:
                mutation = cast(Mutation, change)
                expiration = mutation.expiration
                flags.append(mutation.flags)
                json_flags.append(mutation.is_json)
                if expiration:
                    expiries.append(expiration)
                    expired = expiration <= now
                else:
                    expiries.append(None)
                    expired = False
                if expired:
                    ops.append(DELETE)
                    docs.append(None)
                    values.append(None)
                elif mutation.is_json:
                    ops.append(UPSERT)
                    docs.append(mutation.value)
                    values.append(None)
                else:
                    ops.append(UPSERT)
                    docs.append(None)
                    values.append(mutation.value)
                xattrs.append(_xattrs_json(mutation.xattrs) if mutation.xattrs else None)
            else:
                flags.append(None)
                expiries.append(None)
                ops.append(DELETE)
                json_flags.append(False)
                docs.append(None)
                values.append(None)
                tombstone_xattrs = change.xattrs if isinstance(change, Deletion) else ()
                xattrs.append(_xattrs_json(tombstone_xattrs) if tombstone_xattrs else None)

        try:
            columns = [
                pa.array(vbuckets, pa.int32()),
                pa.array(scopes, pa.string()),
                pa.array(collections, pa.string()),
                pa.array(collection_ids, pa.int64()),
                _utf8_column(keys, "key", vbuckets, seqnos),
                pa.array(seqnos, pa.int64()),
                pa.array(rev_seqnos, pa.int64()),
                pa.array(cases, pa.int64()),
                pa.array(flags, pa.int64()),
                pa.array(expiries, pa.int64())
                .cast(pa.timestamp("s", tz="UTC"))
                .cast(CHANGE_SCHEMA.field("expiry").type),
                pa.array(ops, pa.string()),
                pa.array(json_flags, pa.bool_()),
                _utf8_column(docs, "JSON document", vbuckets, seqnos),
                pa.array(values, pa.binary()),
                pa.array(xattrs, pa.string()),
            ]
        except OverflowError as exc:
            raise ProtocolError(
                f"a seqno or number in the chunk does not fit 64 bits: {exc}"
            ) from exc
        return pa.RecordBatch.from_arrays(columns, schema=CHANGE_SCHEMA)

    def _convert_runs(
        self, runs: list[DocumentChanges], now: float, names_cache: dict[int, tuple[str, str]]
    ) -> pa.RecordBatch:
        """Rows of columnar runs: numpy and Arrow over all their rows at once."""
        changes = _rows_of(runs)
        vbuckets = np.repeat(
            np.fromiter((run.vbucket for run in runs), np.int32, len(runs)),
            np.fromiter((len(run) for run in runs), np.int64, len(runs)),
        )
        seqnos = _column_numpy(changes, "by_seqno")
        opcodes = _column_numpy(changes, "opcode")
        collection_ids = _column_numpy(changes, "collection_id")
        cas = _column_numpy(changes, "cas")
        rev_seqnos = _column_numpy(changes, "rev_seqno")

        too_big = np.flatnonzero(cas > _MAX_INT64)
        if too_big.size:
            i = int(too_big[0])
            raise ProtocolError(
                f"{_where_row(vbuckets, seqnos, opcodes, i)}: cas {int(cas[i]):#x} does "
                "not fit a signed 64-bit int"
            )
        for name, numbers in (("seqno", seqnos), ("rev seqno", rev_seqnos)):
            too_big = np.flatnonzero(numbers > _MAX_INT64)
            if too_big.size:
                i = int(too_big[0])
                raise ProtocolError(
                    f"{_where_row(vbuckets, seqnos, opcodes, i)}: {name} "
                    f"{int(numbers[i])} does not fit 64 bits"
                )

        unique_ids, indices = np.unique(collection_ids, return_inverse=True)
        scope_names: list[str] = []
        collection_names: list[str] = []
        for collection_id in unique_ids.tolist():
            first = int(np.flatnonzero(collection_ids == collection_id)[0])
            names = names_cache.get(collection_id) or self._names_of(
                collection_id,
                names_cache,
                _where_row(vbuckets, seqnos, opcodes, first),
            )
            scope_names.append(names[0])
            collection_names.append(names[1])
        # Arrow arrays, not numpy, for take: pyarrow converts numpy through pandas (an import).
        taken = _from_numpy(indices.astype(np.int64), pa.int64())
        scopes = pa.array(scope_names, pa.string()).take(taken)
        collections = pa.array(collection_names, pa.string()).take(taken)

        is_mutation = opcodes == MUTATION_OPCODE
        expirations = _column_numpy(changes, "expiration").astype(np.int64)
        has_expiry = is_mutation & (expirations != 0)
        is_delete = ~is_mutation | (has_expiry & (expirations <= now))
        is_upsert = ~is_delete
        is_json = _column_numpy(changes, "is_json") & is_mutation
        values = changes.column("value")
        xattrs = changes.column("xattrs")
        columns = [
            _from_numpy(vbuckets, pa.int32()),
            scopes,
            collections,
            _from_numpy(collection_ids.astype(np.int64), pa.int64()),
            _utf8_column_of(changes.column("key"), "key", vbuckets, seqnos),
            _from_numpy(seqnos.astype(np.int64), pa.int64()),
            _from_numpy(rev_seqnos.astype(np.int64), pa.int64()),
            _from_numpy(cas.astype(np.int64), pa.int64()),
            _from_numpy(_column_numpy(changes, "flags").astype(np.int64), pa.int64(), is_mutation),
            _from_numpy(expirations * 1_000_000, _EXPIRY_TYPE, has_expiry),
            _ops_column(is_delete),
            _from_numpy(is_json, pa.bool_()),
            _utf8_column_of(
                _binary_where(values, is_upsert & is_json), "JSON document", vbuckets, seqnos
            ),
            _binary_where(values, is_upsert & ~is_json),
            _xattrs_json_column(xattrs),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=CHANGE_SCHEMA)


def empty_change_table() -> pa.Table:
    """A table with CHANGE_SCHEMA and no rows."""
    return CHANGE_SCHEMA.empty_table()


def _utf8_column(
    raw: list[bytes] | list[bytes | None], what: str, vbuckets: list[int], seqnos: list[int]
) -> pa.Array:
    """Cast bytes to a string column; Arrow validates UTF-8 far faster than per-row decoding."""
    try:
        return pa.array(raw, pa.binary()).cast(pa.string())
    except pa.ArrowInvalid:
        index = _first_not_utf8(raw)
        if index is None:
            raise
        where = f"vbucket {vbuckets[index]}: seqno {seqnos[index]}"
        raise ProtocolError(f"{where}: {what} is not valid UTF-8") from None


def _first_not_utf8(values: Iterable[bytes | None]) -> int | None:
    """Where the first value that is not UTF-8 is (None: all are)."""
    for index, value in enumerate(values):
        if value is None:
            continue
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return index
    return None


_EXPIRY_TYPE = CHANGE_SCHEMA.field("expiry").type
_OP_BYTES = np.frombuffer((UPSERT + DELETE).encode(), np.uint8).reshape(2, len(UPSERT))
assert len(UPSERT) == len(DELETE)  # the op column is built as fixed-width bytes


_NUMPY_TYPES = {
    pa.uint8(): np.uint8,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
}


def _column_numpy(batch: pa.RecordBatch, name: str) -> np.ndarray:
    """A column of DOCUMENT_CHANGE_SCHEMA (no nulls) over its own buffer, without a copy (and
    without `to_numpy`, which for booleans goes through pandas)."""
    column = batch.column(name)
    first, end = column.offset, column.offset + len(column)
    if column.type == pa.bool_():
        bits = np.frombuffer(column.buffers()[1], np.uint8)
        return np.unpackbits(bits, bitorder="little")[first:end].astype(bool)
    return np.frombuffer(column.buffers()[1], _NUMPY_TYPES[column.type])[first:end]


def _validity(valid: np.ndarray | None) -> pa.Buffer | None:
    if valid is None or valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _from_numpy(
    values: np.ndarray, arrow_type: pa.DataType, valid: np.ndarray | None = None
) -> pa.Array:
    """An Arrow column over a numpy array's own buffer; null where `valid` is False."""
    if arrow_type == pa.bool_():
        data = pa.py_buffer(np.packbits(values, bitorder="little"))
    else:
        data = pa.py_buffer(np.ascontiguousarray(values))
    return pa.Array.from_buffers(arrow_type, len(values), [_validity(valid), data])


def _rows_of(runs: list[DocumentChanges]) -> pa.RecordBatch:
    """The runs' rows, in run order, in buffers of their own: one `take` over the reads' batches.

    A run is often a message or two; concatenating hundreds of one-row slices costs far more
    than gathering their rows. The copy also matters: staged rows must hold (and be counted
    as) their own bytes, not every read they came from.
    """
    bases: dict[int, int] = {}
    batches: list[pa.RecordBatch] = []
    for run in runs:
        if id(run.batch) not in bases:
            bases[id(run.batch)] = sum(batch.num_rows for batch in batches)
            batches.append(run.batch)
    lengths = np.fromiter((run.length for run in runs), np.int64, len(runs))
    starts = np.fromiter((bases[id(run.batch)] + run.offset for run in runs), np.int64, len(runs))
    firsts = np.zeros(len(runs), np.int64)
    np.cumsum(lengths[:-1], out=firsts[1:])
    indices = np.repeat(starts - firsts, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)
    source = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
    return source.take(_from_numpy(indices, pa.int64()))


def _binary_where(values: pa.Array, keep: np.ndarray) -> pa.Array:
    """The `values` where `keep`, null elsewhere: a column of its own with just those bytes
    (a null over kept bytes would carry them into every later concatenation)."""
    if not keep.any():
        return pa.nulls(len(values), pa.binary())
    if keep.all():
        return values
    return pc.if_else(_from_numpy(keep, pa.bool_()), values, pa.scalar(None, pa.binary()))


def _ops_column(is_delete: np.ndarray) -> pa.Array:
    width = _OP_BYTES.shape[1]
    data = _OP_BYTES[is_delete.astype(np.intp)].tobytes()
    offsets = np.arange(0, width * len(is_delete) + 1, width, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.string(), len(is_delete), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _xattrs_json_column(xattrs: pa.Array) -> pa.Array:
    if xattrs.null_count == len(xattrs):
        return pa.nulls(len(xattrs), pa.string())
    return pa.array(
        [
            None if pairs is None else _xattrs_json(tuple((p["name"], p["value"]) for p in pairs))
            for pairs in xattrs.to_pylist()
        ],
        pa.string(),
    )


def _utf8_column_of(
    raw: pa.Array,
    what: str,
    vbuckets: np.ndarray,
    seqnos: np.ndarray,
) -> pa.Array:
    """`raw` as a string column; ProtocolError naming the first row that is not UTF-8."""
    text = (
        raw
        if raw.type == pa.string()
        else pa.Array.from_buffers(pa.string(), len(raw), raw.buffers(), offset=raw.offset)
    )
    try:
        text.validate(full=True)
    except pa.ArrowInvalid:
        index = _first_not_utf8(raw.cast(pa.binary()).to_pylist())
        if index is None:
            raise
        where = f"vbucket {int(vbuckets[index])}: seqno {int(seqnos[index])}"
        raise ProtocolError(f"{where}: {what} is not valid UTF-8") from None
    return text


def _where_row(
    vbuckets: np.ndarray,
    seqnos: np.ndarray,
    opcodes: np.ndarray,
    index: int,
) -> str:
    kind = _KIND_NAMES.get(int(opcodes[index]), "item")
    return f"vbucket {int(vbuckets[index])}: {kind} seqno {int(seqnos[index])}"


_KIND_NAMES = {
    MUTATION_OPCODE: "Mutation",
    DELETION_OPCODE: "Deletion",
    EXPIRATION_OPCODE: "Expiration",
}


def _where(change: Mutation | Deletion | Expiration) -> str:
    return f"vbucket {change.vbucket}: {type(change).__name__} seqno {change.by_seqno}"


def _xattrs_json(xattrs: tuple[tuple[str, str], ...]) -> str:
    # Xattr values are JSON already (the server enforces it): embed them as they are.
    return "{" + ",".join(json.dumps(name) + ":" + value for name, value in xattrs) + "}"


def _row_error(change: Mutation | Deletion | Expiration, problem: str) -> ProtocolError:
    return ProtocolError(f"{_where(change)}: {problem}")


