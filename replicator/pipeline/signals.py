"""How a run stops on SIGTERM / SIGINT: the first finishes the commit in flight, the second
stops at once."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set `stop` on SIGTERM or SIGINT (main thread only), restoring the old handlers after.

    A second signal stops at once (KeyboardInterrupt): whatever was in flight is abandoned,
    which loses nothing, since a restart resumes from the last commit. Once it came, the block
    ends in KeyboardInterrupt whatever else surfaced: a clean-up that makes a Spark call on
    the interrupted connection (a `finally`, an `__exit__`) fails with its own error, which
    would otherwise replace the interrupt and end the run as if it had stopped cleanly. And
    py4j's reports of the interrupted gateway call are dropped from then on (tracebacks on its
    own loggers and, for "... while sending command.", on the root logger): the handler has
    said "stopping at once" in one line.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    received: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        received.append(signum)
        if len(received) > 1:
            py4j.setLevel(logging.CRITICAL + 1)
            log.warning(
                "received %s again: stopping at once; the next run resumes from the last commit",
                name,
            )
            raise KeyboardInterrupt
        log.info("received %s: finishing the current commit and stopping", name)
        stop.set()

    def not_py4j_s_report(record: logging.LogRecord) -> bool:
        return not (
            len(received) > 1
            and record.name == "root"
            and record.getMessage().endswith(" while sending command.")
        )

    py4j = logging.getLogger("py4j")
    py4j_level = py4j.level
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    logging.getLogger().addFilter(not_py4j_s_report)
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        if len(received) > 1:
            raise KeyboardInterrupt from exc
        raise
    else:
        if len(received) > 1:  # the interrupt was caught on the way and the block went on
            raise KeyboardInterrupt
    finally:
        logging.getLogger().removeFilter(not_py4j_s_report)
        py4j.setLevel(py4j_level)
        for sig, old in previous.items():
            signal.signal(sig, old)
