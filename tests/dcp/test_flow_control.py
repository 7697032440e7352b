"""Flow-control accounting: ack at ~20% of the window, only staged bytes, never a stall."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicator.dcp.transport.flow_control import FlowControl


def test_nothing_is_acknowledged_on_receipt() -> None:
    fc = FlowControl(window_bytes=1000)
    fc.received(900)
    assert fc.unacknowledged_bytes == 900
    assert fc.unstaged_bytes == 900
    assert fc.flush() == 0  # nothing staged yet


def test_ack_once_staged_bytes_reach_a_fifth_of_the_window() -> None:
    fc = FlowControl(window_bytes=1000)
    fc.received(500)
    assert fc.staged(100) == 0
    assert fc.staged(99) == 0
    assert fc.staged(1) == 200
    assert fc.unacknowledged_bytes == 300
    assert fc.acknowledged_total == 200


def test_flush_acknowledges_what_is_staged_below_the_threshold() -> None:
    fc = FlowControl(window_bytes=1000)
    fc.received(50)
    fc.staged(50)
    assert fc.flush() == 50
    assert fc.unacknowledged_bytes == 0


def test_staging_more_than_received_is_a_bug_caught_early() -> None:
    fc = FlowControl(window_bytes=1000)
    fc.received(10)
    with pytest.raises(ValueError, match="acknowledged twice"):
        fc.staged(11)


@pytest.mark.parametrize(("window", "ratio"), [(0, 0.2), (2**32, 0.2), (100, 0.0), (100, 1.5)])
def test_invalid_settings(window: int, ratio: float) -> None:
    with pytest.raises(ValueError):
        FlowControl(window_bytes=window, ack_ratio=ratio)


@given(
    window=st.integers(min_value=1, max_value=5000),
    sizes=st.lists(st.integers(min_value=24, max_value=3000), min_size=1, max_size=300),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_a_producer_that_respects_the_window_never_stalls(
    window: int, sizes: list[int], seed: int
) -> None:
    """Simulate a producer that sends while sent-unacked < window and a consumer that stages
    what it received in random-sized chunks: every message is eventually delivered."""
    rng = random.Random(seed)
    fc = FlowControl(window_bytes=window)
    producer_unacked = 0
    to_send = list(sizes)
    delivered_unstaged: list[int] = []
    steps = 0
    while to_send or delivered_unstaged:
        steps += 1
        assert steps < 10 * len(sizes) + 100, "stalled"
        # The producer sends as long as the window has any room (even an oversized item).
        while to_send and producer_unacked < window:
            size = to_send.pop(0)
            producer_unacked += size
            fc.received(size)
            delivered_unstaged.append(size)
        # Bounded: what is delivered but not staged never exceeds window + one item.
        assert sum(delivered_unstaged) < window + max(sizes)
        take = rng.randint(1, len(delivered_unstaged))
        for _ in range(take):
            producer_unacked -= fc.staged(delivered_unstaged.pop(0))
        assert producer_unacked == fc.unacknowledged_bytes
    assert fc.unstaged_bytes == 0
