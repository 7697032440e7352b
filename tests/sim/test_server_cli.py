"""`python -m replicator.sim` (= `replicator sim`): prints where to connect, stops cleanly."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TypeVar

from replicator.dcp.cluster.client import DcpClient
from replicator.dcp.cluster.connstr import parse_connection_string
from replicator.dcp.protocol.events import RollbackRequired, StreamEndReason
from replicator.dcp.protocol.opcodes import Status
from replicator.dcp.transport.auth import Credentials
from replicator.errors import ConnectionLostError, NodeUnreachableError
from replicator.sim.cli import PASSWORD_ENV, add_sim_arguments, sim_password
from replicator.sim.cluster import DEFAULT_PASSWORD, DEFAULT_USERNAME
from tests.dcp.test_client_sim import Mirror, options
from tests.sim.raw_client import RawClient

SECRET = "not-the-default-Pa55"


@contextmanager
def simulator(*flags: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "replicator.sim", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_prints_the_connection_string_first_and_exits_0_on_sigterm() -> None:
    flags = ("--port", "0", "--nodes", "2", "--vbuckets", "8", "--docs", "20", "--bucket", "shop")
    with simulator(*flags, env={"REPLICATOR_SIM_PASSWORD": SECRET}) as process:
        assert process.stdout is not None
        first_line = process.stdout.readline().strip()
        target = parse_connection_string(first_line)
        assert target.bucket == "shop" and len(target.seeds) == 2 and not target.tls
        seed = target.seeds[1]
        with RawClient(seed.host, seed.port) as client:
            client.hello()
            assert client.auth_plain("Administrator", "password").status == Status.AUTH_ERROR
            assert client.auth_plain("Administrator", SECRET).status == Status.SUCCESS
            assert client.select_bucket("shop").status == Status.SUCCESS
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=20)
        assert process.returncode == 0
        assert SECRET not in first_line + stdout + stderr


def test_sigint_also_stops_cleanly() -> None:
    with simulator("--port", "0", "--vbuckets", "4", "--docs", "0") as process:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("couchbase://127.0.0.1:")
        process.send_signal(signal.SIGINT)
        assert process.wait(20) == 0


def test_a_bad_option_is_one_line_on_stderr_and_exit_2() -> None:
    with simulator("--port", "0", "--faults", "meteor") as process:
        stdout, stderr = process.communicate(timeout=20)
    assert process.returncode == 2
    assert stdout == ""
    assert stderr.strip().splitlines() == [
        "replicator sim: unknown fault 'meteor': choose from drop, failover, rebalance, "
        "purge, restart, stall, malformed"
    ]


def test_an_unknown_sasl_mechanism_is_one_line_and_exit_2() -> None:
    with simulator("--port", "0", "--sasl-mechanisms", "scram-sha-256,md5") as process:
        stdout, stderr = process.communicate(timeout=20)
    assert process.returncode == 2
    assert stdout == ""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("replicator sim: --sasl-mechanisms: unknown SASL mechanism 'md5'")
    assert "SCRAM-SHA512, SCRAM-SHA256, SCRAM-SHA1, PLAIN" in lines[0]


def test_the_nodes_offer_only_the_mechanisms_named() -> None:
    flags = ["--port", "0", "--vbuckets", "4", "--docs", "0"]
    flags += ["--sasl-mechanisms", "plain,Scram-Sha-1"]
    with simulator(*flags) as process:
        assert process.stdout is not None
        seed = parse_connection_string(process.stdout.readline().strip()).seeds[0]
        with RawClient(seed.host, seed.port) as client:
            client.hello()
            assert client.list_mechanisms().value == b"PLAIN SCRAM-SHA1"
            refused = client.auth_scram(DEFAULT_USERNAME, DEFAULT_PASSWORD, "SCRAM-SHA512")
            assert refused.status == Status.NOT_SUPPORTED
            accepted = client.auth_scram(DEFAULT_USERNAME, DEFAULT_PASSWORD, "SCRAM-SHA1")
            assert accepted.status == Status.SUCCESS
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0


def test_defaults_parse_without_serving() -> None:
    parser = argparse.ArgumentParser()
    add_sim_arguments(parser)
    args = parser.parse_args([])
    assert (args.host, args.port, args.bucket, args.username) == (
        "127.0.0.1",
        11210,
        "default",
        "Administrator",
    )
    assert (args.vbuckets, args.nodes, args.rate, args.faults) == (1024, 1, 0.0, "")
    assert sim_password(args, {}) == "password"
    assert sim_password(args, {PASSWORD_ENV: SECRET}) == SECRET
    flagged = parser.parse_args(["--password", "from-the-flag"])
    assert sim_password(flagged, {PASSWORD_ENV: SECRET}) == "from-the-flag"


Result = TypeVar("Result")
# What a fault run throws at a client while it reconnects; the test retries through it.
_TRANSIENT = (ConnectionLostError, NodeUnreachableError)


def retried(call: Callable[[], Result], timeout: float = 10.0) -> Result:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except _TRANSIENT:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)  # pace the retries while the client reconnects


def test_live_changes_and_faults_reach_a_real_client() -> None:
    flags = (
        *("--port", "0", "--vbuckets", "4", "--docs", "50", "--rate", "200"),
        *("--faults", "drop,failover", "--fault-interval", "0.5"),
    )
    with simulator(*flags) as process:
        assert process.stdout is not None
        connection_string = process.stdout.readline().strip()
        mirror = Mirror(4)
        credentials = Credentials(DEFAULT_USERNAME, DEFAULT_PASSWORD)
        client = retried(
            lambda: DcpClient(
                connection_string,
                credentials,
                options=options(),
                committed_position=mirror.committed_position,
            )
        )
        with client:
            first_highs = retried(client.high_seqnos)
            for vb in range(4):
                client.open_stream(vb, *mirror.committed_position(vb))
            stale: dict[int, int] = {}  # vbucket -> where the mirror stood when told to roll back
            deadline = time.monotonic() + 20
            # Faults come every 0.5 s, drop first: the client sees its connection dropped, then
            # a failover ends a stream, and reopening it from the mirror's position (on the
            # lost branch) is answered ROLLBACK.
            while not (stale and client.last_connection_error is not None):
                assert time.monotonic() < deadline, f"ends {mirror.ends}, rollbacks {stale}"
                batch = client.poll(timeout=0.2)
                for event in batch:
                    mirror.apply(event)
                    if isinstance(event, RollbackRequired):
                        stale[event.vbucket] = mirror.committed[event.vbucket]
                        mirror.resync(client, event.vbucket)
                client.acknowledge(batch)
            assert any(end.reason is StreamEndReason.DISCONNECTED for end in mirror.ends)
            assert isinstance(client.last_connection_error, ConnectionLostError)
            for rollback in mirror.rollbacks:
                assert rollback.rollback_seqno < stale[rollback.vbucket]
                log = retried(partial(client.failover_log, rollback.vbucket))
                assert len(log.entries) > 1  # the failover's branch
            # Live changes go on (a failover takes back at most 10 items at a time).
            grown = sum(first_highs.values()) + 50
            while sum(retried(client.high_seqnos).values()) <= grown:
                assert time.monotonic() < deadline, f"high seqnos stuck near {first_highs}"
                client.acknowledge(client.poll(timeout=0.1))
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
