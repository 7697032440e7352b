# replicator: generated from table.proto sha256=7cabef2dc70a58be8b4b4a2bdbafbc8150b78d3e2a652f5358df0957e762d3c8
# by `python -m replicator.drizzle.proto.regenerate`: do not edit.
# ruff: noqa
# mypy: disable-error-code="type-arg"
from replicator.drizzle.proto import engine_pb2 as _engine_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Table(_message.Message):
    __slots__ = ("name", "engine", "field", "indexes", "type", "schema", "creation_timestamp", "update_timestamp", "catalog", "uuid", "version")
    class TableType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STANDARD: _ClassVar[Table.TableType]
        TEMPORARY: _ClassVar[Table.TableType]
        INTERNAL: _ClassVar[Table.TableType]
        FUNCTION: _ClassVar[Table.TableType]
    STANDARD: Table.TableType
    TEMPORARY: Table.TableType
    INTERNAL: Table.TableType
    FUNCTION: Table.TableType
    class Field(_message.Message):
        __slots__ = ("name", "type", "options", "constraints", "numeric_options", "string_options", "time_options", "comment", "enumeration_values")
        class FieldType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
            __slots__ = ()
            DOUBLE: _ClassVar[Table.Field.FieldType]
            VARCHAR: _ClassVar[Table.Field.FieldType]
            BLOB: _ClassVar[Table.Field.FieldType]
            ENUM: _ClassVar[Table.Field.FieldType]
            INTEGER: _ClassVar[Table.Field.FieldType]
            BIGINT: _ClassVar[Table.Field.FieldType]
            DECIMAL: _ClassVar[Table.Field.FieldType]
            DATE: _ClassVar[Table.Field.FieldType]
            EPOCH: _ClassVar[Table.Field.FieldType]
            DATETIME: _ClassVar[Table.Field.FieldType]
            UUID: _ClassVar[Table.Field.FieldType]
            TIME: _ClassVar[Table.Field.FieldType]
            BOOLEAN: _ClassVar[Table.Field.FieldType]
            IPV6: _ClassVar[Table.Field.FieldType]
        DOUBLE: Table.Field.FieldType
        VARCHAR: Table.Field.FieldType
        BLOB: Table.Field.FieldType
        ENUM: Table.Field.FieldType
        INTEGER: Table.Field.FieldType
        BIGINT: Table.Field.FieldType
        DECIMAL: Table.Field.FieldType
        DATE: Table.Field.FieldType
        EPOCH: Table.Field.FieldType
        DATETIME: Table.Field.FieldType
        UUID: Table.Field.FieldType
        TIME: Table.Field.FieldType
        BOOLEAN: Table.Field.FieldType
        IPV6: Table.Field.FieldType
        class FieldOptions(_message.Message):
            __slots__ = ("default_value", "update_value", "default_null", "default_bin_value", "default_expression", "update_expression")
            DEFAULT_VALUE_FIELD_NUMBER: _ClassVar[int]
            UPDATE_VALUE_FIELD_NUMBER: _ClassVar[int]
            DEFAULT_NULL_FIELD_NUMBER: _ClassVar[int]
            DEFAULT_BIN_VALUE_FIELD_NUMBER: _ClassVar[int]
            DEFAULT_EXPRESSION_FIELD_NUMBER: _ClassVar[int]
            UPDATE_EXPRESSION_FIELD_NUMBER: _ClassVar[int]
            default_value: str
            update_value: str
            default_null: bool
            default_bin_value: bytes
            default_expression: str
            update_expression: str
            def __init__(self, default_value: _Optional[str] = ..., update_value: _Optional[str] = ..., default_null: _Optional[bool] = ..., default_bin_value: _Optional[bytes] = ..., default_expression: _Optional[str] = ..., update_expression: _Optional[str] = ...) -> None: ...
        class FieldConstraints(_message.Message):
            __slots__ = ("is_nullable", "is_unsigned", "is_notnull", "is_unique", "expression")
            IS_NULLABLE_FIELD_NUMBER: _ClassVar[int]
            IS_UNSIGNED_FIELD_NUMBER: _ClassVar[int]
            IS_NOTNULL_FIELD_NUMBER: _ClassVar[int]
            IS_UNIQUE_FIELD_NUMBER: _ClassVar[int]
            EXPRESSION_FIELD_NUMBER: _ClassVar[int]
            is_nullable: bool
            is_unsigned: bool
            is_notnull: bool
            is_unique: bool
            expression: _containers.RepeatedScalarFieldContainer[str]
            def __init__(self, is_nullable: _Optional[bool] = ..., is_unsigned: _Optional[bool] = ..., is_notnull: _Optional[bool] = ..., is_unique: _Optional[bool] = ..., expression: _Optional[_Iterable[str]] = ...) -> None: ...
        class NumericFieldOptions(_message.Message):
            __slots__ = ("is_autoincrement", "scale", "precision")
            IS_AUTOINCREMENT_FIELD_NUMBER: _ClassVar[int]
            SCALE_FIELD_NUMBER: _ClassVar[int]
            PRECISION_FIELD_NUMBER: _ClassVar[int]
            is_autoincrement: bool
            scale: int
            precision: int
            def __init__(self, is_autoincrement: _Optional[bool] = ..., scale: _Optional[int] = ..., precision: _Optional[int] = ...) -> None: ...
        class StringFieldOptions(_message.Message):
            __slots__ = ("is_fixed_width", "length", "collation_id", "collation")
            IS_FIXED_WIDTH_FIELD_NUMBER: _ClassVar[int]
            LENGTH_FIELD_NUMBER: _ClassVar[int]
            COLLATION_ID_FIELD_NUMBER: _ClassVar[int]
            COLLATION_FIELD_NUMBER: _ClassVar[int]
            is_fixed_width: bool
            length: int
            collation_id: int
            collation: str
            def __init__(self, is_fixed_width: _Optional[bool] = ..., length: _Optional[int] = ..., collation_id: _Optional[int] = ..., collation: _Optional[str] = ...) -> None: ...
        class EnumerationValues(_message.Message):
            __slots__ = ("collation_id", "collation", "field_value")
            COLLATION_ID_FIELD_NUMBER: _ClassVar[int]
            COLLATION_FIELD_NUMBER: _ClassVar[int]
            FIELD_VALUE_FIELD_NUMBER: _ClassVar[int]
            collation_id: int
            collation: str
            field_value: _containers.RepeatedScalarFieldContainer[str]
            def __init__(self, collation_id: _Optional[int] = ..., collation: _Optional[str] = ..., field_value: _Optional[_Iterable[str]] = ...) -> None: ...
        class TimeFieldOptions(_message.Message):
            __slots__ = ("microseconds",)
            MICROSECONDS_FIELD_NUMBER: _ClassVar[int]
            microseconds: bool
            def __init__(self, microseconds: _Optional[bool] = ...) -> None: ...
        NAME_FIELD_NUMBER: _ClassVar[int]
        TYPE_FIELD_NUMBER: _ClassVar[int]
        OPTIONS_FIELD_NUMBER: _ClassVar[int]
        CONSTRAINTS_FIELD_NUMBER: _ClassVar[int]
        NUMERIC_OPTIONS_FIELD_NUMBER: _ClassVar[int]
        STRING_OPTIONS_FIELD_NUMBER: _ClassVar[int]
        TIME_OPTIONS_FIELD_NUMBER: _ClassVar[int]
        COMMENT_FIELD_NUMBER: _ClassVar[int]
        ENUMERATION_VALUES_FIELD_NUMBER: _ClassVar[int]
        name: str
        type: Table.Field.FieldType
        options: Table.Field.FieldOptions
        constraints: Table.Field.FieldConstraints
        numeric_options: Table.Field.NumericFieldOptions
        string_options: Table.Field.StringFieldOptions
        time_options: Table.Field.TimeFieldOptions
        comment: str
        enumeration_values: Table.Field.EnumerationValues
        def __init__(self, name: _Optional[str] = ..., type: _Optional[_Union[Table.Field.FieldType, str]] = ..., options: _Optional[_Union[Table.Field.FieldOptions, _Mapping]] = ..., constraints: _Optional[_Union[Table.Field.FieldConstraints, _Mapping]] = ..., numeric_options: _Optional[_Union[Table.Field.NumericFieldOptions, _Mapping]] = ..., string_options: _Optional[_Union[Table.Field.StringFieldOptions, _Mapping]] = ..., time_options: _Optional[_Union[Table.Field.TimeFieldOptions, _Mapping]] = ..., comment: _Optional[str] = ..., enumeration_values: _Optional[_Union[Table.Field.EnumerationValues, _Mapping]] = ...) -> None: ...
    class Index(_message.Message):
        __slots__ = ("name", "is_primary", "is_unique", "type", "key_length", "index_part", "comment")
        class IndexType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
            __slots__ = ()
            UNKNOWN_INDEX: _ClassVar[Table.Index.IndexType]
            BTREE: _ClassVar[Table.Index.IndexType]
            RTREE: _ClassVar[Table.Index.IndexType]
            HASH: _ClassVar[Table.Index.IndexType]
            FULLTEXT: _ClassVar[Table.Index.IndexType]
            LSMTREE: _ClassVar[Table.Index.IndexType]
        UNKNOWN_INDEX: Table.Index.IndexType
        BTREE: Table.Index.IndexType
        RTREE: Table.Index.IndexType
        HASH: Table.Index.IndexType
        FULLTEXT: Table.Index.IndexType
        LSMTREE: Table.Index.IndexType
        class IndexPart(_message.Message):
            __slots__ = ("fieldnr", "compare_length", "in_reverse_order")
            FIELDNR_FIELD_NUMBER: _ClassVar[int]
            COMPARE_LENGTH_FIELD_NUMBER: _ClassVar[int]
            IN_REVERSE_ORDER_FIELD_NUMBER: _ClassVar[int]
            fieldnr: int
            compare_length: int
            in_reverse_order: bool
            def __init__(self, fieldnr: _Optional[int] = ..., compare_length: _Optional[int] = ..., in_reverse_order: _Optional[bool] = ...) -> None: ...
        NAME_FIELD_NUMBER: _ClassVar[int]
        IS_PRIMARY_FIELD_NUMBER: _ClassVar[int]
        IS_UNIQUE_FIELD_NUMBER: _ClassVar[int]
        TYPE_FIELD_NUMBER: _ClassVar[int]
        KEY_LENGTH_FIELD_NUMBER: _ClassVar[int]
        INDEX_PART_FIELD_NUMBER: _ClassVar[int]
        COMMENT_FIELD_NUMBER: _ClassVar[int]
        name: str
        is_primary: bool
        is_unique: bool
        type: Table.Index.IndexType
        key_length: int
        index_part: _containers.RepeatedCompositeFieldContainer[Table.Index.IndexPart]
        comment: str
        def __init__(self, name: _Optional[str] = ..., is_primary: _Optional[bool] = ..., is_unique: _Optional[bool] = ..., type: _Optional[_Union[Table.Index.IndexType, str]] = ..., key_length: _Optional[int] = ..., index_part: _Optional[_Iterable[_Union[Table.Index.IndexPart, _Mapping]]] = ..., comment: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    INDEXES_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    CREATION_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    engine: _engine_pb2.Engine
    field: _containers.RepeatedCompositeFieldContainer[Table.Field]
    indexes: _containers.RepeatedCompositeFieldContainer[Table.Index]
    type: Table.TableType
    schema: str
    creation_timestamp: int
    update_timestamp: int
    catalog: str
    uuid: str
    version: int
    def __init__(self, name: _Optional[str] = ..., engine: _Optional[_Union[_engine_pb2.Engine, _Mapping]] = ..., field: _Optional[_Iterable[_Union[Table.Field, _Mapping]]] = ..., indexes: _Optional[_Iterable[_Union[Table.Index, _Mapping]]] = ..., type: _Optional[_Union[Table.TableType, str]] = ..., schema: _Optional[str] = ..., creation_timestamp: _Optional[int] = ..., update_timestamp: _Optional[int] = ..., catalog: _Optional[str] = ..., uuid: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...
