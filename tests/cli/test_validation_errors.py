"""Every user mistake ends with one line on stderr and exit code 2, never a stack trace.

Mistakes found before Spark starts (source, credentials, TLS, jars, config) run the real command
in a subprocess. Mistakes about the target need a Spark session: those call `main()` in this
process, on the shared session, which is what the command does after starting one.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replicator.cli.main import EXIT_USAGE, main
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster, server_tls_context
from replicator.sim.server import ServerOptions
from replicator.sim.workload import initial_load
from tests.cli import PASSWORD, REPO, assert_one_line_error, clean_env, run_cli
from tests.dcp.scripted_peer import make_tls_files

WRONG_PASSWORD = "Wr0ng-Pa55-1177"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    bucket = SimBucket("travel", num_vbuckets=4, seed=3)
    initial_load(bucket, docs=20, doc_size=100, seed=3)
    with SimCluster(bucket, nodes=1, users={"Administrator": PASSWORD}) as running:
        yield running


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimCluster, Path]]:
    """A TLS cluster, and the CA of another authority (which did not sign its certificate)."""
    directory = tmp_path_factory.mktemp("tls")
    good, other = make_tls_files(directory, "good"), make_tls_files(directory, "other")
    context = server_tls_context(str(good.server_cert), str(good.server_key))
    bucket = SimBucket("travel", num_vbuckets=4, seed=3)
    with SimCluster(bucket, nodes=1, users={"Administrator": PASSWORD}, tls_context=context) as c:
        yield c, other.ca_cert


@pytest.fixture(scope="module")
def sha512_only_cluster() -> Iterator[SimCluster]:
    """A node that offers only SCRAM-SHA512 (SASL_LIST_MECHS), as one with the others disabled."""
    bucket = SimBucket("travel", num_vbuckets=4, seed=3)
    options = ServerOptions(sasl_mechanisms=("SCRAM-SHA512",))
    with SimCluster(bucket, nodes=1, users={"Administrator": PASSWORD}, options=options) as c:
        yield c


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_args(source: str, target: Path, *extra: str) -> list[str]:
    return ["run", "--source", source, "--target", str(target), "--until-caught-up", *extra]


# --- found before Spark starts: real subprocesses ------------------------------------------


def test_unreachable_node(tmp_path: Path) -> None:
    port = closed_port()
    run = run_cli(*run_args(f"couchbase://127.0.0.1:{port}/travel", tmp_path / "m"))
    assert run.returncode == EXIT_USAGE
    assert_one_line_error(run.stderr, f"127.0.0.1:{port}", "no seed node")
    assert not (tmp_path / "m").exists()


def test_wrong_password_is_refused_and_never_printed(
    cluster: SimCluster, tmp_path: Path
) -> None:
    run = run_cli(
        *run_args(cluster.connection_string, tmp_path / "m"), env=clean_env(WRONG_PASSWORD)
    )
    assert run.returncode == EXIT_USAGE
    line = assert_one_line_error(run.stderr, "127.0.0.1:")
    assert "auth" in line.lower() or "credential" in line.lower()
    assert WRONG_PASSWORD not in run.output and PASSWORD not in run.output


def test_no_password_at_all(cluster: SimCluster, tmp_path: Path) -> None:
    run = run_cli(*run_args(cluster.connection_string, tmp_path / "m"), env=clean_env(None))
    assert run.returncode == EXIT_USAGE
    assert_one_line_error(run.stderr, "no password", "REPLICATOR_PASSWORD")


def test_unknown_bucket(cluster: SimCluster, tmp_path: Path) -> None:
    source = cluster.connection_string.rsplit("/", 1)[0] + "/no-such-bucket"
    run = run_cli(*run_args(source, tmp_path / "m"))
    assert run.returncode == EXIT_USAGE
    assert_one_line_error(run.stderr, "no-such-bucket")
    assert PASSWORD not in run.output


def test_tls_with_a_ca_that_did_not_sign_the_server(
    tls_cluster: tuple[SimCluster, Path], tmp_path: Path
) -> None:
    cluster, wrong_ca = tls_cluster
    assert cluster.tls_connection_string is not None
    run = run_cli(
        *run_args(cluster.tls_connection_string, tmp_path / "m", "--tls-ca", str(wrong_ca))
    )
    assert run.returncode == EXIT_USAGE
    line = assert_one_line_error(run.stderr, "127.0.0.1:")
    assert "TLS" in line or "certificate" in line
    assert PASSWORD not in run.output


def test_delta_jars_missing(cluster: SimCluster, tmp_path: Path) -> None:
    run = run_cli(
        *run_args(cluster.connection_string, tmp_path / "m"),
        env=clean_env(REPLICATOR_DELTA_JARS="/nope"),
    )
    assert run.returncode == EXIT_USAGE
    assert_one_line_error(run.stderr, "Delta Lake jars not found", "REPLICATOR_DELTA_JARS=/nope")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[replicator]\ncommit_interval_s = "soon"\n', "invalid value for commit_interval_s"),
        ("[replicator]\nmemory_budget_mb = 2\n", "memory_budget_mb must be at least 8"),
        ('[replicator]\nvbuckets = "7-3"\n', "invalid vbuckets '7-3'"),
        ("[replicator]\ncommit_every = 5\n", "unknown setting 'commit_every'"),
        ('[replicator]\nsasl_mechanism = "SCRAM-MD5"\n',
         "invalid sasl_mechanism (--sasl-mechanism): unknown SASL mechanism 'SCRAM-MD5'"),
        ('[replicator]\npassword = "x"\n', "not in the config file"),
        ("[replicator\n", "is not valid TOML"),
    ],
)
def test_invalid_config_file(tmp_path: Path, toml: str, message: str) -> None:
    config = tmp_path / "replicator.toml"
    config.write_text(toml)
    run = run_cli(*run_args("couchbase://127.0.0.1/travel", tmp_path / "m", "--config",
                            str(config)))
    assert run.returncode == EXIT_USAGE
    assert_one_line_error(run.stderr, message)


def test_invalid_flag_value_from_the_environment(tmp_path: Path) -> None:
    run = run_cli(
        *run_args("couchbase://127.0.0.1/travel", tmp_path / "m"),
        env=clean_env(REPLICATOR_PROGRESS="fancy"),
    )
    assert run.returncode == EXIT_USAGE
    assert_one_line_error(run.stderr, "progress must be one of")


def test_an_unknown_sasl_mechanism_flag_names_the_valid_ones(tmp_path: Path) -> None:
    run = run_cli(*run_args("couchbase://127.0.0.1/travel", tmp_path / "m",
                            "--sasl-mechanism", "scram-md5"))
    assert run.returncode == EXIT_USAGE
    assert_one_line_error(
        run.stderr, "unknown SASL mechanism 'scram-md5'",
        "SCRAM-SHA512, SCRAM-SHA256, SCRAM-SHA1, PLAIN",
    )


def test_a_sasl_mechanism_the_node_does_not_offer(
    sha512_only_cluster: SimCluster, tmp_path: Path
) -> None:
    port = sha512_only_cluster.node(0).port
    run = run_cli(*run_args(sha512_only_cluster.connection_string, tmp_path / "m",
                            "--sasl-mechanism", "SCRAM-SHA-256"))
    assert run.returncode == EXIT_USAGE
    assert_one_line_error(
        run.stderr, f"127.0.0.1:{port}", "asks for SCRAM-SHA256",
        "server offers only: SCRAM-SHA512.", "unset sasl_mechanism",
    )
    assert PASSWORD not in run.output
    assert not (tmp_path / "m").exists()


def test_plain_asked_for_over_tcp_is_refused_without_the_allow_flag(
    cluster: SimCluster, tmp_path: Path
) -> None:
    run = run_cli(*run_args(cluster.connection_string, tmp_path / "m",
                            "--sasl-mechanism", "PLAIN"))
    assert run.returncode == EXIT_USAGE
    assert_one_line_error(
        run.stderr, "127.0.0.1:", "sasl_mechanism PLAIN", "--allow-plain-over-tcp"
    )
    assert PASSWORD not in run.output
    assert not (tmp_path / "m").exists()


def test_status_and_verify_need_their_arguments(tmp_path: Path) -> None:
    status = run_cli("status")
    assert status.returncode == EXIT_USAGE
    assert_one_line_error(status.stderr, "--target")
    verify = run_cli("verify", "--target", str(tmp_path))
    assert verify.returncode == EXIT_USAGE
    assert_one_line_error(verify.stderr, "no source")


def test_the_spark_submit_job_reports_errors_the_same_way(tmp_path: Path) -> None:
    import subprocess

    completed = subprocess.run(
        [sys.executable, str(REPO / "jobs" / "replicate.py"), "--source",
         "couchbase://127.0.0.1/travel", "--target", str(tmp_path / "m"), "--vbuckets", "x-y"],
        env=clean_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert completed.returncode == EXIT_USAGE
    assert_one_line_error(completed.stderr, "invalid vbuckets 'x-y'")


# --- the target: found once Spark runs, so in this process ----------------------------------


def run_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    assert PASSWORD not in captured.out + captured.err
    return code, captured.out, captured.err


@pytest.fixture
def password_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("REPLICATOR_") and name not in ("REPLICATOR_JAR_CACHE",):
            monkeypatch.delenv(name)
    monkeypatch.setenv("REPLICATOR_PASSWORD", PASSWORD)


@pytest.mark.spark
@pytest.mark.usefixtures("password_env")
def test_targets_that_are_not_a_mirror_of_this_bucket(
    spark: Any, cluster: SimCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from replicator.delta.schema import MirrorConfig
    from replicator.delta.table import open_or_create

    source = cluster.connection_string
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "report.csv").write_text("a,b\n")
    foreign = tmp_path / "foreign"
    spark.range(3).write.format("delta").save(str(foreign))
    other_bucket = tmp_path / "beer"
    open_or_create(spark, str(other_bucket), MirrorConfig("beer-sample"))

    cases = [
        (plain, "is not a Delta table but holds other files (report.csv)"),
        (foreign, "is a Delta table but not a replicator mirror"),
        (other_bucket, "is the mirror of bucket 'beer-sample', not of 'travel'"),
    ]
    for target, message in cases:
        code, out, err = run_in_process(capsys, *run_args(source, target))
        assert code == EXIT_USAGE, (target, out, err)
        assert_one_line_error(err, message)
        assert out == ""
    # Nothing was written into any of them.
    assert sorted(p.name for p in plain.iterdir()) == ["report.csv"]
    assert not (foreign / "_replicator").exists()

    for target, message in [
        (plain, "holds no Delta table"),
        (foreign, "not a replicator mirror"),
        (tmp_path / "never-made", "does not exist"),
    ]:
        code, _, err = run_in_process(capsys, "status", "--target", str(target))
        assert code == EXIT_USAGE
        assert_one_line_error(err, message)
    code, _, err = run_in_process(capsys, "verify", "--source", source, "--target",
                                  str(other_bucket))
    assert code == EXIT_USAGE
    assert_one_line_error(err, "is the mirror of bucket 'beer-sample', not of 'travel'")


@pytest.mark.spark
@pytest.mark.usefixtures("password_env")
def test_target_that_can_never_be_written(
    spark: Any, cluster: SimCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    regular_file = tmp_path / "a-file"
    regular_file.write_text("not a directory")
    code, _, err = run_in_process(
        capsys, *run_args(cluster.connection_string, regular_file / "mirror")
    )
    assert code == EXIT_USAGE
    assert_one_line_error(err, "cannot open or create the mirror at", str(regular_file))


@pytest.mark.spark
@pytest.mark.usefixtures("password_env")
def test_read_only_directory(
    spark: Any, cluster: SimCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() == 0:
        pytest.skip("running as root: file permissions do not stop root from writing")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code, _, err = run_in_process(
            capsys, *run_args(cluster.connection_string, locked / "mirror")
        )
    finally:
        locked.chmod(0o700)
    assert code == EXIT_USAGE
    assert_one_line_error(err, "cannot open or create the mirror at")
