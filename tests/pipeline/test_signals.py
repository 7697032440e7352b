"""`stop_on_signals`: the first signal asks the run to stop, the second stops it at once, and
nothing raised on the way out hides that second one."""

from __future__ import annotations

import contextlib
import signal
import threading

import pytest

from replicator.pipeline.signals import stop_on_signals


def _interrupted_then(error: BaseException | None) -> None:
    """A second SIGINT lands in a call; its clean-up then fails with `error` (or swallows it)."""
    try:
        signal.raise_signal(signal.SIGINT)
    finally:
        if error is not None:
            raise error


def test_the_first_signal_asks_to_stop_and_the_handlers_come_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    stop = threading.Event()
    with stop_on_signals(stop):
        signal.raise_signal(signal.SIGTERM)
        assert stop.is_set()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_clean_up_error_after_the_second_signal_does_not_hide_it() -> None:
    stop = threading.Event()
    with pytest.raises(KeyboardInterrupt) as raised, stop_on_signals(stop):
        signal.raise_signal(signal.SIGINT)
        _interrupted_then(RuntimeError("py4j: connection interrupted"))
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_a_second_signal_swallowed_on_the_way_still_ends_interrupted() -> None:
    stop = threading.Event()
    with pytest.raises(KeyboardInterrupt), stop_on_signals(stop):
        signal.raise_signal(signal.SIGINT)
        with contextlib.suppress(KeyboardInterrupt):
            _interrupted_then(None)


def test_an_error_without_a_second_signal_stays_that_error() -> None:
    stop = threading.Event()
    with pytest.raises(RuntimeError, match="commit failed"), stop_on_signals(stop):
        signal.raise_signal(signal.SIGTERM)
        raise RuntimeError("commit failed")
