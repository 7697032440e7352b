"""Events received and not yet handed up by `poll`, with the flow-control bytes each holds.

One entry per socket read (or per lifecycle event), not per message; `take` cuts a batch of
up to a number of messages and counts, per connection, the bytes its receipt acknowledges.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

from replicator.dcp.cluster.batch import AckReceipt, EventBatch, message_count
from replicator.dcp.protocol.events import StreamEvent


@dataclass(slots=True)
class _Queued:
    """Events of one connection waiting for `poll`, in order: a single lifecycle event, or
    the accepted messages of one socket read (one queue entry per read, not per message)."""

    events: list[StreamEvent]
    sizes: list[int]
    """Each event's bytes in the producer's flow-control window (0 for lifecycle events)."""
    connection_id: int
    size: int
    """sum(sizes), kept so the whole entry is counted without a pass over it."""
    messages: int = 1
    """Messages in `events` (a DocumentChanges run counts its rows)."""
    releases_stream: bool = False
    """Handing this (single) StreamEnd up lets the vbucket's stream be reopened."""


class EventQueue:
    """The events waiting for `poll`, in arrival order. The caller holds the client's lock."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: collections.deque[_Queued] = collections.deque()

    def __bool__(self) -> bool:
        return bool(self._entries)

    @property
    def size(self) -> int:
        """Bytes of producer messages queued."""
        return sum(queued.size for queued in self._entries)

    def add(
        self, event: StreamEvent, connection_id: int, size: int, *, releases_stream: bool = False
    ) -> None:
        """Queue one event (a lifecycle event, or a StreamEnd with its wire bytes)."""
        self._entries.append(_Queued([event], [size], connection_id, size, 1, releases_stream))

    def add_read(self, events: list[StreamEvent], sizes: list[int], connection_id: int) -> None:
        """Queue the accepted messages of one socket read as one entry (none: nothing)."""
        if events:
            messages = sum(message_count(event) for event in events)
            self._entries.append(_Queued(events, sizes, connection_id, sum(sizes), messages))

    def take(self, limit: int, release: Callable[[int], None]) -> EventBatch:
        """Up to `limit` messages, or one run of more (runs are never split).

        `release(vbucket)` is called for each StreamEnd taken that lets its stream reopen.
        """
        events: list[StreamEvent] = []
        counts: dict[int, int] = collections.defaultdict(int)
        taken_messages = 0
        while self._entries and taken_messages < limit:
            queued = self._entries[0]
            room = limit - taken_messages
            if queued.messages > room:
                # Split the entry between events (a run stays whole: it goes past the limit
                # only when it is the batch's first event); the rest stays queued, with the
                # bytes it still holds.
                split = 0
                while split < len(queued.events) and room > 0:
                    weight = message_count(queued.events[split])
                    if weight > room and (split or events):
                        break
                    room -= weight
                    split += 1
                if split == 0:
                    break
                part = queued.events[:split]
                events.extend(part)
                taken = sum(queued.sizes[:split])
                del queued.events[:split], queued.sizes[:split]
                queued.size -= taken
                queued.messages -= sum(message_count(event) for event in part)
                if taken:
                    counts[queued.connection_id] += taken
                break
            self._entries.popleft()
            taken_messages += queued.messages
            events.extend(queued.events)
            if queued.size:
                counts[queued.connection_id] += queued.size
            if queued.releases_stream:
                release(queued.events[0].vbucket)
        return EventBatch(tuple(events), AckReceipt(counts))
