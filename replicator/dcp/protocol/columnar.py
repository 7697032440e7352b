"""Data messages from the receive buffer straight into columns: one Arrow batch per socket read.

A bucket's stream is almost all mutations (and some deletions): building a frame object and a
frozen event per message, then taking them apart again into Arrow columns, was most of the
consumer's time. `DocumentColumns` sits inside the connection's `FrameReader`: the reader hands
it every data message (DCP_MUTATION, DCP_DELETION, DCP_EXPIRATION) as the byte range it
occupies, with the header fields it already read, and the message joins the run of its vbucket:
where its header and extras start, its key, its (decompressed) value. A run ends where that
vbucket's stream sends anything else (a snapshot marker, a stream end, a system event), so per
vbucket the order of runs and control messages is the wire order; any reply or server push ends
every run, since it may change which messages the layer above accepts. After the read,
`finish` builds one Arrow batch for all its runs and slices it into one `DocumentChanges` per
run.

The usual message (no flexible framing, full mutation extras, plain or snappy value, no
xattrs, a one-byte collection id) costs a few list appends. Anything else goes through
the codec's own decoder (`decode_dcp_message`), so the two paths cannot disagree on what is
valid: a malformed message raises the codec's ProtocolError, and the reader still hands up the
messages before it.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import cramjam
import numpy as np
import pyarrow as pa

from replicator.dcp.protocol.codec import decode_dcp_message
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures
from replicator.dcp.protocol.events import (
    DOCUMENT_CHANGE_SCHEMA,
    MUTATION_OPCODE,
    XATTRS_TYPE,
    Deletion,
    DocumentChanges,
    Expiration,
    Mutation,
    RunSummary,
)
from replicator.dcp.protocol.frame import HEADER_SIZE, Frame
from replicator.dcp.protocol.values import decompress_value_buffer

_T = TypeVar("_T")

# The 24-byte header and the 31 bytes of mutation extras of a classic-framed mutation. A run
# keeps these 55 bytes of each message as they came (a deletion or any message the codec
# decoded is re-packed in the same layout, its delete time where a mutation's expiration is),
# and `finish` reads the numeric columns out of them with numpy, all rows at once.
_MUTATION_FRAME = struct.Struct(">BBHBBHIIQQQIIIHB")
_HEAD_SIZE = _MUTATION_FRAME.size
_HEAD_DTYPE = np.dtype(
    [
        ("magic", "u1"), ("opcode", "u1"), ("key_length", ">u2"), ("extras_length", "u1"),
        ("datatype", "u1"), ("vbucket", ">u2"), ("body_length", ">u4"), ("opaque", ">u4"),
        ("cas", ">u8"), ("by_seqno", ">u8"), ("rev_seqno", ">u8"), ("flags", ">u4"),
        ("time", ">u4"), ("lock_time", ">u4"), ("nmeta", ">u2"), ("nru", "u1"),
    ]
)  # fmt: skip
assert _HEAD_DTYPE.itemsize == _HEAD_SIZE
_HEAD_OFFSETS = np.arange(_HEAD_SIZE)
_MUTATION_EXTRAS_SIZE = _HEAD_SIZE - HEADER_SIZE
_REQUEST = 0x80
_SNAPPY = 0x02
_MAX_BINARY_BYTES = 2**31 - 1  # int32 offsets
_UINT8, _UINT32, _UINT64, _BOOL, _BINARY = (
    pa.uint8(),
    pa.uint32(),
    pa.uint64(),
    pa.bool_(),
    pa.binary(),
)
_FAST_DATATYPES = frozenset({0x00, 0x01, 0x02, 0x03})  # JSON and snappy bits only


@dataclass(slots=True)
class DocumentRun:
    """One vbucket's consecutive data messages in a read, while the read is parsed."""

    vbucket: int
    opaque: int
    stream_id: int | None
    heads: list[int] = field(default_factory=list)
    """Where each row's header and extras (_HEAD_SIZE bytes) start: in the read's buffer, or
    past its end in the re-packed heads of decoded messages."""
    keys: list[bytes] = field(default_factory=list)
    values: list[bytes | cramjam.Buffer] = field(default_factory=list)
    collection_ids: list[int] = field(default_factory=list)
    xattrs: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    """Row index -> xattrs, for the few rows that have any."""
    size: int = 0
    """Wire bytes of the run's messages (what flow control counts)."""
    other_kinds: int = 0
    """Deletions and expirations among the rows."""
    changes: DocumentChanges | None = None
    """Set by `DocumentColumns.finish`."""


class DocumentColumns:
    """The columnar sink of one connection's `FrameReader` (see the module docstring)."""

    __slots__ = (
        "_buf",
        "_collections",
        "_features",
        "_max_value_size",
        "_open",
        "_repacked",
        "_runs",
    )

    def __init__(self, features: ConnectionFeatures) -> None:
        self._features = features
        self._collections = features.collections
        self._max_value_size = features.max_value_size
        self._open: dict[int, DocumentRun] = {}
        self._runs: list[DocumentRun] = []
        self._buf = b""
        self._repacked = bytearray()

    def begin(self, buf: bytes) -> None:
        """The reader parses `buf` next: positions passed to `add` are offsets into it."""
        self._buf = buf

    def add(
        self,
        buf: bytes,
        pos: int,
        frame_end: int,
        out: list[object],
        magic: int,
        opcode: int,
        key_length: int,
        extras_length: int,
        datatype: int,
        vbucket: int,
        opaque: int,
    ) -> None:
        """Take the data message at buf[pos:frame_end], its header fields already read and
        validated by the reader (`key_length` is the whole 16-bit field for classic framing).

        A new run is appended to `out` where its first message is, so it keeps its place among
        the frames the reader returns.
        """
        if (
            magic != _REQUEST
            or opcode != MUTATION_OPCODE
            or extras_length != _MUTATION_EXTRAS_SIZE
            or datatype not in _FAST_DATATYPES
        ):
            self._add_decoded(buf, pos, frame_end, out)
            return
        k = pos + _HEAD_SIZE
        v = k + key_length
        if self._collections:
            collection_id = buf[k] if k < v else 0x80
            if collection_id >= 0x80:  # a longer LEB128 id, or no key: the codec decides
                self._add_decoded(buf, pos, frame_end, out)
                return
            k += 1
        else:
            collection_id = 0
        if k == v:
            self._add_decoded(buf, pos, frame_end, out)  # an empty key: the codec refuses it
            return
        raw = buf[v:frame_end]
        value: bytes | cramjam.Buffer = raw
        if datatype & _SNAPPY:  # the codec's own decompressor: the same limit, the same errors
            value = decompress_value_buffer(raw, max_size=self._max_value_size, opcode=opcode)
        run = self._open.get(vbucket)
        if run is None or run.opaque != opaque or run.stream_id is not None:
            run = self._start(vbucket, opaque, None, out)
        run.heads.append(pos)
        run.keys.append(buf[k:v])
        run.values.append(value)
        run.collection_ids.append(collection_id)
        run.size += frame_end - pos

    def end_vbucket(self, vbucket: int) -> None:
        """Another message of the vbucket came: its next data message starts a new run."""
        self._open.pop(vbucket, None)

    def end_all(self) -> None:
        """A reply or server push came: every vbucket's next data message starts a new run."""
        self._open.clear()

    def finish(self) -> None:
        """Build the columns of the read's runs (sets each run's `changes`) and start afresh."""
        runs, self._runs = self._runs, []
        self._open.clear()
        if not runs:
            return
        data = self._buf + self._repacked if self._repacked else self._buf
        self._buf, self._repacked = b"", bytearray()  # do not keep the read's bytes alive
        positions = np.fromiter(_joined(run.heads for run in runs), np.int64)
        gathered = np.frombuffer(data, np.uint8)[positions[:, None] + _HEAD_OFFSETS]
        heads = gathered.view(_HEAD_DTYPE).reshape(-1)
        count = len(heads)
        opcodes = heads["opcode"]
        times = heads["time"]
        if any(run.other_kinds for run in runs):
            is_mutation = opcodes == MUTATION_OPCODE
            expirations = np.where(is_mutation, times, 0)
            delete_times = np.where(is_mutation, 0, times)
        else:
            expirations, delete_times = times, np.zeros(count, np.uint32)
        batch = pa.RecordBatch.from_arrays(
            [
                _numbers(opcodes, _UINT8),
                _numbers(heads["by_seqno"], _UINT64),
                _numbers(heads["rev_seqno"], _UINT64),
                _numbers(heads["cas"], _UINT64),
                _numbers(heads["flags"], _UINT32),
                _numbers(expirations, _UINT32),
                _numbers(heads["lock_time"], _UINT32),
                _numbers(delete_times, _UINT32),
                _numbers(
                    np.fromiter(_joined(run.collection_ids for run in runs), np.uint32), _UINT32
                ),
                _binary_array(_joined(run.keys for run in runs)),
                _binary_array(_joined(run.values for run in runs)),
                pa.Array.from_buffers(
                    _BOOL,
                    count,
                    [None, pa.py_buffer(np.packbits(heads["datatype"] & 1, bitorder="little"))],
                ),
                _xattrs_column(runs, count),
            ],
            schema=DOCUMENT_CHANGE_SCHEMA,
        )
        for run, summary, offset in zip(runs, *_summaries(runs, heads, batch), strict=True):
            run.changes = DocumentChanges(
                run.vbucket, batch, offset, len(run.keys), summary, run.stream_id
            )

    def _start(
        self, vbucket: int, opaque: int, stream_id: int | None, out: list[object]
    ) -> DocumentRun:
        run = DocumentRun(vbucket, opaque, stream_id)
        self._open[vbucket] = run
        self._runs.append(run)
        out.append(run)
        return run

    def _add_decoded(self, buf: bytes, pos: int, frame_end: int, out: list[object]) -> None:
        """The general path: the codec decodes the message (or raises ProtocolError)."""
        magic, opcode, key_len, ext_len, datatype, vbucket, _body, opaque, cas = _unpack_header(
            buf, pos
        )
        p = pos + HEADER_SIZE
        framing_len = 0
        if magic != _REQUEST:  # flexible framing: the key length's high byte is framing's
            framing_len, key_len = key_len >> 8, key_len & 0xFF
        k = p + framing_len + ext_len
        frame = Frame(
            magic,
            opcode,
            datatype,
            vbucket,
            opaque,
            cas,
            buf[p : p + framing_len],
            buf[p + framing_len : k],
            buf[k : k + key_len],
            buf[k + key_len : frame_end],
        )
        event = decode_dcp_message(frame, self._features)
        assert isinstance(event, Mutation | Deletion | Expiration)  # opcodes 0x57..0x59
        run = self._open.get(vbucket)
        if run is None or run.opaque != opaque or run.stream_id != event.stream_id:
            run = self._start(vbucket, opaque, event.stream_id, out)
        run.heads.append(len(self._buf) + len(self._repacked))
        if isinstance(event, Mutation):
            self._repacked += _MUTATION_FRAME.pack(
                magic, opcode, 0, 0, int(event.is_json), vbucket, 0, opaque, event.cas,
                event.by_seqno, event.rev_seqno, event.flags, event.expiration, event.lock_time,
                0, 0,
            )  # fmt: skip
            run.values.append(event.value)
        else:
            run.other_kinds += 1
            self._repacked += _MUTATION_FRAME.pack(
                magic, opcode, 0, 0, 0, vbucket, 0, opaque, event.cas,
                event.by_seqno, event.rev_seqno, 0, event.delete_time, 0, 0, 0,
            )  # fmt: skip
            run.values.append(b"")
        if not isinstance(event, Expiration) and event.xattrs:
            run.xattrs[len(run.keys)] = list(event.xattrs)
        run.keys.append(event.key)
        run.collection_ids.append(event.collection_id)
        run.size += frame_end - pos


_unpack_header = struct.Struct(">BBHBBHIIQ").unpack_from


def _joined(parts: Iterable[Sequence[_T]]) -> list[_T]:
    return list(itertools.chain.from_iterable(parts))


def _summaries(
    runs: list[DocumentRun], heads: np.ndarray, batch: pa.RecordBatch
) -> tuple[list[RunSummary], list[int]]:
    """Every run's summary and first row, with numpy over the whole read (a run is often one
    or two messages: per-run numpy calls would cost more than the messages)."""
    lengths = np.fromiter((len(run.keys) for run in runs), np.int64, len(runs))
    starts = np.zeros(len(runs), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    seqnos = heads["by_seqno"].astype(np.uint64)
    steps_down = np.zeros(len(seqnos), np.int64)
    steps_down[1:] = seqnos[1:] <= seqnos[:-1]
    steps_down[starts] = 0  # a run's first row is not compared with the run before
    data_bytes = np.zeros(len(seqnos), np.int64)
    for name in ("key", "value"):
        offsets = np.frombuffer(batch.column(name).buffers()[1], np.int32)
        data_bytes += np.diff(offsets[: len(seqnos) + 1])
    columns = (
        seqnos[starts].tolist(),
        seqnos[starts + lengths - 1].tolist(),
        np.minimum.reduceat(seqnos, starts).tolist(),
        np.maximum.reduceat(seqnos, starts).tolist(),
        (np.add.reduceat(steps_down, starts) == 0).tolist(),
        np.add.reduceat((heads["opcode"] == MUTATION_OPCODE).astype(np.int64), starts).tolist(),
        np.add.reduceat(data_bytes, starts).tolist(),
    )
    summaries = [RunSummary(*fields) for fields in zip(*columns, strict=True)]
    return summaries, starts.tolist()


def _numbers(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """An Arrow column of `values` (any byte order) in `arrow_type`'s native layout."""
    native = np.ascontiguousarray(values, arrow_type.to_pandas_dtype())
    return pa.Array.from_buffers(arrow_type, len(native), [None, pa.py_buffer(native)])


def _binary_array(parts: Sequence[bytes | cramjam.Buffer]) -> pa.Array:
    """A binary column of `parts`: one join and an offsets array (pa.array of bytes objects
    costs about a microsecond per value)."""
    offsets = np.zeros(len(parts) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, parts), np.int64, len(parts)), out=offsets[1:])
    if offsets[-1] > _MAX_BINARY_BYTES:
        return pa.array(parts, pa.binary())  # pyarrow says what does not fit
    return pa.Array.from_buffers(
        _BINARY,
        len(parts),
        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(parts))],
    )


def _xattrs_column(runs: list[DocumentRun], count: int) -> pa.Array:
    if not any(run.xattrs for run in runs):
        return pa.nulls(count, XATTRS_TYPE)
    values: list[list[tuple[str, str]] | None] = []
    for run in runs:
        values.extend(run.xattrs.get(index) for index in range(len(run.keys)))
    return pa.array(values, XATTRS_TYPE)
