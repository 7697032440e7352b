# replicator: generated from engine.proto sha256=a6f009063779c22c5102d482d95aaf8e994a3ca3b3c2031d012b12ca4ea4e711
# by `python -m replicator.drizzle.proto.regenerate`: do not edit.
# ruff: noqa
# mypy: disable-error-code="type-arg"
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Engine(_message.Message):
    __slots__ = ("name", "options")
    class Option(_message.Message):
        __slots__ = ("name", "state")
        NAME_FIELD_NUMBER: _ClassVar[int]
        STATE_FIELD_NUMBER: _ClassVar[int]
        name: str
        state: str
        def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    options: _containers.RepeatedCompositeFieldContainer[Engine.Option]
    def __init__(self, name: _Optional[str] = ..., options: _Optional[_Iterable[_Union[Engine.Option, _Mapping]]] = ...) -> None: ...
