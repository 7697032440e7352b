# replicator: generated from transaction.proto sha256=693b1369e79103322f38aabfd86263e7d688c84205b3486b64610bf3aa12abad
# by `python -m replicator.drizzle.proto.regenerate`: do not edit.
# ruff: noqa
# mypy: disable-error-code="type-arg"
from replicator.drizzle.proto import table_pb2 as _table_pb2
from replicator.drizzle.proto import schema_pb2 as _schema_pb2
from replicator.drizzle.proto import event_pb2 as _event_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FieldMetadata(_message.Message):
    __slots__ = ("type", "name")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    type: _table_pb2.Table.Field.FieldType
    name: str
    def __init__(self, type: _Optional[_Union[_table_pb2.Table.Field.FieldType, str]] = ..., name: _Optional[str] = ...) -> None: ...

class TableMetadata(_message.Message):
    __slots__ = ("schema_name", "table_name", "catalog_name")
    SCHEMA_NAME_FIELD_NUMBER: _ClassVar[int]
    TABLE_NAME_FIELD_NUMBER: _ClassVar[int]
    CATALOG_NAME_FIELD_NUMBER: _ClassVar[int]
    schema_name: str
    table_name: str
    catalog_name: str
    def __init__(self, schema_name: _Optional[str] = ..., table_name: _Optional[str] = ..., catalog_name: _Optional[str] = ...) -> None: ...

class TransactionContext(_message.Message):
    __slots__ = ("server_id", "transaction_id", "start_timestamp", "end_timestamp")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    END_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    server_id: int
    transaction_id: int
    start_timestamp: int
    end_timestamp: int
    def __init__(self, server_id: _Optional[int] = ..., transaction_id: _Optional[int] = ..., start_timestamp: _Optional[int] = ..., end_timestamp: _Optional[int] = ...) -> None: ...

class InsertRecord(_message.Message):
    __slots__ = ("insert_value", "is_null")
    INSERT_VALUE_FIELD_NUMBER: _ClassVar[int]
    IS_NULL_FIELD_NUMBER: _ClassVar[int]
    insert_value: _containers.RepeatedScalarFieldContainer[bytes]
    is_null: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, insert_value: _Optional[_Iterable[bytes]] = ..., is_null: _Optional[_Iterable[bool]] = ...) -> None: ...

class InsertHeader(_message.Message):
    __slots__ = ("table_metadata", "field_metadata")
    TABLE_METADATA_FIELD_NUMBER: _ClassVar[int]
    FIELD_METADATA_FIELD_NUMBER: _ClassVar[int]
    table_metadata: TableMetadata
    field_metadata: _containers.RepeatedCompositeFieldContainer[FieldMetadata]
    def __init__(self, table_metadata: _Optional[_Union[TableMetadata, _Mapping]] = ..., field_metadata: _Optional[_Iterable[_Union[FieldMetadata, _Mapping]]] = ...) -> None: ...

class InsertData(_message.Message):
    __slots__ = ("segment_id", "end_segment", "record")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    END_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    end_segment: bool
    record: _containers.RepeatedCompositeFieldContainer[InsertRecord]
    def __init__(self, segment_id: _Optional[int] = ..., end_segment: _Optional[bool] = ..., record: _Optional[_Iterable[_Union[InsertRecord, _Mapping]]] = ...) -> None: ...

class UpdateRecord(_message.Message):
    __slots__ = ("key_value", "after_value", "before_value", "is_null")
    KEY_VALUE_FIELD_NUMBER: _ClassVar[int]
    AFTER_VALUE_FIELD_NUMBER: _ClassVar[int]
    BEFORE_VALUE_FIELD_NUMBER: _ClassVar[int]
    IS_NULL_FIELD_NUMBER: _ClassVar[int]
    key_value: _containers.RepeatedScalarFieldContainer[bytes]
    after_value: _containers.RepeatedScalarFieldContainer[bytes]
    before_value: _containers.RepeatedScalarFieldContainer[bytes]
    is_null: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, key_value: _Optional[_Iterable[bytes]] = ..., after_value: _Optional[_Iterable[bytes]] = ..., before_value: _Optional[_Iterable[bytes]] = ..., is_null: _Optional[_Iterable[bool]] = ...) -> None: ...

class UpdateHeader(_message.Message):
    __slots__ = ("table_metadata", "key_field_metadata", "set_field_metadata")
    TABLE_METADATA_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_METADATA_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_METADATA_FIELD_NUMBER: _ClassVar[int]
    table_metadata: TableMetadata
    key_field_metadata: _containers.RepeatedCompositeFieldContainer[FieldMetadata]
    set_field_metadata: _containers.RepeatedCompositeFieldContainer[FieldMetadata]
    def __init__(self, table_metadata: _Optional[_Union[TableMetadata, _Mapping]] = ..., key_field_metadata: _Optional[_Iterable[_Union[FieldMetadata, _Mapping]]] = ..., set_field_metadata: _Optional[_Iterable[_Union[FieldMetadata, _Mapping]]] = ...) -> None: ...

class UpdateData(_message.Message):
    __slots__ = ("segment_id", "end_segment", "record")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    END_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    end_segment: bool
    record: _containers.RepeatedCompositeFieldContainer[UpdateRecord]
    def __init__(self, segment_id: _Optional[int] = ..., end_segment: _Optional[bool] = ..., record: _Optional[_Iterable[_Union[UpdateRecord, _Mapping]]] = ...) -> None: ...

class DeleteRecord(_message.Message):
    __slots__ = ("key_value",)
    KEY_VALUE_FIELD_NUMBER: _ClassVar[int]
    key_value: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, key_value: _Optional[_Iterable[bytes]] = ...) -> None: ...

class DeleteHeader(_message.Message):
    __slots__ = ("table_metadata", "key_field_metadata")
    TABLE_METADATA_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_METADATA_FIELD_NUMBER: _ClassVar[int]
    table_metadata: TableMetadata
    key_field_metadata: _containers.RepeatedCompositeFieldContainer[FieldMetadata]
    def __init__(self, table_metadata: _Optional[_Union[TableMetadata, _Mapping]] = ..., key_field_metadata: _Optional[_Iterable[_Union[FieldMetadata, _Mapping]]] = ...) -> None: ...

class DeleteData(_message.Message):
    __slots__ = ("segment_id", "end_segment", "record")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    END_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    end_segment: bool
    record: _containers.RepeatedCompositeFieldContainer[DeleteRecord]
    def __init__(self, segment_id: _Optional[int] = ..., end_segment: _Optional[bool] = ..., record: _Optional[_Iterable[_Union[DeleteRecord, _Mapping]]] = ...) -> None: ...

class TruncateTableStatement(_message.Message):
    __slots__ = ("table_metadata",)
    TABLE_METADATA_FIELD_NUMBER: _ClassVar[int]
    table_metadata: TableMetadata
    def __init__(self, table_metadata: _Optional[_Union[TableMetadata, _Mapping]] = ...) -> None: ...

class CreateSchemaStatement(_message.Message):
    __slots__ = ("schema",)
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    schema: _schema_pb2.Schema
    def __init__(self, schema: _Optional[_Union[_schema_pb2.Schema, _Mapping]] = ...) -> None: ...

class AlterSchemaStatement(_message.Message):
    __slots__ = ("before", "after")
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    before: _schema_pb2.Schema
    after: _schema_pb2.Schema
    def __init__(self, before: _Optional[_Union[_schema_pb2.Schema, _Mapping]] = ..., after: _Optional[_Union[_schema_pb2.Schema, _Mapping]] = ...) -> None: ...

class DropSchemaStatement(_message.Message):
    __slots__ = ("schema_name", "catalog_name")
    SCHEMA_NAME_FIELD_NUMBER: _ClassVar[int]
    CATALOG_NAME_FIELD_NUMBER: _ClassVar[int]
    schema_name: str
    catalog_name: str
    def __init__(self, schema_name: _Optional[str] = ..., catalog_name: _Optional[str] = ...) -> None: ...

class CreateTableStatement(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: _table_pb2.Table
    def __init__(self, table: _Optional[_Union[_table_pb2.Table, _Mapping]] = ...) -> None: ...

class AlterTableStatement(_message.Message):
    __slots__ = ("before", "after")
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    before: _table_pb2.Table
    after: _table_pb2.Table
    def __init__(self, before: _Optional[_Union[_table_pb2.Table, _Mapping]] = ..., after: _Optional[_Union[_table_pb2.Table, _Mapping]] = ...) -> None: ...

class DropTableStatement(_message.Message):
    __slots__ = ("table_metadata", "if_exists_clause")
    TABLE_METADATA_FIELD_NUMBER: _ClassVar[int]
    IF_EXISTS_CLAUSE_FIELD_NUMBER: _ClassVar[int]
    table_metadata: TableMetadata
    if_exists_clause: bool
    def __init__(self, table_metadata: _Optional[_Union[TableMetadata, _Mapping]] = ..., if_exists_clause: _Optional[bool] = ...) -> None: ...

class SetVariableStatement(_message.Message):
    __slots__ = ("variable_metadata", "variable_value")
    VARIABLE_METADATA_FIELD_NUMBER: _ClassVar[int]
    VARIABLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    variable_metadata: FieldMetadata
    variable_value: bytes
    def __init__(self, variable_metadata: _Optional[_Union[FieldMetadata, _Mapping]] = ..., variable_value: _Optional[bytes] = ...) -> None: ...

class Statement(_message.Message):
    __slots__ = ("type", "start_timestamp", "end_timestamp", "sql", "insert_header", "insert_data", "update_header", "update_data", "delete_header", "delete_data", "truncate_table_statement", "create_schema_statement", "drop_schema_statement", "alter_schema_statement", "create_table_statement", "alter_table_statement", "drop_table_statement", "set_variable_statement", "raw_sql_schema")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ROLLBACK: _ClassVar[Statement.Type]
        INSERT: _ClassVar[Statement.Type]
        DELETE: _ClassVar[Statement.Type]
        UPDATE: _ClassVar[Statement.Type]
        TRUNCATE_TABLE: _ClassVar[Statement.Type]
        CREATE_SCHEMA: _ClassVar[Statement.Type]
        ALTER_SCHEMA: _ClassVar[Statement.Type]
        DROP_SCHEMA: _ClassVar[Statement.Type]
        CREATE_TABLE: _ClassVar[Statement.Type]
        ALTER_TABLE: _ClassVar[Statement.Type]
        DROP_TABLE: _ClassVar[Statement.Type]
        ROLLBACK_STATEMENT: _ClassVar[Statement.Type]
        SET_VARIABLE: _ClassVar[Statement.Type]
        RAW_SQL: _ClassVar[Statement.Type]
    ROLLBACK: Statement.Type
    INSERT: Statement.Type
    DELETE: Statement.Type
    UPDATE: Statement.Type
    TRUNCATE_TABLE: Statement.Type
    CREATE_SCHEMA: Statement.Type
    ALTER_SCHEMA: Statement.Type
    DROP_SCHEMA: Statement.Type
    CREATE_TABLE: Statement.Type
    ALTER_TABLE: Statement.Type
    DROP_TABLE: Statement.Type
    ROLLBACK_STATEMENT: Statement.Type
    SET_VARIABLE: Statement.Type
    RAW_SQL: Statement.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    START_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    END_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SQL_FIELD_NUMBER: _ClassVar[int]
    INSERT_HEADER_FIELD_NUMBER: _ClassVar[int]
    INSERT_DATA_FIELD_NUMBER: _ClassVar[int]
    UPDATE_HEADER_FIELD_NUMBER: _ClassVar[int]
    UPDATE_DATA_FIELD_NUMBER: _ClassVar[int]
    DELETE_HEADER_FIELD_NUMBER: _ClassVar[int]
    DELETE_DATA_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_TABLE_STATEMENT_FIELD_NUMBER: _ClassVar[int]
    CREATE_SCHEMA_STATEMENT_FIELD_NUMBER: _ClassVar[int]
    DROP_SCHEMA_STATEMENT_FIELD_NUMBER: _ClassVar[int]
    ALTER_SCHEMA_STATEMENT_FIELD_NUMBER: _ClassVar[int]
    CREATE_TABLE_STATEMENT_FIELD_NUMBER: _ClassVar[int]
    ALTER_TABLE_STATEMENT_FIELD_NUMBER: _ClassVar[int]
    DROP_TABLE_STATEMENT_FIELD_NUMBER: _ClassVar[int]
    SET_VARIABLE_STATEMENT_FIELD_NUMBER: _ClassVar[int]
    RAW_SQL_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    type: Statement.Type
    start_timestamp: int
    end_timestamp: int
    sql: str
    insert_header: InsertHeader
    insert_data: InsertData
    update_header: UpdateHeader
    update_data: UpdateData
    delete_header: DeleteHeader
    delete_data: DeleteData
    truncate_table_statement: TruncateTableStatement
    create_schema_statement: CreateSchemaStatement
    drop_schema_statement: DropSchemaStatement
    alter_schema_statement: AlterSchemaStatement
    create_table_statement: CreateTableStatement
    alter_table_statement: AlterTableStatement
    drop_table_statement: DropTableStatement
    set_variable_statement: SetVariableStatement
    raw_sql_schema: str
    def __init__(self, type: _Optional[_Union[Statement.Type, str]] = ..., start_timestamp: _Optional[int] = ..., end_timestamp: _Optional[int] = ..., sql: _Optional[str] = ..., insert_header: _Optional[_Union[InsertHeader, _Mapping]] = ..., insert_data: _Optional[_Union[InsertData, _Mapping]] = ..., update_header: _Optional[_Union[UpdateHeader, _Mapping]] = ..., update_data: _Optional[_Union[UpdateData, _Mapping]] = ..., delete_header: _Optional[_Union[DeleteHeader, _Mapping]] = ..., delete_data: _Optional[_Union[DeleteData, _Mapping]] = ..., truncate_table_statement: _Optional[_Union[TruncateTableStatement, _Mapping]] = ..., create_schema_statement: _Optional[_Union[CreateSchemaStatement, _Mapping]] = ..., drop_schema_statement: _Optional[_Union[DropSchemaStatement, _Mapping]] = ..., alter_schema_statement: _Optional[_Union[AlterSchemaStatement, _Mapping]] = ..., create_table_statement: _Optional[_Union[CreateTableStatement, _Mapping]] = ..., alter_table_statement: _Optional[_Union[AlterTableStatement, _Mapping]] = ..., drop_table_statement: _Optional[_Union[DropTableStatement, _Mapping]] = ..., set_variable_statement: _Optional[_Union[SetVariableStatement, _Mapping]] = ..., raw_sql_schema: _Optional[str] = ...) -> None: ...

class Transaction(_message.Message):
    __slots__ = ("transaction_context", "statement", "event", "segment_id", "end_segment")
    TRANSACTION_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    END_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    transaction_context: TransactionContext
    statement: _containers.RepeatedCompositeFieldContainer[Statement]
    event: _event_pb2.Event
    segment_id: int
    end_segment: bool
    def __init__(self, transaction_context: _Optional[_Union[TransactionContext, _Mapping]] = ..., statement: _Optional[_Iterable[_Union[Statement, _Mapping]]] = ..., event: _Optional[_Union[_event_pb2.Event, _Mapping]] = ..., segment_id: _Optional[int] = ..., end_segment: _Optional[bool] = ...) -> None: ...
