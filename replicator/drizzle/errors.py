"""The errors of the Drizzle source, each naming the log offset or the transaction at fault.

Callers catch meaning: a corrupt log (stop, an operator must look) is not a log whose last entry
is still being written (wait and read again from `TruncatedTail.offset`), and a bad transaction
is named by its id so that it can be reported, and the rest of the stream kept.
"""

from __future__ import annotations

from pathlib import Path

from replicator.errors import ReplicatorError


class TransactionLogError(ReplicatorError):
    """A Drizzle transaction log could not be read at `offset` (bytes from the file's start)."""

    def __init__(self, path: Path | str, offset: int, message: str) -> None:
        super().__init__(f"transaction log {path}: entry at offset {offset}: {message}")
        self.path = Path(path)
        self.offset = offset


class CorruptLogEntry(TransactionLogError):
    """The entry at `offset` is damaged (bad type, length or checksum, or does not parse).

    Every entry before `offset` was intact. Not retried: the same bytes fail again.
    """


class IncompleteLogError(TransactionLogError):
    """The log ends inside an entry, and the reader was asked for a log that is complete."""


class TransactionStreamError(ReplicatorError):
    """A Transaction message the assembler refuses; nothing of its transaction was handed out.

    `transaction_id` and `segment_id` name the message (segment_id None when it has none). The
    assembler's state is as before the message, so the caller may `discard` the transaction and
    go on with the others, or stop.
    """

    def __init__(self, transaction_id: int, segment_id: int | None, message: str) -> None:
        where = f"transaction {transaction_id}"
        if segment_id is not None:
            where += f" segment {segment_id}"
        super().__init__(f"{where}: {message}")
        self.transaction_id = transaction_id
        self.segment_id = segment_id
        self.detail = message
        """The message without the transaction and segment it names."""


class SegmentGapError(TransactionStreamError):
    """A segment arrived whose predecessors did not (lost or reordered messages)."""


class TransactionOrderError(TransactionStreamError):
    """A new transaction's id lies below ids already completed, and it is not a redelivery."""


class UnknownStatementError(TransactionStreamError):
    """A statement of a type this replicator does not know (a newer Drizzle, or corruption)."""


class MalformedTransactionError(TransactionStreamError):
    """A message whose content is inconsistent: missing parts, mismatched counts, bad values."""
