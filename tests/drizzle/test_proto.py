"""The compiled message definitions: fresh, importable, and on Drizzle's wire numbers."""

from __future__ import annotations

import pytest

from replicator.drizzle.proto import regenerate
from replicator.drizzle.proto.table_pb2 import Table
from replicator.drizzle.proto.transaction_pb2 import (
    InsertRecord,
    Statement,
    Transaction,
    UpdateRecord,
)


def test_generated_modules_match_their_proto_files() -> None:
    stale = regenerate.stale_modules()
    assert stale == [], (
        f"{stale} were not regenerated after their .proto changed: run "
        "python -m replicator.drizzle.proto.regenerate"
    )


def test_an_edited_proto_is_noticed(monkeypatch: pytest.MonkeyPatch) -> None:
    real = regenerate.source_hash
    monkeypatch.setattr(
        regenerate,
        "source_hash",
        lambda proto: "0" * 64 if proto.name == "event.proto" else real(proto),
    )
    assert regenerate.stale_modules() == ["event_pb2.py", "event_pb2.pyi"]


def test_protoc_regenerates_the_same_modules() -> None:
    pytest.importorskip(
        "grpc_tools", reason="protoc comes with grpcio-tools: pip install -e '.[proto]'"
    )
    assert regenerate.main(["--check"]) == 0


def test_field_numbers_are_drizzles() -> None:
    # Numbers from drizzled/message/transaction.proto and table.proto: a wrong one would make
    # every message from a real Drizzle misread.
    def number(message: type, name: str) -> int:
        return message.DESCRIPTOR.fields_by_name[name].number  # type: ignore[attr-defined,no-any-return]

    assert [number(Transaction, n) for n in ("transaction_context", "statement", "event")] == [
        1,
        2,
        3,
    ]
    assert [number(Transaction, n) for n in ("segment_id", "end_segment")] == [4, 5]
    assert number(Statement, "set_variable_statement") == 18
    assert number(Statement, "raw_sql_schema") == 19
    assert number(InsertRecord, "is_null") == 2 and number(UpdateRecord, "is_null") == 4
    assert dict(Statement.Type.items()) == {
        "ROLLBACK": 0, "INSERT": 1, "DELETE": 2, "UPDATE": 3, "TRUNCATE_TABLE": 4,
        "CREATE_SCHEMA": 5, "ALTER_SCHEMA": 6, "DROP_SCHEMA": 7, "CREATE_TABLE": 8,
        "ALTER_TABLE": 9, "DROP_TABLE": 10, "ROLLBACK_STATEMENT": 11, "SET_VARIABLE": 98,
        "RAW_SQL": 99,
    }  # fmt: skip
    assert dict(Table.Field.FieldType.items()) == {
        "DOUBLE": 0, "VARCHAR": 1, "BLOB": 2, "ENUM": 3, "INTEGER": 4, "BIGINT": 5,
        "DECIMAL": 6, "DATE": 7, "EPOCH": 9, "DATETIME": 10, "UUID": 11, "TIME": 12,
        "BOOLEAN": 13, "IPV6": 14,
    }  # fmt: skip
    assert Transaction.DESCRIPTOR.full_name == "drizzled.message.Transaction"
