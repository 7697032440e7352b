"""Delta deletion vectors: the rows of a data file that no longer belong to the table.

A steady commit that replaces or deletes rows can mark their positions in the files holding
them instead of rewriting those files (what Spark's MERGE does with deletion vectors on). This
module reads and writes the vectors in Delta's format (PROTOCOL.md, "Deletion Vector Format"):

- a vector is a set of row positions, serialised as Delta's RoaringBitmapArray: a magic number
  (1681511377, little-endian) and a 64-bit Roaring bitmap in the portable format
  (`pyroaring.BitMap64`), which Spark's own vectors may fill with any container kind;
- on disk, a file holds a format byte (1) and one or more vectors, each as its size and a CRC-32
  of its bytes (both big-endian) around the bytes; a descriptor names the file (storage `u`: a
  UUID in Z85 beside the table's root, after an optional prefix directory; `p`: an absolute
  path), the vector's offset in it, its size and its cardinality;
- storage `i` holds the bytes in the descriptor itself, Z85-encoded.
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyroaring import BitMap64

from replicator.delta.paths import local_path

MAGIC = 1681511377
"""Delta's marker of a RoaringBitmapArray in the portable 64-bit format."""

FILE_FORMAT = 1
"""The one version of Delta's deletion-vector file format."""

UUID_STORAGE, INLINE_STORAGE, PATH_STORAGE = "u", "i", "p"

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUES = {char: value for value, char in enumerate(_Z85)}
_UUID_CHARS = 20
"""A UUID's 16 bytes in Z85."""


class DeletionVectorError(ValueError):
    """A deletion vector that cannot be read as Delta's format says it is."""


@dataclass(frozen=True, slots=True)
class DeletionVectorDescriptor:
    """Where one data file's deletion vector is, as an add or remove action names it."""

    storage_type: str
    path_or_inline_dv: str
    size_in_bytes: int
    cardinality: int
    offset: int | None = None

    @classmethod
    def from_json(cls, action: Mapping[str, Any]) -> DeletionVectorDescriptor:
        """The descriptor of an action's `deletionVector` object."""
        storage = action["storageType"]
        if storage not in (UUID_STORAGE, INLINE_STORAGE, PATH_STORAGE):
            raise DeletionVectorError(f"unknown deletion vector storage type {storage!r}")
        offset = action.get("offset")
        return cls(
            storage, action["pathOrInlineDv"], int(action["sizeInBytes"]),
            int(action["cardinality"]), None if offset is None else int(offset),
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """The action's `deletionVector` object (no offset for an inline vector)."""
        document: dict[str, Any] = {
            "storageType": self.storage_type,
            "pathOrInlineDv": self.path_or_inline_dv,
            "sizeInBytes": self.size_in_bytes,
            "cardinality": self.cardinality,
        }
        if self.offset is not None:
            document["offset"] = self.offset
        return document

    @property
    def unique_id(self) -> str:
        """Identifies the vector among a table's: the same file and offset is the same vector."""
        if self.offset is None:
            return f"{self.storage_type}{self.path_or_inline_dv}"
        return f"{self.storage_type}{self.path_or_inline_dv}@{self.offset}"

    def file_path(self, table_root: str) -> str:
        """The local path of the file holding this vector (not for an inline one)."""
        if self.storage_type == UUID_STORAGE:
            prefix = self.path_or_inline_dv[:-_UUID_CHARS]
            name = uuid.UUID(bytes=z85_decode(self.path_or_inline_dv[-_UUID_CHARS:]))
            return os.path.join(local_path(table_root), prefix, f"deletion_vector_{name}.bin")
        if self.storage_type == PATH_STORAGE:
            return local_path(self.path_or_inline_dv)
        raise DeletionVectorError("an inline deletion vector is in no file")


def z85_encode(data: bytes) -> str:
    """Z85 (ZeroMQ's base 85) of `data`, whose length must be a multiple of 4."""
    if len(data) % 4:
        raise ValueError(f"Z85 encodes whole 4-byte words; got {len(data)} bytes")
    out: list[str] = []
    for start in range(0, len(data), 4):
        number = int.from_bytes(data[start : start + 4], "big")
        word = []
        for _ in range(5):
            number, digit = divmod(number, 85)
            word.append(_Z85[digit])
        out.extend(reversed(word))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    """The bytes `text` (a multiple of 5 Z85 characters) encodes."""
    if len(text) % 5:
        raise DeletionVectorError(f"Z85 text is whole 5-character words; got {len(text)}")
    out = bytearray()
    for start in range(0, len(text), 5):
        number = 0
        for char in text[start : start + 5]:
            value = _Z85_VALUES.get(char)
            if value is None:
                raise DeletionVectorError(f"{char!r} is not a Z85 character")
            number = number * 85 + value
        out += number.to_bytes(4, "big")
    return bytes(out)


def encode_positions(positions: Iterable[int]) -> tuple[bytes, int]:
    """Row positions as Delta's RoaringBitmapArray, and how many there are."""
    bitmap = BitMap64(positions)
    return struct.pack("<i", MAGIC) + bitmap.serialize(), len(bitmap)


def decode_positions(data: bytes) -> BitMap64:
    """The row positions of a RoaringBitmapArray."""
    if len(data) < 4 or struct.unpack_from("<i", data)[0] != MAGIC:
        raise DeletionVectorError("not a deletion vector: its magic number is wrong")
    return BitMap64.deserialize(data[4:])


def position_array(positions: BitMap64) -> np.ndarray:
    """`positions` as an ascending int64 array (Arrow's and Parquet's row indices).

    >>> position_array(BitMap64([7, 2])).tolist()
    [2, 7]
    """
    return np.frombuffer(positions.to_array(), np.uint64).astype(np.int64)


def read_positions(table_root: str, descriptor: DeletionVectorDescriptor) -> BitMap64:
    """The row positions `descriptor` marks deleted, checked against its size, checksum and
    cardinality."""
    if descriptor.storage_type == INLINE_STORAGE:
        data = z85_decode(descriptor.path_or_inline_dv)[: descriptor.size_in_bytes]
    else:
        path = descriptor.file_path(table_root)
        with open(path, "rb") as source:
            source.seek(descriptor.offset or 1)
            header = source.read(4)
            if len(header) < 4:
                raise DeletionVectorError(f"{path} ends before its vector at {descriptor.offset}")
            (size,) = struct.unpack(">i", header)
            if size != descriptor.size_in_bytes:
                raise DeletionVectorError(
                    f"{path}: the vector at {descriptor.offset} has {size} bytes, "
                    f"its descriptor says {descriptor.size_in_bytes}"
                )
            data = source.read(size)
            (checksum,) = struct.unpack(">I", source.read(4))
        if zlib.crc32(data) != checksum:
            raise DeletionVectorError(f"{path}: the vector at {descriptor.offset} fails its CRC")
    positions = decode_positions(data)
    if len(positions) != descriptor.cardinality:
        raise DeletionVectorError(
            f"a deletion vector holds {len(positions)} rows, its descriptor says "
            f"{descriptor.cardinality}"
        )
    return positions


def write_vectors(
    table_root: str, vectors: Sequence[Iterable[int]]
) -> list[DeletionVectorDescriptor]:
    """Write `vectors` (row positions each) into one new file beside the table's data, and
    return their descriptors in the same order. The file is written whole and flushed before
    any log entry can name it; one no commit names is only unreferenced."""
    name = uuid.uuid4()
    payload = bytearray(struct.pack("B", FILE_FORMAT))
    descriptors = []
    for positions in vectors:
        data, cardinality = encode_positions(positions)
        offset = len(payload)
        payload += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
        descriptors.append(DeletionVectorDescriptor(
            UUID_STORAGE, z85_encode(name.bytes), len(data), cardinality, offset
        ))  # fmt: skip
    path = os.path.join(local_path(table_root), f"deletion_vector_{name}.bin")
    with open(path, "xb") as out:
        out.write(payload)
        out.flush()
        os.fsync(out.fileno())
    return descriptors

