"""`replicator audit`: ask a mirror's history questions from the command line.

    replicator audit --target PATH history KEY [--collection C] [--committed]
    replicator audit --target PATH as-of (--version V | --timestamp T)
    replicator audit --target PATH at-seqno VB SEQNO
    replicator audit --target PATH changes --from X --to Y
    replicator audit --target PATH rollbacks
    replicator audit --target ROOT transactions [--table SCHEMA.TABLE]   (a Drizzle mirror)

Readable tables by default, `--json` for machines. Read with delta-rs (no JVM) unless
`--engine spark`; Spark also reads a change feed that delta-rs would misread (rollbacks written by
older replicators). Errors are errors.* (the `replicator` command prints them as one line and
exits 2).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from replicator.cli.flags import add_engine_flag
from replicator.delta.reader import SPARK
from replicator.errors import ConfigError
from replicator.inspect.formatting import align_columns, format_time

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

    from replicator.inspect.mirror_history import MirrorHistory

DEFAULT_LIMIT = 20
VALUE_WIDTH = 60
"""Document text wider than this is cut in the readable tables (never in --json)."""

_ROW_COLUMNS = ("vbucket", "scope", "collection", "key", "seqno", "cas", "doc")
_ROW_ORDER = ("vbucket", "scope", "collection", "key")
_LABELS = {"_commit_version": "version", "_change_type": "change"}
_CHANGE_COLUMNS = ("_commit_version", "_change_type", *_ROW_COLUMNS)


def add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags and subcommands of `replicator audit`."""

    parser.add_argument("--target", help="path of the mirror Delta table")
    _add_json_flag(parser, default=False)
    add_engine_flag(parser)
    questions = parser.add_subparsers(dest="audit_command", required=True, metavar="QUESTION")

    history = questions.add_parser(
        "history",
        help="every revision of one document (from the history table of a --history run), "
        "else every committed version",
    )
    history.add_argument("key", help="the document key")
    history.add_argument("--collection", help="scope.collection, when the key is in several")
    history.add_argument(
        "--committed", action="store_true",
        help="the versions the mirror's commits left (change data feed), even with a history "
        "table",
    )

    as_of = questions.add_parser("as-of", help="the mirror at a table version or a time")
    when = as_of.add_mutually_exclusive_group(required=True)
    when.add_argument("--version", type=int, help="table version")
    when.add_argument("--timestamp", help="ISO 8601 time, e.g. 2026-01-31T12:00:00Z (UTC)")

    at_seqno = questions.add_parser(
        "at-seqno", help="one vbucket as the mirror held it when it stood at a source seqno"
    )
    at_seqno.add_argument("vbucket", type=int, help="vbucket id")
    at_seqno.add_argument("seqno", type=int, help="the source's seqno")

    changes = questions.add_parser("changes", help="the change data feed between two points")
    changes.add_argument("--from", dest="start", required=True, help="version or timestamp")
    changes.add_argument("--to", dest="end", required=True, help="version or timestamp")

    rollbacks = questions.add_parser("rollbacks", help="every rollback and resync, and why")

    transactions = questions.add_parser(
        "transactions",
        help="a relational (Drizzle) mirror: each table commit, its group and the source "
        "transactions it applied",
    )
    transactions.add_argument("--table", help="schema.table (default: every live table)")

    # Also accepted after the question (`audit history KEY --json`), never overriding the
    # value given before it.
    for sub in (history, as_of, at_seqno, changes, rollbacks, transactions):
        _add_json_flag(sub, default=argparse.SUPPRESS)
        sub.add_argument("--target", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        add_engine_flag(sub, default=argparse.SUPPRESS)
    for sub in (as_of, at_seqno, changes):
        sub.add_argument(
            "--limit", type=int, default=DEFAULT_LIMIT,
            help=f"rows shown (default {DEFAULT_LIMIT}; 0 for all)",
        )


def run_audit(args: argparse.Namespace, *, spark: SparkSession | None = None) -> int:
    """Answer the question in `args`; prints the answer and returns the exit code (0)."""
    if not args.target:
        raise ConfigError("audit needs --target PATH (the mirror to read)")
    limit = getattr(args, "limit", DEFAULT_LIMIT)
    if limit < 0:
        raise ConfigError("--limit must not be negative")
    # The engine asked for, else Spark when a session is at hand (its JVM is paid for), else
    # delta-rs. Where delta-rs would misread the change feed (old rollback commits),
    # MirrorHistory (inspect.mirror_history) reads with Spark anyway unless delta-rs was named.
    if args.engine == SPARK and spark is None:
        from replicator.runtime.spark import build_session

        spark = build_session("replicator-audit")
    answer = _QUESTIONS[args.audit_command](spark, args)
    print(json.dumps(answer.document, indent=2, default=str) if args.json else answer.text)
    return 0


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer in both forms: readable text and a JSON document."""

    text: str
    document: Any


def _transactions(spark: SparkSession | None, args: argparse.Namespace) -> Answer:
    from replicator.drizzle.schema import TableName
    from replicator.inspect.relational import is_relational_mirror, table_commits

    if spark is None:
        from replicator.runtime.spark import build_session

        spark = build_session("replicator-audit")
    if not is_relational_mirror(spark, args.target):
        raise ConfigError(
            f"{args.target} is not a relational (Drizzle) mirror: `transactions` reads the "
            "root a drizzle-log:// or drizzle+amqp:// run wrote"
        )
    table = None
    if args.table:
        schema, dot, name = args.table.partition(".")
        if not dot or not schema or not name:
            raise ConfigError(f"--table takes schema.table, not {args.table!r}")
        table = TableName(schema, name)
    entries = table_commits(spark, args.target, table)
    document = [entry.to_json() for entry in entries]
    if not entries:
        return Answer(f"no table commits in {args.target}", document)
    header = ("table", "version", "committed", "group", "kind", "transactions")
    rows = [
        (e.table, str(e.version), format_time(e.committed_at), str(e.group), e.kind,
         _short(" ".join(str(t) for t in e.transactions)))
        for e in entries
    ]
    return Answer("\n".join(align_columns([header, *rows], numeric=(1, 3))), document)


def _history(spark: SparkSession | None, args: argparse.Namespace) -> Answer:
    from replicator.inspect.documents import document_history

    if not args.committed:
        revisions = _revisions(spark, args)
        if revisions is not None:
            return revisions
    versions = document_history(spark, args.target, args.key, collection=args.collection,
                                engine=args.engine)
    document = {"key": args.key, "versions": [v.to_json() for v in versions]}
    if not versions:
        return Answer(f"the mirror at {args.target} never held key {args.key!r}", document)
    header = ("version", "committed", "operation", "commit", "collection", "seqno", "cas",
              "value")
    rows = [
        (str(v.table_version), format_time(v.committed_at), str(v.operation), v.commit_kind or "-",
         v.collection_path, _cell(v.seqno), _cell(v.cas), _short(v.value))
        for v in versions
    ]
    title = f"history of {args.key!r}: {len(versions)} versions"
    return Answer(_table(title, header, rows, numeric=(0, 5, 6)), document)


def _revisions(spark: SparkSession | None, args: argparse.Namespace) -> Answer | None:
    """Every revision from the history table; None when the mirror has none."""
    from replicator.inspect.revisions import revision_history

    revisions = revision_history(
        spark, args.target, args.key, collection=args.collection, engine=args.engine
    )
    if revisions is None:
        return None
    document = {"key": args.key, "source": "history", "revisions": [r.to_json() for r in revisions]}
    if not revisions:
        return Answer(f"the history of {args.target} holds no revision of key {args.key!r}",
                      document)
    header = ("seqno", "rev", "operation", "version", "committed", "rolled back", "collection",
              "cas", "value")
    rows = [
        (str(r.seqno), str(r.rev_seqno), r.operation, str(r.table_version),
         format_time(r.committed_at),
         "-" if r.rolled_back_at is None else f"at version {r.rolled_back_at}",
         r.collection_path, str(r.cas), _short(r.value))
        for r in revisions
    ]  # fmt: skip
    undone = sum(r.rolled_back_at is not None for r in revisions)
    title = f"revisions of {args.key!r}: {len(revisions)}" + (
        f", {undone} of them rolled back" if undone else ""
    )
    return Answer(_table(title, header, rows, numeric=(0, 1, 3, 7)), document)


def _as_of(spark: SparkSession | None, args: argparse.Namespace) -> Answer:
    history = _mirror_history(spark, args)
    resolved = history.resolve(version=args.version, timestamp=args.timestamp)
    total, rows = history.rows(resolved.version, _ROW_COLUMNS, order_by=_ROW_ORDER,
                               limit=args.limit)
    title = (f"the mirror at table version {resolved.version} "
             f"(committed {format_time(resolved.committed_at)})")
    return _rows_answer(title, total, rows, {
        "version": resolved.version, "committed_at": resolved.committed_at.isoformat(),
    }, _ROW_COLUMNS)


def _at_seqno(spark: SparkSession | None, args: argparse.Namespace) -> Answer:
    history = _mirror_history(spark, args)
    boundary = history.source_boundary(args.vbucket, args.seqno)
    total, rows = history.rows(boundary.table_version, _ROW_COLUMNS, order_by=_ROW_ORDER,
                               limit=args.limit, where=f"vbucket = {int(args.vbucket)}")
    title = (f"vbucket {boundary.vbucket} at seqno {boundary.requested_seqno}: its committed "
             f"boundary seqno {boundary.seqno} (vbucket uuid {boundary.vbucket_uuid}), table "
             f"version {boundary.table_version}, committed {format_time(boundary.committed_at)}")
    return _rows_answer(title, total, rows, {
        "vbucket": boundary.vbucket, "requested_seqno": boundary.requested_seqno,
        "boundary_seqno": boundary.seqno, "vbucket_uuid": boundary.vbucket_uuid,
        "version": boundary.table_version, "committed_at": boundary.committed_at.isoformat(),
        "kind": boundary.kind,
    }, _ROW_COLUMNS)


def _mirror_history(spark: SparkSession | None, args: argparse.Namespace) -> MirrorHistory:
    from replicator.delta.reader import table_reader
    from replicator.inspect.mirror_history import MirrorHistory

    return MirrorHistory.open(table_reader(args.engine, spark), args.target)


def _changes(spark: SparkSession | None, args: argparse.Namespace) -> Answer:
    from replicator.inspect.time_travel import changes_table

    total, rows = changes_table(spark, args.target, _point(args.start), _point(args.end),
                                limit=args.limit, engine=args.engine)
    title = f"changes from {args.start} to {args.end}"
    return _rows_answer(title, total, rows, {"from": args.start, "to": args.end},
                        _CHANGE_COLUMNS)


def _rollbacks(spark: SparkSession | None, args: argparse.Namespace) -> Answer:
    from replicator.inspect.commits import rollbacks

    records = rollbacks(spark, args.target, engine=args.engine)
    document = {"rollbacks": [r.to_json() for r in records]}
    if not records:
        return Answer(f"no rollbacks in the history of {args.target}", document)
    header = ("version", "committed", "kind", "vbucket", "from seqno", "to seqno", "restored from")
    rows = [
        (str(r.table_version), format_time(r.committed_at), r.kind, str(r.vbucket),
         _cell(r.from_seqno), str(r.to_seqno), _cell(r.from_table_version))
        for r in records
    ]
    text = _table(f"{len(records)} rollbacks", header, rows, numeric=(0, 3, 4, 5, 6))
    return Answer(text + "\n\n" + "\n".join(r.explain() for r in records), document)


_QUESTIONS: dict[str, Callable[[Any, argparse.Namespace], Answer]] = {
    "history": _history,
    "transactions": _transactions,
    "as-of": _as_of,
    "at-seqno": _at_seqno,
    "changes": _changes,
    "rollbacks": _rollbacks,
}


# --- rendering ----------------------------------------------------------------------------


def _rows_answer(
    title: str, total: int, rows: pa.Table, facts: dict[str, Any], columns: Sequence[str]
) -> Answer:
    """`rows`, the first of `total` in order, as a table and as JSON."""
    shown = rows.select(list(columns)).to_pylist()
    document = {**facts, "rows": total, "shown": len(shown),
                "documents": [{k: _json_cell(v) for k, v in row.items()} for row in shown]}
    title = f"{title}: {total} rows" + (f", first {len(shown)} shown" if len(shown) < total else "")
    if not shown:
        return Answer(title, document)
    header = tuple(_LABELS.get(c, c) for c in columns)
    cells = [tuple(_short(row[c]) if c == "doc" else _cell(row[c]) for c in columns)
             for row in shown]
    numeric = [i for i, c in enumerate(columns) if c in ("vbucket", "seqno", "cas",
                                                          "_commit_version")]
    return Answer(_table(title, header, cells, numeric=numeric), document)


def _table(
    title: str, header: Sequence[str], rows: Sequence[Sequence[str]], *, numeric: Sequence[int]
) -> str:
    return "\n".join([title, "", *align_columns([tuple(header), *rows], numeric=numeric)])


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _short(value: str | bytes | None) -> str:
    if value is None:
        return "-"
    text = f"<{len(value)} binary bytes>" if isinstance(value, bytes) else value
    return text if len(text) <= VALUE_WIDTH else text[: VALUE_WIDTH - 3] + "..."


def _json_cell(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, datetime):
        # Arrow from Spark can carry naive local times; from delta-rs, UTC ones.
        return value.astimezone(UTC).isoformat()
    return value


def _point(text: str) -> int | str:
    """A --from/--to value: a whole number is a table version, anything else a timestamp."""
    stripped = text.strip()
    return int(stripped) if stripped.isdigit() else stripped


def _add_json_flag(parser: argparse.ArgumentParser, *, default: Any) -> None:
    parser.add_argument("--json", action="store_true", default=default,
                        help="machine-readable output")


__all__ = ["add_audit_arguments", "run_audit"]
