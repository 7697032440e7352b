"""The driver's watchdog (replicator.pipeline.watchdog): pure, on a fake clock."""

from __future__ import annotations

import logging

import pytest

from replicator.dcp.protocol.events import StreamEndReason
from replicator.model.positions import VbucketPosition
from replicator.pipeline.watchdog import EARLY_END_LOG_INTERVAL_S, SourceWatch, StreamWatchdog
from tests.clocks import ManualClock


def at(vb: int, seqno: int) -> VbucketPosition:
    return VbucketPosition.at_boundary(vb, 0xAB, seqno)


def test_an_unasked_end_is_due_for_a_reopen_after_a_backoff_that_grows_until_progress() -> None:
    clock = ManualClock()
    watchdog = StreamWatchdog(clock)
    first = watchdog.ended_early(3, StreamEndReason.OK, at(3, 10))
    assert watchdog.due() == [] and watchdog.waiting == 1
    clock.now += first.reopen_in_s
    assert watchdog.due() == [3] and watchdog.waiting == 0
    assert watchdog.due() == []  # handed out once

    second = watchdog.ended_early(3, StreamEndReason.OK, at(3, 10))
    third = watchdog.ended_early(3, StreamEndReason.OK, at(3, 10))
    assert first.reopen_in_s < second.reopen_in_s < third.reopen_in_s
    assert third.ends_in_a_row == 3

    watchdog.progressed([3])
    again = watchdog.ended_early(3, StreamEndReason.OK, at(3, 20))
    assert again.ends_in_a_row == 1 and again.reopen_in_s == first.reopen_in_s


def test_the_backoff_is_capped_so_a_vbucket_is_always_reopened_again() -> None:
    clock = ManualClock()
    watchdog = StreamWatchdog(clock)
    for _ in range(40):
        end = watchdog.ended_early(0, StreamEndReason.OK, at(0, 1))
    assert end.reopen_in_s == watchdog.backoff.maximum
    clock.now += watchdog.backoff.maximum
    assert watchdog.due() == [0]


def test_a_forgotten_vbucket_is_not_reopened_and_the_next_due_time_is_known() -> None:
    clock = ManualClock()
    watchdog = StreamWatchdog(clock)
    assert watchdog.seconds_until_due() is None
    watchdog.ended_early(1, StreamEndReason.FILTER_EMPTY, at(1, 5))
    watchdog.ended_early(2, StreamEndReason.OK, at(2, 5))
    watchdog.forget(1)
    assert watchdog.seconds_until_due() == pytest.approx(watchdog.backoff.initial)
    clock.now += 60.0
    assert watchdog.due() == [2]


def test_unasked_ends_of_many_vbuckets_make_one_warning_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="replicator.pipeline.watchdog")
    clock = ManualClock()
    watchdog = StreamWatchdog(clock)
    for vb in range(1024):
        watchdog.ended_early(vb, StreamEndReason.OK, at(vb, 7))
    assert len(caplog.records) == 1
    assert "vbucket 0: OK at committed seqno 7" in caplog.records[0].getMessage()
    clock.now += EARLY_END_LOG_INTERVAL_S
    watchdog.ended_early(5, StreamEndReason.OK, at(5, 7))
    assert len(caplog.records) == 2
    # 1023 ends since the first line, and this one: the count says how many were not shown.
    assert "ended 1024 streams" in caplog.records[1].getMessage()
    assert watchdog.early_ends_total == 1025


def test_lag_and_a_source_behind_the_mirror_come_from_the_last_fetch() -> None:
    clock = ManualClock()
    watch = SourceWatch(30.0, clock)
    assert watch.due()
    watch.update({0: 100, 1: 40, 2: 7})
    assert not watch.due()
    committed = {0: at(0, 90), 1: at(1, 40), 2: at(2, 9)}
    assert watch.lag(committed) == 10
    assert watch.behind(committed) == [2]
    clock.now += 30.0
    assert watch.due()
