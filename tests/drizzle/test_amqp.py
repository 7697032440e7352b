"""Drizzle Transaction messages through a real RabbitMQ broker: publish, consume, acknowledge,
redeliver; the connection string; the errors an operator meets."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from replicator.drizzle.amqp.connection import ConnectionSettings, check_source
from replicator.drizzle.amqp.consumer import Delivery, TransactionConsumer
from replicator.drizzle.amqp.errors import (
    BrokerAuthenticationError,
    BrokerConnectionLost,
    BrokerUnreachableError,
    QueueNotFoundError,
)
from replicator.drizzle.amqp.publisher import TransactionPublisher
from replicator.drizzle.amqp.source import AmqpSource
from replicator.drizzle.assembly import (
    MessageSkipped,
    TransactionAssembler,
    TransactionCompleted,
    TransactionRolledBack,
)
from replicator.drizzle.broker import (
    INSTALL_COMMAND,
    LocalBroker,
    RabbitMQNotInstalled,
    broker_processes,
    find_rabbitmq_server,
    free_port,
)
from replicator.drizzle.changes import CompleteTransaction
from replicator.drizzle.decode import decode_transaction
from replicator.drizzle.proto.transaction_pb2 import Transaction
from replicator.drizzle.state import SourceDatabase
from replicator.drizzle.workload import TransactionKind, Workload, WorkloadSettings
from replicator.errors import ConfigError, NodeUnreachableError

# Small segments and bulk statements: many multi-segment transactions in few messages.
SETTINGS = WorkloadSettings(seed=25, segment_bytes=2048, bulk_rows=60)
COUNT = 120
WAIT_S = 15.0
"""Longest wait for one delivery the broker has ready: generous for a loaded 2-core machine."""


def take(consumer: TransactionConsumer, count: int) -> list[Delivery]:
    deliveries: list[Delivery] = []
    for _ in range(count):
        delivery = consumer.next_delivery(WAIT_S)
        assert delivery is not None, f"only {len(deliveries)} of {count} deliveries came"
        deliveries.append(delivery)
    return deliveries


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.1)


def listens(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=5.0):
        return True


def publish_workload(source: AmqpSource, count: int = COUNT) -> tuple[Workload, list[bytes]]:
    workload = Workload(SETTINGS)
    bodies = list(workload.serialized(count))
    with TransactionPublisher(source) as publisher:
        assert publisher.publish_all(bodies) == len(bodies)
    return workload, bodies


# Through the broker.


def test_a_workload_goes_through_the_queue_and_assembles_into_the_producers_transactions(
    queue_source: AmqpSource,
) -> None:
    workload, bodies = publish_workload(queue_source)
    # Confirmed means queued: all of it is there before anyone consumes.
    assert check_source(queue_source) == len(bodies)
    produced = list(Workload(SETTINGS).transactions(COUNT))
    expected = {p.transaction_id: decode_transaction(p.messages) for p in produced if p.committed}
    expected_rollbacks = {p.transaction_id for p in produced if not p.committed and p.messages}

    assembler = TransactionAssembler()
    completed: dict[int, CompleteTransaction] = {}
    rolled_back: set[int] = set()
    with TransactionConsumer(queue_source) as consumer:
        deliveries = take(consumer, len(bodies))
        for delivery in deliveries:
            result = assembler.feed(
                Transaction.FromString(delivery.body), position=delivery.delivery_tag
            )
            if isinstance(result, TransactionCompleted):
                completed[result.transaction.transaction_id] = result.transaction
            elif isinstance(result, TransactionRolledBack):
                rolled_back.add(result.transaction_id)
        assert consumer.ack_through(deliveries[-1].delivery_tag) == len(bodies)

    assert [d.body for d in deliveries] == bodies  # in publishing order
    assert not any(d.redelivered for d in deliveries)
    assert [d.delivery_tag for d in deliveries] == list(range(1, len(bodies) + 1))
    assert assembler.open_transactions() == ()
    assert sorted(completed) == sorted(expected)
    assert {i: t.row_count for i, t in completed.items()} == {
        i: t.row_count for i, t in expected.items()
    }
    assert completed == expected  # and everything else in them
    assert rolled_back == expected_rollbacks
    kinds = {p.kind for p in produced}
    assert {TransactionKind.BULK, TransactionKind.BULK_ROLLED_BACK} <= kinds
    assert max(t.segment_count for t in completed.values()) > 2
    mirror = SourceDatabase()
    mirror.apply_all(completed[i] for i in sorted(completed))
    assert mirror.differences(workload.database) == []
    assert check_source(queue_source) == 0  # everything acknowledged: nothing went back


def test_unacknowledged_messages_come_back_after_the_connection_drops_and_are_skipped(
    rabbitmq: LocalBroker, queue_source: AmqpSource
) -> None:
    _, bodies = publish_workload(queue_source, 60)
    assembler = TransactionAssembler()
    consumer = TransactionConsumer(queue_source).connect()
    try:
        first = take(consumer, len(bodies))
        results = [
            assembler.feed(Transaction.FromString(d.body), position=d.delivery_tag) for d in first
        ]
        assert not any(isinstance(result, MessageSkipped) for result in results)
        # As after a commit of the first half: acknowledged through there, the rest not.
        half = len(first) // 2
        assert consumer.ack_through(first[half - 1].delivery_tag) == half

        rabbitmq.close_connections("test: the consumer's connection drops")
        with pytest.raises(BrokerConnectionLost, match=queue_source.queue) as lost:
            consumer.next_delivery(WAIT_S)
        assert queue_source.node in str(lost.value)

        consumer.connect()
        again = take(consumer, len(bodies) - half)
        assert [d.body for d in again] == bodies[half:]
        assert all(d.redelivered for d in again)
        # Tags go on growing across the reconnect: a tag is a position the assembler can keep.
        assert again[0].delivery_tag > first[-1].delivery_tag
        replayed = [
            assembler.feed(Transaction.FromString(d.body), position=d.delivery_tag) for d in again
        ]
        assert all(isinstance(result, MessageSkipped) for result in replayed), replayed
        # A tag from the closed connection acknowledges nothing on the new one.
        assert consumer.ack_through(first[-1].delivery_tag) == 0
        assert check_source(queue_source) == 0
        assert consumer.ack_through(again[-1].delivery_tag) == len(again)
    finally:
        consumer.close()
    assert check_source(queue_source) == 0
    with TransactionConsumer(queue_source) as consumer:
        assert consumer.next_delivery(0.2) is None


def test_a_transaction_open_when_the_connection_drops_is_assembled_from_its_redelivery(
    rabbitmq: LocalBroker, queue_source: AmqpSource
) -> None:
    workload, bodies = publish_workload(queue_source)
    produced = list(Workload(SETTINGS).transactions(COUNT))
    expected = {p.transaction_id for p in produced if p.committed}
    assembler = TransactionAssembler()
    committed: dict[int, CompleteTransaction] = {}
    consumer = TransactionConsumer(queue_source).connect()
    try:
        # Read until a transaction completes while an earlier-started bulk one is still open
        # (it committed while the bulk one ran), and commit what completed.
        deliveries = iter(take(consumer, len(bodies)))
        while True:
            delivery = next(deliveries)
            result = assembler.feed(
                Transaction.FromString(delivery.body), position=delivery.delivery_tag
            )
            if not isinstance(result, TransactionCompleted):
                continue
            committed[result.transaction.transaction_id] = result.transaction
            oldest = assembler.oldest_open_position()
            if len(committed) > 10 and oldest is not None and result.positions[0] > oldest:
                break
        open_ids = {t.transaction_id for t in assembler.open_transactions()}
        oldest_open = assembler.oldest_open_position()
        assert oldest_open is not None
        acknowledged = consumer.ack_through(oldest_open - 1)
        assert acknowledged == oldest_open - 1

        rabbitmq.close_connections("test: the consumer's connection drops mid-transaction")
        with pytest.raises(BrokerConnectionLost):
            consumer.next_delivery(WAIT_S)
        consumer.connect()
        # As the module says: after a reconnect, assembly restarts from what was finished;
        # the open transactions' segments all come back, under new tags.
        assembler = TransactionAssembler(completed=assembler.completed_ids())
        again = take(consumer, len(bodies) - acknowledged)
        assert [d.body for d in again] == bodies[acknowledged:]
        skipped = 0
        for delivery in again:
            result = assembler.feed(
                Transaction.FromString(delivery.body), position=delivery.delivery_tag
            )
            if isinstance(result, MessageSkipped):
                assert result.transaction_id in committed, result
                skipped += 1
            elif isinstance(result, TransactionCompleted):
                transaction_id = result.transaction.transaction_id
                assert transaction_id not in committed, f"{transaction_id} completed twice"
                committed[transaction_id] = result.transaction
        assert skipped > 0
        assert consumer.ack_through(again[-1].delivery_tag) == len(again)
    finally:
        consumer.close()
    assert open_ids <= set(committed)
    assert set(committed) == expected
    mirror = SourceDatabase()
    mirror.apply_all(committed[i] for i in sorted(committed))
    assert mirror.differences(workload.database) == []
    assert check_source(queue_source) == 0


def test_ack_through_acknowledges_exactly_the_deliveries_up_to_its_tag(
    queue_source: AmqpSource,
) -> None:
    bodies = [f"message {n}".encode() for n in range(10)]
    with TransactionPublisher(queue_source) as publisher:
        publisher.publish_all(bodies)

    with TransactionConsumer(queue_source, prefetch=4) as consumer:
        got = take(consumer, 4)
        # The window is full: the broker holds the other six back until something is acked.
        assert consumer.window_full
        assert check_source(queue_source) == 6
        assert consumer.next_delivery(0.2) is None
        with pytest.raises(ValueError, match="not handed out"):
            consumer.ack_through(got[-1].delivery_tag + 1)
        assert consumer.ack_through(got[1].delivery_tag) == 2
        assert consumer.ack_through(got[0].delivery_tag) == 0  # acknowledged already
        assert consumer.unacknowledged == 2
        got += take(consumer, 2)
        assert [d.body for d in got] == bodies[:6]
    # Closed with 2..5 unacknowledged: those come back, marked; 0 and 1 never do.
    with TransactionConsumer(queue_source) as consumer:
        back = take(consumer, 8)
        assert consumer.next_delivery(0.2) is None
    assert [d.body for d in back] == bodies[2:]
    assert [d.redelivered for d in back] == [True] * 4 + [False] * 4


@pytest.mark.slow
def test_confirmed_messages_survive_a_broker_restart(
    rabbitmq: LocalBroker, queue_source: AmqpSource
) -> None:
    _, bodies = publish_workload(queue_source, 20)
    consumer = TransactionConsumer(queue_source).connect()
    try:
        delivered = take(consumer, len(bodies))
        assert consumer.ack_through(delivered[1].delivery_tag) == 2
        rabbitmq.restart()
        with pytest.raises(BrokerConnectionLost):
            consumer.next_delivery(WAIT_S)
        consumer.connect()  # the same address: the node kept its ports, user and data
        back = take(consumer, len(bodies) - 2)
        assert consumer.next_delivery(0.2) is None
    finally:
        consumer.close()
    # Durable queue, persistent messages, confirmed: all there but the two acknowledged.
    assert [d.body for d in back] == bodies[2:]
    assert back[0].delivery_tag > delivered[-1].delivery_tag


def test_a_queue_deleted_under_the_consumer_is_named(
    rabbitmq: LocalBroker, queue_source: AmqpSource
) -> None:
    with TransactionPublisher(queue_source) as publisher:
        publisher.publish(b"one")
    with TransactionConsumer(queue_source) as consumer:
        assert take(consumer, 1)[0].body == b"one"
        rabbitmq.rabbitmqctl("delete_queue", "--vhost", queue_source.vhost, queue_source.queue)
        with pytest.raises(QueueNotFoundError, match="cancelled the consumer") as gone:
            consumer.next_delivery(WAIT_S)
        assert gone.value.queue == queue_source.queue
        assert not consumer.connected


# The errors an operator meets.


def test_a_wrong_password_is_refused_naming_the_user_never_the_password(
    rabbitmq: LocalBroker, queue_source: AmqpSource, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "not-the-password-Zq81"
    wrong = dataclasses.replace(queue_source, password=secret)
    caplog.set_level(logging.DEBUG)
    for connect in (
        lambda: TransactionConsumer(wrong).connect(),
        lambda: TransactionPublisher(wrong).connect(),
        lambda: check_source(wrong),
    ):
        with pytest.raises(BrokerAuthenticationError) as refused:
            connect()
        text = str(refused.value)
        assert f"user {rabbitmq.username!r}" in text
        assert f"127.0.0.1:{rabbitmq.port}" in text
        assert "wrong password" in text
        shown = "".join(traceback.format_exception(refused.value))
        assert secret not in shown
    assert secret not in caplog.text
    assert secret not in repr(wrong) and secret not in str(wrong)
    assert rabbitmq.password not in caplog.text


def test_an_unreachable_broker_is_named_with_what_to_do() -> None:
    port = free_port()  # nothing listens there
    source = AmqpSource("127.0.0.1", "transactions", port=port, username="app", password="pw-x1")
    with pytest.raises(BrokerUnreachableError) as unreachable:
        TransactionConsumer(source).connect()
    text = str(unreachable.value)
    assert text.startswith(f"127.0.0.1:{port}: ")
    assert "queue 'transactions'" in text
    assert "connection refused" in text
    assert "is RabbitMQ running" in text
    assert "pw-x1" not in "".join(traceback.format_exception(unreachable.value))
    assert isinstance(unreachable.value, NodeUnreachableError)


def test_a_listener_that_never_speaks_amqp_is_named() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        source = AmqpSource("127.0.0.1", "transactions", port=port)
        with pytest.raises(BrokerUnreachableError, match="no AMQP handshake in time"):
            check_source(source, settings=ConnectionSettings(connect_timeout_s=0.5))


def test_a_missing_queue_is_named_and_not_created(queue_source: AmqpSource) -> None:
    with pytest.raises(QueueNotFoundError) as missing:
        TransactionConsumer(queue_source).connect()
    assert missing.value.queue == queue_source.queue
    assert f"queue {queue_source.queue!r} in vhost {queue_source.vhost!r}" in str(missing.value)
    assert "start the producer first" in str(missing.value)
    with pytest.raises(QueueNotFoundError):
        check_source(queue_source)  # the consumer declared nothing


def test_rabbitmq_missing_names_the_command_that_installs_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("replicator.drizzle.broker.DEBIAN_SCRIPTS", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RabbitMQNotInstalled, match=f"`{INSTALL_COMMAND}`"):
        LocalBroker().start()
    # Debian's /usr/sbin/rabbitmq-server switches user and directories: not one to run.
    (tmp_path / "rabbitmq-script-wrapper").write_text("#!/bin/sh\n")
    (tmp_path / "rabbitmq-script-wrapper").chmod(0o755)
    (tmp_path / "rabbitmq-server").symlink_to(tmp_path / "rabbitmq-script-wrapper")
    with pytest.raises(RabbitMQNotInstalled):
        find_rabbitmq_server()


@pytest.mark.slow
def test_a_broker_whose_owner_dies_leaves_nothing_running(
    rabbitmq: LocalBroker, tmp_path: Path
) -> None:
    # The session's broker proves rabbitmq-server is here; this one is started by a child
    # process, which is then killed without a chance to stop it.
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import json, sys\n"
            "from pathlib import Path\n"
            "from replicator.drizzle.broker import BrokerSettings, LocalBroker\n"
            f"broker = LocalBroker(BrokerSettings(base_dir=Path({str(tmp_path)!r}))).start()\n"
            "print(json.dumps({'id': broker.broker_id, 'port': broker.port}), flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert owner.stdout is not None
        started = json.loads(owner.stdout.readline() or "{}")
        assert started, f"the owner exited with {owner.wait()} before starting its broker"
        assert broker_processes(started["id"])
        assert listens(started["port"])
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        wait_until(
            lambda: not broker_processes(started["id"]),
            60.0,
            f"the processes of broker {started['id']} to end after their owner died",
        )
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        shutil.rmtree(tmp_path, ignore_errors=True)


# The connection string (no broker needed).


def test_a_connection_string_with_everything() -> None:
    source = AmqpSource.parse(
        "drizzle+amqp://app%40shop:p%2Fw%3Fd@mq.example:5673/tx%2Fone?vhost=%2Fprod"
    )
    assert (source.host, source.port, source.queue, source.vhost) == (
        "mq.example",
        5673,
        "tx/one",
        "/prod",
    )
    assert (source.username, source.password) == ("app@shop", "p/w?d")
    assert str(source) == "drizzle+amqp://app%40shop@mq.example:5673/tx%2Fone?vhost=%2Fprod"
    assert "p/w?d" not in repr(source) and "p%2Fw" not in repr(source)
    assert AmqpSource.parse(source.url(with_password=True)) == source


def test_a_connection_string_with_defaults() -> None:
    source = AmqpSource.parse("drizzle+amqp://localhost/transactions")
    assert source == AmqpSource("localhost", "transactions")
    assert (source.port, source.vhost, source.username, source.password) == (
        5672,
        "/",
        "guest",
        "guest",
    )
    assert str(source) == "drizzle+amqp://guest@localhost:5672/transactions"
    ipv6 = AmqpSource.parse("drizzle+amqp://app@[::1]:5700/q", password="pw")
    assert (ipv6.host, ipv6.node, ipv6.password) == ("::1", "[::1]:5700", "pw")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("amqp://h/q", "starts drizzle\\+amqp://"),
        ("drizzle+amqp:///q", "names no host"),
        ("drizzle+amqp://h", "names no queue"),
        ("drizzle+amqp://h/", "names no queue"),
        ("drizzle+amqp://h:port/q", "port that is not a number"),
        ("drizzle+amqp://h/q?vhost=a&vhost=b", "vhost= once"),
        ("drizzle+amqp://h/q?host=x", "unknown query parameter"),
        ("drizzle+amqp://h/q#x", "'#' part"),
        ("drizzle+amqp://:secret-pw1@h/q", "empty user name"),
    ],
)
def test_a_bad_connection_string_says_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as bad:
        AmqpSource.parse(url)
    assert "secret-pw1" not in str(bad.value)


def test_a_password_cut_by_an_unencoded_character_is_not_shown() -> None:
    # '#' ends the authority: the rest of the password lands in the fragment.
    with pytest.raises(ConfigError, match="must be percent-encoded") as bad:
        AmqpSource.parse("drizzle+amqp://app:pw#cret-tail@h/q")
    assert "cret" not in str(bad.value) and "pw" not in str(bad.value)
    with pytest.raises(ConfigError, match="given separately"):
        AmqpSource.parse("drizzle+amqp://app:pw-one@h/q", password="pw-two")
    with pytest.raises(ConfigError, match="given separately"):
        AmqpSource.parse("drizzle+amqp://app@h/q", username="other")
    with pytest.raises(ConfigError, match="has a password but no user"):
        AmqpSource.parse("drizzle+amqp://h/q", password="pw-three")
    separate = AmqpSource.parse("drizzle+amqp://h/q", username="app", password="pw-four")
    assert (separate.username, separate.password) == ("app", "pw-four")
