"""Column types: Drizzle's text form to typed values and back, Delta types, table definitions."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicator.drizzle.schema import (
    ColumnSpec,
    ColumnType,
    ColumnValueError,
    TableDefinition,
    TableName,
    Value,
    definition_from_message,
    definition_to_message,
    format_value,
    parse_value,
)

VALUES: dict[ColumnType, st.SearchStrategy[Value]] = {
    ColumnType.INTEGER: st.integers(-(2**31), 2**31 - 1),
    ColumnType.BIGINT: st.integers(-(2**63), 2**64 - 1),
    ColumnType.DOUBLE: st.floats(allow_nan=False, allow_infinity=False),
    ColumnType.DECIMAL: st.decimals(allow_nan=False, allow_infinity=False, places=3),
    ColumnType.VARCHAR: st.text(),
    ColumnType.ENUM: st.sampled_from(["new", "paid"]),
    ColumnType.BLOB: st.binary(),
    ColumnType.BOOLEAN: st.booleans(),
    ColumnType.DATE: st.dates(),
    ColumnType.DATETIME: st.datetimes(),
    ColumnType.EPOCH: st.datetimes(timezones=st.just(dt.UTC)),
    ColumnType.TIME: st.times(),
    ColumnType.UUID: st.uuids().map(str),
    ColumnType.IPV6: st.just("2001:db8::1"),
}


@pytest.mark.parametrize("column_type", list(ColumnType))
@given(data=st.data())
def test_values_round_trip_through_drizzles_text_form(
    column_type: ColumnType, data: st.DataObject
) -> None:
    value = data.draw(VALUES[column_type])
    parsed = parse_value(column_type, format_value(column_type, value))
    assert parsed == value
    assert type(parsed) is type(value)


def test_values_as_drizzle_prints_them() -> None:
    assert parse_value(ColumnType.EPOCH, b"2010-03-04 05:06:07") == dt.datetime(
        2010, 3, 4, 5, 6, 7, tzinfo=dt.UTC
    )
    assert parse_value(ColumnType.DATETIME, b"2010-03-04 05:06:07.250000") == dt.datetime(
        2010, 3, 4, 5, 6, 7, 250000
    )
    assert parse_value(ColumnType.DECIMAL, b"-12.50") == Decimal("-12.50")
    assert format_value(ColumnType.DECIMAL, Decimal(0).scaleb(-2)) == b"0.00"
    assert parse_value(ColumnType.DOUBLE, b"1e+20") == 1e20
    assert parse_value(ColumnType.VARCHAR, "crème".encode()) == "crème"
    assert (
        format_value(
            ColumnType.EPOCH, dt.datetime(2010, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))
        )
        == b"2010-01-01 00:00:00"
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [(b"TRUE", True), (b"FALSE", False), (b"YES", True), (b"no", False), (b"t", True)],
)
def test_booleans_read_as_drizzle_reads_them(text: bytes, value: bool) -> None:
    assert parse_value(ColumnType.BOOLEAN, text) is value


@pytest.mark.parametrize(
    ("column_type", "raw", "match"),
    [
        (ColumnType.INTEGER, b"2147483648", "out of range"),
        (ColumnType.INTEGER, b"12abc", "does not parse"),
        (ColumnType.BOOLEAN, b"maybe", "not a boolean"),
        (ColumnType.DATE, b"2010-13-01", "does not parse"),
        (ColumnType.VARCHAR, b"\xff\xfe", "not UTF-8"),
    ],
)
def test_bad_values_are_named(column_type: ColumnType, raw: bytes, match: str) -> None:
    with pytest.raises(ColumnValueError, match=match):
        parse_value(column_type, raw)


def test_format_refuses_values_of_the_wrong_type() -> None:
    with pytest.raises(ColumnValueError, match="not a int"):
        format_value(ColumnType.INTEGER, True)
    with pytest.raises(ColumnValueError, match="not a date"):
        format_value(ColumnType.DATE, "2010-01-01")
    with pytest.raises(ColumnValueError, match="is_null"):
        format_value(ColumnType.VARCHAR, None)


def test_delta_types() -> None:
    assert ColumnSpec("a", ColumnType.INTEGER).delta_type() == "int"
    assert ColumnSpec("a", ColumnType.BIGINT, unsigned=True).delta_type() == "decimal(20,0)"
    assert ColumnSpec("a", ColumnType.DECIMAL, precision=12, scale=3).delta_type() == (
        "decimal(12,3)"
    )
    assert ColumnSpec("a", ColumnType.BLOB).delta_type() == "binary"
    assert ColumnSpec("a", ColumnType.BLOB, is_text=True).delta_type() == "string"
    assert ColumnSpec("a", ColumnType.EPOCH).delta_type() == "timestamp"
    assert ColumnSpec("a", ColumnType.DATETIME).delta_type() == "timestamp_ntz"
    assert ColumnSpec("a", ColumnType.TIME).delta_type() == "string"
    with pytest.raises(ValueError, match="DECIMAL\\(65,2\\) has more digits than Delta"):
        ColumnSpec("a", ColumnType.DECIMAL, precision=65, scale=2).delta_type()


def test_delta_values() -> None:
    text = ColumnSpec("note", ColumnType.BLOB, is_text=True)
    assert text.delta_value("naïve".encode()) == "naïve"
    assert ColumnSpec("at", ColumnType.TIME).delta_value(dt.time(1, 2, 3)) == "01:02:03"
    assert ColumnSpec("raw", ColumnType.BLOB).delta_value(b"\x00") == b"\x00"


def test_definitions_survive_drizzles_table_message() -> None:
    definition = TableDefinition(
        TableName("shop", "orders"),
        (
            ColumnSpec("region", ColumnType.VARCHAR, nullable=False, length=8),
            ColumnSpec("id", ColumnType.INTEGER, nullable=False, auto_increment=True),
            ColumnSpec(
                "total",
                ColumnType.DECIMAL,
                precision=10,
                scale=2,
                has_default=True,
                default=Decimal("0.00"),
            ),
            ColumnSpec("big", ColumnType.BIGINT, unsigned=True),
            ColumnSpec("note", ColumnType.BLOB, is_text=True, has_default=True),
            ColumnSpec("status", ColumnType.ENUM, enum_values=("a", "b")),
            ColumnSpec("seen", ColumnType.EPOCH, microseconds=True),
        ),
        ("region", "id"),
    )
    message = definition_to_message(definition, created_at=5)
    assert message.IsInitialized()
    assert [part.fieldnr for part in message.indexes[0].index_part] == [0, 1]
    assert definition_from_message(message) == definition


def test_a_table_without_primary_key_has_an_empty_key() -> None:
    definition = TableDefinition(TableName("s", "t"), (ColumnSpec("a", ColumnType.INTEGER),), ())
    message = definition_to_message(definition)
    del message.indexes[:]
    assert definition_from_message(message).primary_key == ()


def test_definitions_are_checked() -> None:
    with pytest.raises(ValueError, match="duplicate column names"):
        TableDefinition(
            TableName("s", "t"),
            (ColumnSpec("a", ColumnType.INTEGER), ColumnSpec("a", ColumnType.BIGINT)),
            ("a",),
        )
    with pytest.raises(ValueError, match="primary key columns \\['b'\\]"):
        TableDefinition(TableName("s", "t"), (ColumnSpec("a", ColumnType.INTEGER),), ("b",))
