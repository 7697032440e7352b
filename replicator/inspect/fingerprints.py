"""What `replicator verify` compares: a document's fingerprint, and digests of many of them.

Both sides fingerprint a live document the same way, from the same columns: the source's change
rows and the mirror's rows in Python (`row_fingerprint`, through `RowColumns`), or the mirror's
in Spark (`fingerprint_column`, its twin). A vbucket's documents reduce to an order-independent
`ContentDigest`, so equal vbuckets are found without collecting their rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column

_FIELD_SEPARATOR = "\x1f"
_FINGERPRINT_HEX_DIGITS = 15
"""60 bits of the md5: fits a signed 64-bit Spark long, so both sides compute the same value."""
SUM_SHIFT = 28
"""The digest sums the top 32 bits of each fingerprint: no overflow below 2**31 documents."""


def row_fingerprint(
    collection_id: int,
    key: str,
    seqno: int,
    cas: int,
    body: bytes,
    flags: int,
    expiry_s: int,
    is_json: bool,
    xattrs: str | None,
) -> int:
    """A 60-bit fingerprint of one live document, as `fingerprint_column` computes it in Spark.

    Covers (collection_id, key, seqno, cas, md5 of the body, flags, expiry, is_json, md5 of the
    xattrs). The key is length-prefixed so no two rows share a canonical text.
    """
    canonical = _FIELD_SEPARATOR.join(
        (
            str(collection_id),
            str(len(key.encode())),
            key,
            str(seqno),
            str(cas),
            hashlib.md5(body).hexdigest(),
            str(flags),
            str(expiry_s),
            "1" if is_json else "0",
            hashlib.md5(xattrs.encode()).hexdigest() if xattrs is not None else "",
        )
    )
    return int(hashlib.md5(canonical.encode()).hexdigest()[:_FINGERPRINT_HEX_DIGITS], 16)


def fingerprint_column() -> Column:
    """Spark twin of `row_fingerprint` over the mirror's data columns."""
    from pyspark.sql import functions as F

    body = F.coalesce(F.col("doc").cast("binary"), F.col("value"), F.expr("X''"))
    canonical = F.concat_ws(
        _FIELD_SEPARATOR,
        F.col("collection_id").cast("string"),
        F.octet_length("key").cast("string"),
        F.col("key"),
        F.col("seqno").cast("string"),
        F.col("cas").cast("string"),
        F.md5(body),
        F.coalesce(F.col("flags"), F.lit(0)).cast("string"),
        F.coalesce(F.unix_seconds("expiry"), F.lit(0)).cast("string"),
        F.col("is_json").cast("int").cast("string"),
        F.coalesce(F.md5(F.col("xattrs").cast("binary")), F.lit("")),
    )
    return F.conv(
        F.substring(F.md5(canonical.cast("binary")), 1, _FINGERPRINT_HEX_DIGITS), 16, 10
    ).cast("long")


@dataclass(frozen=True, slots=True)
class ContentDigest:
    """Order-independent summary of a set of fingerprints: count, xor and a sum of high bits."""

    count: int = 0
    xor: int = 0
    high_sum: int = 0

    @classmethod
    def of(cls, fingerprints: Iterable[int]) -> ContentDigest:
        count = xor = high_sum = 0
        for fingerprint in fingerprints:
            count += 1
            xor ^= fingerprint
            high_sum += fingerprint >> SUM_SHIFT
        return cls(count, xor, high_sum)


@dataclass(frozen=True, slots=True)
class RowColumns:
    """A batch of change rows (a mirror's or the converter's) as Python lists, by column."""

    collection_id: list[int]
    key: list[str]
    seqno: list[int]
    cas: list[int]
    flags: list[int | None]
    expiry_us: list[int | None]
    is_json: list[bool]
    doc: list[str | None]
    value: list[bytes | None]
    xattrs: list[str | None]
    scope: list[str]
    collection: list[str]
    op: list[str | None]

    @classmethod
    def of(cls, rows: pa.RecordBatch | pa.Table) -> RowColumns:
        import pyarrow as pa

        def column(name: str) -> list[Any]:
            index = rows.schema.get_field_index(name)
            return rows.column(index).to_pylist() if index >= 0 else [None] * rows.num_rows

        expiry = rows.column(rows.schema.get_field_index("expiry")).cast(pa.int64())
        return cls(
            collection_id=column("collection_id"), key=column("key"), seqno=column("seqno"),
            cas=column("cas"), flags=column("flags"), expiry_us=expiry.to_pylist(),
            is_json=column("is_json"), doc=column("doc"), value=column("value"),
            xattrs=column("xattrs"), scope=column("scope"), collection=column("collection"),
            op=column("op"),
        )

    def expiry_s(self, index: int) -> int | None:
        expiry = self.expiry_us[index]
        return None if expiry is None else expiry // 1_000_000

    def fingerprint(self, index: int) -> int:
        """`row_fingerprint` of row `index`, its body taken as `fingerprint_column` takes it."""
        doc = self.doc[index]
        body = doc.encode() if doc is not None else (self.value[index] or b"")
        return row_fingerprint(
            int(self.collection_id[index]),
            self.key[index],
            int(self.seqno[index]),
            int(self.cas[index]),
            body,
            int(self.flags[index] or 0),
            self.expiry_s(index) or 0,
            bool(self.is_json[index]),
            self.xattrs[index],
        )
