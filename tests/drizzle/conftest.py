"""One private RabbitMQ broker for the test session (started on first use), and fresh queues."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from replicator.drizzle.amqp.source import AmqpSource
from replicator.drizzle.broker import LocalBroker, RabbitMQNotInstalled


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[LocalBroker]:
    """A RabbitMQ node of the session's own, on free loopback ports; stopped at the end, with
    nothing of it left running."""
    broker = LocalBroker()
    try:
        broker.start()
    except RabbitMQNotInstalled as error:
        if os.environ.get("CI"):
            # CI installs it (.ci/run): a skip there would hide a broken install step.
            pytest.fail(f"{error} (CI must install it: see .ci/run)")
        pytest.skip(str(error))
    yield broker
    broker.stop()
    left = broker.leftover_processes()
    assert left == [], f"processes of broker {broker.node_name} outlived its stop(): {left}"


@pytest.fixture
def queue_source(rabbitmq: LocalBroker, request: pytest.FixtureRequest) -> AmqpSource:
    """A queue name no other test uses, on the session's broker (the queue is not created)."""
    return rabbitmq.source(f"{request.node.name[:80]}-{secrets.token_hex(4)}")
