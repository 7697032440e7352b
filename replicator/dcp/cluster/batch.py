"""What `DcpClient.poll` hands out: a batch of events and the flow-control receipt that
acknowledges them once the layer above staged them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from replicator.dcp.protocol.events import DocumentChanges, StreamEvent


class AckReceipt:
    """Bytes per connection that a batch's events occupied in the producers' windows.

    Redeemable once (by `DcpClient.acknowledge`): acknowledging twice would over-open a window.
    """

    __slots__ = ("_byte_counts", "_taken")

    def __init__(self, byte_counts: Mapping[int, int]) -> None:
        self._byte_counts = dict(byte_counts)
        self._taken = False

    @property
    def total_bytes(self) -> int:
        return sum(self._byte_counts.values())

    @property
    def redeemed(self) -> bool:
        return self._taken

    def take(self) -> dict[int, int]:
        """The byte counts, once; ValueError on a second call."""
        if self._taken:
            raise ValueError("this batch was already acknowledged")
        self._taken = True
        return dict(self._byte_counts)


@dataclass(frozen=True, slots=True)
class EventBatch:
    """What one `poll` returns: events in per-vbucket order and the receipt to acknowledge.

    `events` is what the connections handed up: data messages as `DocumentChanges` runs (one
    per vbucket and socket read, column by column), everything else as typed events. Iterating
    the batch gives every message as a typed event instead, runs expanded into Mutation,
    Deletion and Expiration events: simpler to read, slower for a bulk consumer.
    """

    events: tuple[StreamEvent, ...]
    receipt: AckReceipt

    def __iter__(self) -> Iterator[StreamEvent]:
        for event in self.events:
            if type(event) is DocumentChanges:
                yield from event.events()
            else:
                yield event

    def __len__(self) -> int:
        """Messages in the batch (a run counts each of its rows)."""
        return sum(message_count(event) for event in self.events)

    def __bool__(self) -> bool:
        return bool(self.events)


def message_count(event: StreamEvent) -> int:
    """Messages an event stands for: a run counts each of its rows."""
    return len(event) if type(event) is DocumentChanges else 1
