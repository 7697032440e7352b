"""`stop_on_signals`: the first signal asks the run to stop, the second stops it at once, and
nothing raised on the way out hides that second one."""

from __future__ import annotations

import contextlib
import logging
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


def _py4j_reports_an_interrupted_call() -> None:
    """What py4j logs when a KeyboardInterrupt lands in a gateway call (py4j 0.10.9)."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        logging.exception("KeyboardInterrupt while sending command.")
        logging.exception("Exception while sending command.")
        logging.getLogger("py4j.clientserver").exception(
            "Exception occurred while shutting down connection"
        )


def test_py4j_s_reports_of_the_second_signal_are_dropped_and_only_those(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = threading.Event()
    py4j_level = logging.getLogger("py4j").level
    with pytest.raises(KeyboardInterrupt), stop_on_signals(stop):
        signal.raise_signal(signal.SIGINT)
        _py4j_reports_an_interrupted_call()  # not after one signal: kept
        with contextlib.suppress(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        _py4j_reports_an_interrupted_call()  # after the second: dropped
        logging.error("another error on the root logger")
    assert logging.getLogger("py4j").level == py4j_level
    _py4j_reports_an_interrupted_call()  # the filter goes with the handlers
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    reports = [
        "KeyboardInterrupt while sending command.",
        "Exception while sending command.",
        "Exception occurred while shutting down connection",
    ]
    assert messages == [*reports, "another error on the root logger", *reports]
