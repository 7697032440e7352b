"""Issue 9, security: the password stays secret, spill files are private, transport is safe.

The password checks run the operator commands in this process (`main()`, on the shared Spark
session) with a distinctive password and DEBUG logging, and search everything they produced:
stdout, stderr, every log record, exception text and tracebacks, the files they wrote.
"""

from __future__ import annotations

import logging
import os
import stat
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replicator.cli.main import EXIT_OK, EXIT_USAGE, main
from replicator.config import ReplicatorConfig, Secret
from replicator.errors import AuthenticationError, ConfigError, TlsError
from replicator.pipeline.runner import run_replication
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster, server_tls_context
from replicator.sim.workload import Workload, initial_load
from replicator.source import connect_source
from tests.cli import assert_one_line_error, clean_env, run_cli
from tests.dcp.scripted_peer import PeerBehaviour, ScriptedPeer, make_tls_files
from tests.mirror_check import assert_mirror_equals_bucket

PASSWORD = "Canary-pw-9Xq!7731"
WRONG_PASSWORD = "Wrong-canary-5Rt#2208"
SECRETS = (PASSWORD, WRONG_PASSWORD)


def assert_no_secret(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a password appears in {where}"


def assert_no_secret_in_files(root: Path) -> int:
    """No file under `root` holds a password (as bytes); returns how many files were read."""
    files = [path for path in root.rglob("*") if path.is_file()]
    for path in files:
        content = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in content, f"a password is stored in {path}"
    return len(files)


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    bucket = SimBucket("vault", num_vbuckets=4, seed=31)
    initial_load(bucket, docs=60, doc_size=200, seed=31)
    with SimCluster(bucket, nodes=1, users={"Administrator": PASSWORD}) as running:
        yield running


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    # py4j logs every gateway call at DEBUG (the command quiets it the same way).
    logging.getLogger("py4j").setLevel(logging.WARNING)
    caplog.set_level(logging.DEBUG)
    return caplog


def set_password(monkeypatch: pytest.MonkeyPatch, password: str) -> None:
    for name in list(os.environ):
        if name.startswith("REPLICATOR_") and name != "REPLICATOR_JAR_CACHE":
            monkeypatch.delenv(name)
    monkeypatch.setenv("REPLICATOR_PASSWORD", password)


@pytest.mark.spark
def test_password_appears_in_no_output_log_error_or_file(
    spark: Any,
    cluster: SimCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    target = str(tmp_path / "mirror")
    source = cluster.connection_string
    set_password(monkeypatch, PASSWORD)
    outputs: list[str] = []
    errors: list[str] = []

    def command(*args: str) -> int:
        code = main(["--verbose", *args])
        captured = capsys.readouterr()
        outputs.append(captured.out + captured.err)
        errors.append(captured.err)
        return code

    common = ("--source", source, "--target", target)
    assert command("run", *common, "--until-caught-up", "--progress", "lines") == EXIT_OK
    assert command("status", *common) == EXIT_OK
    assert command("status", *common, "--json") == EXIT_OK
    assert command("verify", *common) == EXIT_OK
    assert "vbucket" in outputs[1] and outputs[2].lstrip().startswith("{")

    set_password(monkeypatch, WRONG_PASSWORD)
    assert command("run", *common, "--until-caught-up") == EXIT_USAGE
    line = assert_one_line_error(errors[-1], "127.0.0.1:")
    assert "auth" in line.lower() or "credential" in line.lower()
    assert command("status", *common) == EXIT_USAGE

    wrong = ReplicatorConfig(source=source, target=target, password=Secret(WRONG_PASSWORD),
                             until_caught_up=True, progress="off")
    assert_no_secret(repr(wrong) + str(wrong), "the config's repr")
    with pytest.raises(AuthenticationError) as failure:
        run_replication(wrong, spark=spark)
    error_text = "".join(traceback.format_exception(failure.value))
    assert "Traceback" in error_text

    assert debug_logs.records, "DEBUG logging captured nothing"
    assert any(r.levelno == logging.DEBUG for r in debug_logs.records)
    log_text = "\n".join(
        record.getMessage()
        + ("".join(traceback.format_exception(*record.exc_info)) if record.exc_info else "")
        for record in debug_logs.records
    )
    for where, text in [("command output", "\n".join(outputs)), ("the log", log_text),
                        ("the exception", error_text + repr(failure.value.args))]:
        assert_no_secret(text, where)
    assert assert_no_secret_in_files(tmp_path) > 5


def modes_under(directory: Path) -> dict[str, int]:
    return {
        str(path.relative_to(directory)): stat.S_IMODE(path.stat().st_mode)
        for path in [directory, *directory.rglob("*")]
    }


@pytest.mark.spark
def test_spill_files_and_their_directory_are_private_to_the_owner(
    spark: Any, tmp_path: Path
) -> None:
    bucket = SimBucket("vault", num_vbuckets=2, seed=32)
    workload = Workload(seed=32, doc_size=3000)
    workload.ensure_collections(bucket)
    bucket.apply_batch(workload.inserts(3000))  # ~9 MB in one snapshot: over the 8 MB budget
    staging = tmp_path / "staging"
    seen: list[dict[str, int]] = []

    def record_modes(step: str) -> None:
        if step in ("after_spill_write", "before_data_commit"):
            seen.append(modes_under(staging))

    previous_umask = os.umask(0)  # the modes must not depend on a permissive umask
    try:
        with SimCluster(bucket, nodes=1, users={"Administrator": PASSWORD}) as cluster:
            config = ReplicatorConfig(
                source=cluster.connection_string, target=str(tmp_path / "mirror"),
                staging_dir=str(staging), password=Secret(PASSWORD), until_caught_up=True,
                memory_budget_mb=8, commit_max_rows=1_000_000, progress="off",
            )
            summary = run_replication(config, spark=spark, fault_hook=record_modes)
    finally:
        os.umask(previous_umask)

    assert summary.spilled_bytes > 0
    spill_modes = {
        name: mode for modes in seen for name, mode in modes.items() if name.endswith(".parquet")
    }
    assert spill_modes, "no spill file was seen while it existed"
    assert set(spill_modes.values()) == {0o600}, spill_modes
    owner_dirs = {
        name: mode for modes in seen for name, mode in modes.items()
        if name != "." and not name.endswith(".parquet")
    }
    assert owner_dirs and set(owner_dirs.values()) == {0o700}, owner_dirs
    assert_mirror_equals_bucket(spark, config.target, bucket)


# --- transport: no Spark needed -----------------------------------------------------------


def plain_only_peer() -> ScriptedPeer:
    return ScriptedPeer(
        PeerBehaviour(mechanisms=("PLAIN",), users={"Administrator": PASSWORD})
    )


def test_sasl_plain_over_tcp_is_refused_unless_allowed() -> None:
    with plain_only_peer() as peer:
        config = ReplicatorConfig(source=peer.connection_string(), password=Secret(PASSWORD))
        with pytest.raises(ConfigError, match="allow") as refused:
            connect_source(config)
        assert_no_secret(str(refused.value), "the refusal")
        assert PASSWORD.encode() not in peer.session().raw_received

        allowed = ReplicatorConfig(source=peer.connection_string(), password=Secret(PASSWORD),
                                   allow_plain_over_tcp=True)
        client = connect_source(allowed)
        try:
            assert client.bucket == "travel"
        finally:
            client.close()


def test_the_command_refuses_plain_over_tcp_in_one_line(tmp_path: Path) -> None:
    with plain_only_peer() as peer:
        run = run_cli("run", "--source", peer.connection_string(), "--target",
                      str(tmp_path / "m"), env=clean_env(PASSWORD))
        assert run.returncode == EXIT_USAGE
        assert_one_line_error(run.stderr, "PLAIN", "--allow-plain-over-tcp")
        assert_no_secret(run.output, "the command's output")
        assert PASSWORD.encode() not in peer.session().raw_received
    assert not (tmp_path / "m").exists()


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    files = make_tls_files(tmp_path_factory.mktemp("tls"), "private")
    context = server_tls_context(str(files.server_cert), str(files.server_key))
    bucket = SimBucket("vault", num_vbuckets=4, seed=33)
    with SimCluster(bucket, nodes=1, users={"Administrator": PASSWORD},
                    tls_context=context) as running:
        yield running


def test_tls_verifies_the_server_by_default(tls_cluster: SimCluster) -> None:
    assert tls_cluster.tls_connection_string is not None
    config = ReplicatorConfig(source=tls_cluster.tls_connection_string, password=Secret(PASSWORD))
    assert config.tls_ca == ""  # no CA given: the system's CAs, which never signed this server
    with pytest.raises(TlsError) as refused:
        connect_source(config)
    assert "127.0.0.1:" in str(refused.value)
    assert_no_secret(str(refused.value), "the TLS error")


def test_the_command_verifies_tls_by_default_in_one_line(
    tls_cluster: SimCluster, tmp_path: Path
) -> None:
    assert tls_cluster.tls_connection_string is not None
    run = run_cli("run", "--source", tls_cluster.tls_connection_string, "--target",
                  str(tmp_path / "m"), env=clean_env(PASSWORD))
    assert run.returncode == EXIT_USAGE
    line = assert_one_line_error(run.stderr, "127.0.0.1:")
    assert "TLS" in line or "certificate" in line
    assert_no_secret(run.output, "the command's output")
