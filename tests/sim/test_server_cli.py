"""`python -m replicator.sim` (= `replicator sim`): prints where to connect, stops cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from replicator.dcp.connstr import parse_connection_string
from replicator.dcp.opcodes import Status
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
