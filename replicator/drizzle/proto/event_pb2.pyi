# replicator: generated from event.proto sha256=42528993f66ce7a2a4352438589c1dbfb3a8637deceead2cb1704aba1ecc12b5
# by `python -m replicator.drizzle.proto.regenerate`: do not edit.
# ruff: noqa
# mypy: disable-error-code="type-arg"
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Event(_message.Message):
    __slots__ = ("type",)
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STARTUP: _ClassVar[Event.Type]
        SHUTDOWN: _ClassVar[Event.Type]
    STARTUP: Event.Type
    SHUTDOWN: Event.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    type: Event.Type
    def __init__(self, type: _Optional[_Union[Event.Type, str]] = ...) -> None: ...
