"""Requests in flight and their replies: process-wide opaques, and matching each response to
the request that carries the same opaque.

The table has no lock of its own: the connection's lock guards it together with the bytes
queued for sending, so a request and its bytes are queued (or failed) as one.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from replicator.dcp.protocol.codec import ClientRequest
from replicator.dcp.protocol.opcodes import Datatype
from replicator.dcp.protocol.responses import Response
from replicator.dcp.protocol.values import decompress_value
from replicator.errors import ReplicatorError

_opaques = itertools.count(1)
_opaque_lock = threading.Lock()


def next_opaque() -> int:
    """A process-wide unique request opaque (non-zero u32)."""
    with _opaque_lock:
        while True:
            value = next(_opaques) & 0xFFFFFFFF
            if value:
                return value


ResponseHandler = Callable[[Response], None]


@dataclass(slots=True)
class PendingRequest:
    """A request sent and not yet answered: its reply resolves `future`."""

    request: ClientRequest
    future: Future[Response]
    on_response: ResponseHandler | None

    def complete(self, response: Response) -> None:
        """The reply came: run the handler first, then resolve the future."""
        if self.on_response is not None:
            self.on_response(response)
        if not self.future.done():
            self.future.set_result(response)

    def fail(self, error: ReplicatorError) -> None:
        """No reply will come (the connection closed or broke)."""
        if not self.future.done():
            self.future.set_exception(error)


class PendingRequests:
    """Requests awaiting a reply, by opaque. The caller holds the connection's lock."""

    __slots__ = ("_by_opaque",)

    def __init__(self) -> None:
        self._by_opaque: dict[int, PendingRequest] = {}

    def add(self, entry: PendingRequest) -> None:
        self._by_opaque[entry.request.opaque] = entry

    def match(self, response: Response) -> PendingRequest | None:
        """The request `response` answers, taken out of the table; None when none waits."""
        return self._by_opaque.pop(response.opaque, None)

    def take_all(self) -> list[PendingRequest]:
        """Every request still waiting, the table emptied (to fail them outside the lock)."""
        entries = list(self._by_opaque.values())
        self._by_opaque.clear()
        return entries


def response_value(response: Response) -> bytes:
    """A reply's value, decompressed when the node sent it snappy-compressed."""
    if response.datatype & Datatype.SNAPPY:
        return decompress_value(response.value, opcode=response.opcode)
    return response.value
