"""Choosing the SASL mechanism (`sasl_mechanism`, `--sasl-mechanism`) against the embedded
producer over real TCP and TLS on 127.0.0.1: each mechanism is used when asked for, a mechanism
the node does not offer and PLAIN over plain TCP are refused with errors that say what to do,
and no error ever holds the password."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from replicator.config import ReplicatorConfig, Secret
from replicator.dcp.transport.auth import Credentials, SaslMechanism, parse_sasl_mechanism
from replicator.dcp.transport.connection import NodeConnection
from replicator.dcp.transport.options import ConnectionOptions, TlsSettings
from replicator.errors import ConfigError
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster, server_tls_context
from replicator.sim.server import ServerOptions
from replicator.source import connect_source
from tests.dcp.scripted_peer import make_tls_files

PASSWORD = "Mech-canary-pw-4417"
BUCKET = "travel"


def start_cluster(**kwargs: object) -> SimCluster:
    bucket = SimBucket(BUCKET, num_vbuckets=4, seed=5)
    cluster = SimCluster(bucket, nodes=1, users={"Administrator": PASSWORD}, **kwargs)  # type: ignore[arg-type]
    return cluster.start()


@pytest.fixture(scope="module")
def every_mechanism() -> Iterator[SimCluster]:
    """A node offering SCRAM-SHA512, SCRAM-SHA256, SCRAM-SHA1 and PLAIN (the default)."""
    with start_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def sha512_only() -> Iterator[SimCluster]:
    with start_cluster(options=ServerOptions(sasl_mechanisms=("SCRAM-SHA512",))) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimCluster, Path]]:
    files = make_tls_files(tmp_path_factory.mktemp("tls"), "mech")
    context = server_tls_context(str(files.server_cert), str(files.server_key))
    with start_cluster(tls_context=context) as cluster:
        yield cluster, files.ca_cert


def node_address(cluster: SimCluster) -> str:
    return f"127.0.0.1:{cluster.node(0).port}"


def open_connection(cluster: SimCluster, **options: object) -> NodeConnection:
    """A handshake over the node's plain port with these ConnectionOptions."""
    connection = NodeConnection(
        "127.0.0.1",
        cluster.node(0).port,
        bucket=BUCKET,
        credentials=Credentials("Administrator", PASSWORD),
        options=ConnectionOptions(connect_timeout=5.0, request_timeout=5.0, **options),  # type: ignore[arg-type]
    )
    return connection.open()


def refusal(cluster: SimCluster, **options: object) -> str:
    """The text of the ConfigError the handshake fails with."""
    with pytest.raises(ConfigError) as caught:
        open_connection(cluster, **options).close()
    text = str(caught.value)
    assert PASSWORD not in text
    return text


# --- names ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("SCRAM-SHA512", SaslMechanism.SCRAM_SHA512),
        ("scram-sha512", SaslMechanism.SCRAM_SHA512),
        ("SCRAM-SHA-512", SaslMechanism.SCRAM_SHA512),
        ("scram_sha_256", SaslMechanism.SCRAM_SHA256),
        (" Scram-Sha-1 ", SaslMechanism.SCRAM_SHA1),
        ("plain", SaslMechanism.PLAIN),
    ],
)
def test_names_in_any_case_and_either_spelling(written: str, expected: SaslMechanism) -> None:
    assert parse_sasl_mechanism(written) is expected


@pytest.mark.parametrize("written", ["SCRAM-MD5", "SHA512", "", "SCRAM-SHA-384", "PLAIN-TEXT"])
def test_unknown_names_are_refused(written: str) -> None:
    with pytest.raises(ValueError, match="unknown SASL mechanism"):
        parse_sasl_mechanism(written)


# --- against the embedded producer ----------------------------------------------------------


def test_unset_uses_the_strongest_scram_offered(every_mechanism: SimCluster) -> None:
    connection = open_connection(every_mechanism)
    try:
        assert connection.sasl_mechanism is SaslMechanism.SCRAM_SHA512
    finally:
        connection.close()


@pytest.mark.parametrize(
    "mechanism",
    [SaslMechanism.SCRAM_SHA512, SaslMechanism.SCRAM_SHA256, SaslMechanism.SCRAM_SHA1],
)
def test_each_scram_mechanism_asked_for_is_the_one_used(
    every_mechanism: SimCluster, mechanism: SaslMechanism
) -> None:
    connection = open_connection(every_mechanism, sasl_mechanism=mechanism)
    try:
        assert connection.sasl_mechanism is mechanism
        assert connection.is_open
    finally:
        connection.close()


def test_plain_over_tcp_is_refused_unless_allowed(every_mechanism: SimCluster) -> None:
    text = refusal(every_mechanism, sasl_mechanism=SaslMechanism.PLAIN)
    assert text.startswith(node_address(every_mechanism) + ": ")
    assert "PLAIN" in text and "clear" in text
    assert "couchbases://" in text and "--allow-plain-over-tcp" in text

    # Allowed, PLAIN is used even though the node offers SCRAM too.
    connection = open_connection(
        every_mechanism, sasl_mechanism=SaslMechanism.PLAIN, allow_plain_over_tcp=True
    )
    try:
        assert connection.sasl_mechanism is SaslMechanism.PLAIN
    finally:
        connection.close()


def test_allowing_plain_alone_still_prefers_scram(every_mechanism: SimCluster) -> None:
    connection = open_connection(every_mechanism, allow_plain_over_tcp=True)
    try:
        assert connection.sasl_mechanism is SaslMechanism.SCRAM_SHA512
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("mechanism", "allow_plain"),
    [(SaslMechanism.SCRAM_SHA256, False), (SaslMechanism.SCRAM_SHA1, False),
     (SaslMechanism.PLAIN, True)],
)
def test_a_mechanism_the_node_does_not_offer(
    sha512_only: SimCluster, mechanism: SaslMechanism, allow_plain: bool
) -> None:
    text = refusal(sha512_only, sasl_mechanism=mechanism, allow_plain_over_tcp=allow_plain)
    assert text.startswith(node_address(sha512_only) + ": ")
    assert f"asks for {mechanism.value}" in text
    assert "server offers only: SCRAM-SHA512." in text
    assert "unset sasl_mechanism" in text


def test_plain_over_tls_needs_no_allow_flag(tls_cluster: tuple[SimCluster, Path]) -> None:
    cluster, ca_file = tls_cluster
    tls_port = cluster.node(0).tls_port
    assert tls_port is not None
    connection = NodeConnection(
        "127.0.0.1",
        tls_port,
        bucket=BUCKET,
        credentials=Credentials("Administrator", PASSWORD),
        tls=True,
        options=ConnectionOptions(
            connect_timeout=5.0, request_timeout=5.0, sasl_mechanism=SaslMechanism.PLAIN,
            tls=TlsSettings(ca_file=str(ca_file)),
        ),
    ).open()
    try:
        assert connection.sasl_mechanism is SaslMechanism.PLAIN
    finally:
        connection.close()


# --- from the config, through the runner's client options -----------------------------------


def config_for(cluster: SimCluster, **values: object) -> ReplicatorConfig:
    return ReplicatorConfig(
        source=cluster.connection_string, password=Secret(PASSWORD), **values  # type: ignore[arg-type]
    )


def test_the_configured_mechanism_reaches_every_connection(
    every_mechanism: SimCluster, sha512_only: SimCluster
) -> None:
    with pytest.raises(ConfigError) as caught:
        connect_source(config_for(sha512_only, sasl_mechanism="scram-sha-256")).close()
    text = str(caught.value)
    assert node_address(sha512_only) in text
    assert "asks for SCRAM-SHA256" in text and "SCRAM-SHA512" in text
    assert PASSWORD not in text

    with pytest.raises(ConfigError, match="--allow-plain-over-tcp") as caught:
        connect_source(config_for(every_mechanism, sasl_mechanism="plain")).close()
    assert PASSWORD not in str(caught.value)

    client = connect_source(
        config_for(every_mechanism, sasl_mechanism="plain", allow_plain_over_tcp=True)
    )
    try:
        assert client.bucket == BUCKET
    finally:
        client.close()
