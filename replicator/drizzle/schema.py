"""Tables as the Delta side needs them: names, typed columns, primary keys, and typed values.

Drizzle sends every row value as the column's text form (`Field::val_str`), raw bytes for BLOB,
and names each value's column and type (`FieldMetadata`) in the statement's header. This module
turns those bytes into Python values of the column's type and back, and maps each Drizzle type
to the Delta (Spark SQL) type that holds it without loss:

| Drizzle    | Python value                    | Delta type                               |
|------------|---------------------------------|------------------------------------------|
| INTEGER    | int (32-bit signed)             | int                                      |
| BIGINT     | int                             | bigint; decimal(20,0) when UNSIGNED      |
| DOUBLE     | float                           | double                                   |
| DECIMAL    | decimal.Decimal                 | decimal(precision, scale); at most 38    |
| VARCHAR    | str                             | string                                   |
| ENUM       | str (the value's name)          | string                                   |
| BLOB       | bytes                           | binary; string for a TEXT column         |
| BOOLEAN    | bool                            | boolean                                  |
| DATE       | datetime.date                   | date                                     |
| DATETIME   | datetime.datetime, naive        | timestamp_ntz                            |
| EPOCH      | datetime.datetime, UTC          | timestamp (TIMESTAMP; Drizzle keeps UTC) |
| TIME       | datetime.time                   | string "HH:MM:SS[.ffffff]": Spark 4.0    |
|            |                                 | has no time type                         |
| UUID       | str (canonical, lower case)     | string                                   |
| IPV6       | str                             | string                                   |

A TEXT column is a BLOB with a character collation: its values are bytes on the wire (the DML
header says BLOB only), and `ColumnSpec.delta_value` decodes them as UTF-8.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from replicator.drizzle.proto.engine_pb2 import Engine
from replicator.drizzle.proto.table_pb2 import Table

Value = int | float | Decimal | str | bytes | bool | dt.date | dt.datetime | dt.time | None
"""A typed column value; None is SQL NULL."""

DELTA_MAX_DECIMAL_PRECISION = 38
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_UINT64 = (0, 2**64 - 1)


class ColumnType(enum.Enum):
    """Drizzle's column types (Table.Field.FieldType), by their wire numbers."""

    DOUBLE = 0
    VARCHAR = 1
    BLOB = 2
    ENUM = 3
    INTEGER = 4
    BIGINT = 5
    DECIMAL = 6
    DATE = 7
    EPOCH = 9
    DATETIME = 10
    UUID = 11
    TIME = 12
    BOOLEAN = 13
    IPV6 = 14

    @classmethod
    def from_wire(cls, number: int) -> ColumnType:
        try:
            return cls(number)
        except ValueError:
            raise ValueError(f"unknown Drizzle column type {number}") from None


class ColumnValueError(ValueError):
    """A value that does not fit its column type (from `parse_value` / `format_value`)."""


@dataclass(frozen=True, slots=True, order=True)
class TableName:
    """A source table, `schema.table`: one Delta table each."""

    schema: str
    table: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass(frozen=True, slots=True)
class Column:
    """A column as a DML statement's header names it: enough to type its values."""

    name: str
    type: ColumnType


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """A column as CREATE / ALTER TABLE define it: what the Delta side makes a column of.

    `default` is the typed default (None: NULL or no default; `has_default` tells which).
    Existing rows take the default when ALTER TABLE adds the column, at the source and so in
    the mirror. `is_text` marks a BLOB with a character collation (TEXT). `length` is VARCHAR's
    length in characters, `precision`/`scale` DECIMAL's, `enum_values` ENUM's values.
    """

    name: str
    type: ColumnType
    nullable: bool = True
    has_default: bool = False
    default: Value = None
    unsigned: bool = False
    auto_increment: bool = False
    length: int | None = None
    precision: int | None = None
    scale: int | None = None
    enum_values: tuple[str, ...] = ()
    is_text: bool = False
    microseconds: bool = False

    @property
    def column(self) -> Column:
        return Column(self.name, self.type)

    def delta_type(self) -> str:
        """The Spark SQL type of this column in the mirror; ValueError if Delta has none."""
        match self.type:
            case ColumnType.INTEGER:
                return "int"
            case ColumnType.BIGINT:
                return "decimal(20,0)" if self.unsigned else "bigint"
            case ColumnType.DOUBLE:
                return "double"
            case ColumnType.DECIMAL:
                precision = self.precision if self.precision is not None else 10
                scale = self.scale or 0
                if precision > DELTA_MAX_DECIMAL_PRECISION:
                    raise ValueError(
                        f"column {self.name}: DECIMAL({precision},{scale}) has more digits than "
                        f"Delta's decimal holds ({DELTA_MAX_DECIMAL_PRECISION}); narrow the "
                        "column at the source or leave the table out of the mirror"
                    )
                return f"decimal({precision},{scale})"
            case ColumnType.BLOB:
                return "string" if self.is_text else "binary"
            case ColumnType.BOOLEAN:
                return "boolean"
            case ColumnType.DATE:
                return "date"
            case ColumnType.DATETIME:
                return "timestamp_ntz"
            case ColumnType.EPOCH:
                return "timestamp"
            case _:
                return "string"

    def delta_value(self, value: Value) -> Value:
        """`value` as the mirror stores it (see the module's table): TEXT and TIME as str."""
        if value is None:
            return None
        if self.type is ColumnType.BLOB and self.is_text and isinstance(value, bytes):
            return value.decode("utf-8")
        if self.type is ColumnType.TIME and isinstance(value, dt.time):
            return value.isoformat()
        return value


@dataclass(frozen=True, slots=True)
class TableDefinition:
    """A table's columns, in table order, and its primary key (column names, in key order).

    `primary_key` is empty for a table created without one: Drizzle replicates its CREATE but
    refuses every write to it while replication is on, so it stays empty.
    """

    name: TableName
    columns: tuple[ColumnSpec, ...]
    primary_key: tuple[str, ...]
    engine: str = "InnoDB"

    def __post_init__(self) -> None:
        names = [column.name for column in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"table {self.name}: duplicate column names in {names}")
        unknown = [key for key in self.primary_key if key not in names]
        if unknown:
            raise ValueError(f"table {self.name}: primary key columns {unknown} are not columns")

    def column(self, name: str) -> ColumnSpec:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"table {self.name} has no column {name!r}")

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    def with_columns(self, columns: Sequence[ColumnSpec]) -> TableDefinition:
        return TableDefinition(self.name, tuple(columns), self.primary_key, self.engine)


def parse_value(column_type: ColumnType, raw: bytes) -> Value:
    """The typed value of a non-NULL column value as Drizzle sends it (its text form)."""
    if column_type is ColumnType.BLOB:
        return bytes(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ColumnValueError(f"{column_type.name} value {raw[:40]!r} is not UTF-8 text") from None
    try:
        return _PARSERS[column_type](text)
    except ColumnValueError:
        raise
    except (ValueError, InvalidOperation, ArithmeticError) as error:
        raise ColumnValueError(
            f"{column_type.name} value {text[:60]!r} does not parse: {error}"
        ) from None


def format_value(column_type: ColumnType, value: Value) -> bytes:
    """A non-NULL typed value in Drizzle's text form: what `parse_value` reads back."""
    if value is None:
        raise ColumnValueError("NULL has no text form: send it with is_null")
    if column_type is ColumnType.BLOB:
        if isinstance(value, str):
            return value.encode("utf-8")
        if not isinstance(value, bytes):
            raise ColumnValueError(f"BLOB value {value!r} is not bytes")
        return value
    return _FORMATTERS[column_type](value).encode("utf-8")


_Parser = Callable[[str], Value]
_Formatter = Callable[[Value], str]


def _parse_int(bounds: tuple[int, int]) -> _Parser:
    def parse(text: str) -> int:
        number = int(text)
        if not bounds[0] <= number <= bounds[1]:
            raise ColumnValueError(f"{number} is out of range [{bounds[0]}, {bounds[1]}]")
        return number

    return parse


def _parse_bool(text: str) -> bool:
    # Drizzle's own reading of booleans (drizzled/type/boolean.cc): TRUE/FALSE, YES/NO, and
    # their first letters, in any case; it writes TRUE/FALSE (or YES/NO for ansi display).
    folded = text.strip().upper()
    if folded in ("TRUE", "YES", "T", "Y"):
        return True
    if folded in ("FALSE", "NO", "F", "N"):
        return False
    raise ColumnValueError(f"{text!r} is not a boolean (TRUE, FALSE, YES or NO)")


def _parse_datetime(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.strip())


def _parse_epoch(text: str) -> dt.datetime:
    # Drizzle keeps TIMESTAMP in UTC and prints it without a zone.
    moment = _parse_datetime(text)
    if moment.tzinfo is None:
        return moment.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC)


_PARSERS: dict[ColumnType, _Parser] = {
    ColumnType.INTEGER: _parse_int(_INT32),
    # A BIGINT UNSIGNED column's values go up to 2**64 - 1; the header does not say which.
    ColumnType.BIGINT: _parse_int((_INT64[0], _UINT64[1])),
    ColumnType.DOUBLE: float,
    ColumnType.DECIMAL: Decimal,
    ColumnType.VARCHAR: str,
    ColumnType.ENUM: str,
    ColumnType.BOOLEAN: _parse_bool,
    ColumnType.DATE: lambda text: dt.date.fromisoformat(text.strip()),
    ColumnType.DATETIME: _parse_datetime,
    ColumnType.EPOCH: _parse_epoch,
    ColumnType.TIME: lambda text: dt.time.fromisoformat(text.strip()),
    ColumnType.UUID: lambda text: str(uuid.UUID(text.strip())),
    ColumnType.IPV6: str,
}


def _formatter(kinds: tuple[type, ...], render: Callable[[Value], str] = str) -> _Formatter:
    def format_(value: Value) -> str:
        # bool is an int: an INTEGER column must not take True without saying so.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            wanted = " or ".join(kind.__name__ for kind in kinds)
            raise ColumnValueError(f"{value!r} is not a {wanted}")
        return render(value)

    return format_


def _render_datetime(value: Value) -> str:
    assert isinstance(value, dt.datetime)
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.isoformat(sep=" ")


def _render_isoformat(value: Value) -> str:
    assert isinstance(value, dt.date | dt.time)
    return value.isoformat()


_FORMATTERS: dict[ColumnType, _Formatter] = {
    ColumnType.INTEGER: _formatter((int,)),
    ColumnType.BIGINT: _formatter((int,)),
    ColumnType.DOUBLE: _formatter((float, int), repr),
    # Fixed-point, as Drizzle prints decimals: str() would give "0E-2" for 0.00.
    ColumnType.DECIMAL: _formatter((Decimal,), lambda value: format(value, "f")),
    ColumnType.VARCHAR: _formatter((str,)),
    ColumnType.ENUM: _formatter((str,)),
    ColumnType.BOOLEAN: _formatter((bool,), lambda value: "TRUE" if value else "FALSE"),
    # datetime is a date: a DATE column must get a date, not a datetime.
    ColumnType.DATE: _formatter((dt.date,), _render_isoformat),
    ColumnType.DATETIME: _formatter((dt.datetime,), _render_datetime),
    ColumnType.EPOCH: _formatter((dt.datetime,), _render_datetime),
    ColumnType.TIME: _formatter((dt.time,), _render_isoformat),
    ColumnType.UUID: _formatter((str,), lambda value: str(uuid.UUID(str(value)))),
    ColumnType.IPV6: _formatter((str,)),
}


def definition_from_message(table: Table) -> TableDefinition:
    """The TableDefinition a CREATE / ALTER TABLE statement's Table message describes."""
    name = TableName(table.schema, table.name)
    columns = tuple(_column_from_field(name, field) for field in table.field)
    primary = [index for index in table.indexes if index.is_primary]
    if len(primary) > 1:
        raise ValueError(f"table {name} has {len(primary)} primary keys")
    key: tuple[str, ...] = ()
    if primary:
        try:
            key = tuple(columns[part.fieldnr].name for part in primary[0].index_part)
        except IndexError:
            raise ValueError(
                f"table {name}: its primary key names a column number past its "
                f"{len(columns)} columns"
            ) from None
    return TableDefinition(name, columns, key, table.engine.name or "InnoDB")


def _column_from_field(table: TableName, field: Table.Field) -> ColumnSpec:
    try:
        column_type = ColumnType.from_wire(field.type)
    except ValueError as error:
        raise ValueError(f"table {table} column {field.name}: {error}") from None
    options = field.options
    has_default = options.HasField("default_value") or options.HasField("default_bin_value")
    default: Value = None
    if options.default_null:
        has_default = True
    elif options.HasField("default_bin_value"):
        default = parse_value(column_type, options.default_bin_value)
    elif options.HasField("default_value"):
        default = parse_value(column_type, options.default_value.encode("utf-8"))
    collation = field.string_options.collation if field.HasField("string_options") else ""
    return ColumnSpec(
        name=field.name,
        type=column_type,
        nullable=not field.constraints.is_notnull,
        has_default=has_default,
        default=default,
        unsigned=field.constraints.is_unsigned,
        auto_increment=field.numeric_options.is_autoincrement,
        length=field.string_options.length if field.string_options.HasField("length") else None,
        precision=(
            field.numeric_options.precision if field.numeric_options.HasField("precision") else None
        ),
        scale=field.numeric_options.scale if field.numeric_options.HasField("scale") else None,
        enum_values=tuple(field.enumeration_values.field_value),
        is_text=column_type is ColumnType.BLOB and collation not in ("", "binary"),
        microseconds=field.time_options.microseconds,
    )


def definition_to_message(
    definition: TableDefinition, *, created_at: int = 0, updated_at: int = 0
) -> Table:
    """The Table message Drizzle would send for `definition` (the producer's side)."""
    table = Table(
        name=definition.name.table,
        schema=definition.name.schema,
        type=Table.STANDARD,
        engine=Engine(name=definition.engine),
        creation_timestamp=created_at,
        update_timestamp=updated_at,
    )
    for spec in definition.columns:
        field = table.field.add(name=spec.name, type=spec.type.value)
        field.constraints.is_notnull = not spec.nullable
        if spec.unsigned:
            field.constraints.is_unsigned = True
        if spec.has_default:
            if spec.default is None:
                field.options.default_null = True
            elif spec.type is ColumnType.BLOB:
                field.options.default_bin_value = format_value(spec.type, spec.default)
            else:
                field.options.default_value = format_value(spec.type, spec.default).decode()
        if spec.auto_increment:
            field.numeric_options.is_autoincrement = True
        if spec.precision is not None:
            field.numeric_options.precision = spec.precision
        if spec.scale is not None:
            field.numeric_options.scale = spec.scale
        if spec.length is not None:
            field.string_options.length = spec.length
        if spec.type in (ColumnType.VARCHAR, ColumnType.ENUM) or spec.is_text:
            field.string_options.collation = "utf8_general_ci"
        elif spec.type is ColumnType.BLOB:
            field.string_options.collation = "binary"
        if spec.enum_values:
            field.enumeration_values.field_value.extend(spec.enum_values)
        if spec.microseconds:
            field.time_options.microseconds = True
    index = table.indexes.add(
        name="PRIMARY", is_primary=True, is_unique=True, type=Table.Index.BTREE, key_length=0
    )
    positions = {name: number for number, name in enumerate(definition.column_names)}
    for key in definition.primary_key:
        index.index_part.add(fieldnr=positions[key])
    return table
