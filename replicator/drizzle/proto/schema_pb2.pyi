# replicator: generated from schema.proto sha256=33a7d671b3783d3941fe5f60d9ae431bbedcfbab96b0f105b779f8b8518fbc4d
# by `python -m replicator.drizzle.proto.regenerate`: do not edit.
# ruff: noqa
# mypy: disable-error-code="type-arg"
from replicator.drizzle.proto import engine_pb2 as _engine_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Schema(_message.Message):
    __slots__ = ("name", "collation", "engine", "catalog", "creation_timestamp", "update_timestamp", "uuid", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COLLATION_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    CREATION_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    collation: str
    engine: _engine_pb2.Engine
    catalog: str
    creation_timestamp: int
    update_timestamp: int
    uuid: str
    version: int
    def __init__(self, name: _Optional[str] = ..., collation: _Optional[str] = ..., engine: _Optional[_Union[_engine_pb2.Engine, _Mapping]] = ..., catalog: _Optional[str] = ..., creation_timestamp: _Optional[int] = ..., update_timestamp: _Optional[int] = ..., uuid: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...
