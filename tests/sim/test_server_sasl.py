"""The simulated node's SASL server side: without sockets, and what a node offers over TCP."""

from __future__ import annotations

import pytest
from scramp import ScramClient

from replicator.dcp.protocol.opcodes import Status
from replicator.sim.bucket import SimBucket
from replicator.sim.sasl_server import CredentialStore, SaslExchange
from replicator.sim.server import ServerOptions
from tests.sim.raw_client import RawClient, fast_options, serve

_SCRAMP = {
    "SCRAM-SHA512": "SCRAM-SHA-512",
    "SCRAM-SHA256": "SCRAM-SHA-256",
    "SCRAM-SHA1": "SCRAM-SHA-1",
}


@pytest.fixture(scope="module")
def store() -> CredentialStore:
    return CredentialStore({"Administrator": "password", "app": "p,=w"})


def scram(
    store: CredentialStore, mechanism: str, user: str, password: str,
    exchange: SaslExchange | None = None,
) -> Status:
    client = ScramClient([_SCRAMP[mechanism]], user, password)
    exchange = exchange or SaslExchange(store)
    first = exchange.start(mechanism, client.get_client_first().encode())
    if first.status != Status.AUTH_CONTINUE:
        return first.status
    client.set_server_first(first.payload.decode())
    final = exchange.step(mechanism, client.get_client_final().encode())
    if final.status == Status.SUCCESS:
        client.set_server_final(final.payload.decode())
        assert final.username == user
    return final.status


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"])
def test_scram_accepts_the_password_and_refuses_others(
    store: CredentialStore, mechanism: str
) -> None:
    assert scram(store, mechanism, "app", "p,=w") == Status.SUCCESS
    assert scram(store, mechanism, "app", "p,=x") == Status.AUTH_ERROR
    assert scram(store, mechanism, "ghost", "p,=w") == Status.AUTH_ERROR


def test_plain(store: CredentialStore) -> None:
    assert SaslExchange(store).start("PLAIN", b"\x00app\x00p,=w").username == "app"
    assert SaslExchange(store).start("PLAIN", b"\x00app\x00nope").status == Status.AUTH_ERROR
    assert SaslExchange(store).start("PLAIN", b"garbage").status == Status.AUTH_ERROR
    assert SaslExchange(store).start("PLAIN", b"\x00ghost\x00p,=w").status == Status.AUTH_ERROR


def test_unknown_mechanism_and_step_without_start(store: CredentialStore) -> None:
    assert SaslExchange(store).start("CRAM-MD5", b"x").status == Status.NOT_SUPPORTED
    assert SaslExchange(store).step("SCRAM-SHA512", b"c=biws").status == Status.EINVAL


def test_no_password_is_kept_or_shown(store: CredentialStore) -> None:
    assert "password" not in repr(vars(store))
    reply = SaslExchange(store).start("PLAIN", b"\x00Administrator\x00password")
    assert "password" not in repr(reply)


def test_an_exchange_refuses_what_its_node_does_not_offer(store: CredentialStore) -> None:
    only_sha256 = SaslExchange(store, offered=("SCRAM-SHA256",))
    assert only_sha256.offered == ("SCRAM-SHA256",)
    assert scram(store, "SCRAM-SHA256", "app", "p,=w", only_sha256) == Status.SUCCESS
    assert scram(store, "SCRAM-SHA512", "app", "p,=w", only_sha256) == Status.NOT_SUPPORTED
    assert only_sha256.start("PLAIN", b"\x00app\x00p,=w").status == Status.NOT_SUPPORTED
    assert SaslExchange(store).offered == ("SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1", "PLAIN")


@pytest.mark.parametrize(
    ("mechanisms", "message"),
    [((), "at least one"), (("PLAIN", "PLAIN"), "each once"), (("SCRAM-MD5",), "SCRAM-MD5")],
)
def test_offered_mechanisms_are_checked(mechanisms: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerOptions(sasl_mechanisms=mechanisms)


def test_a_node_lists_and_accepts_only_what_it_offers() -> None:
    options = fast_options(sasl_mechanisms=("SCRAM-SHA256", "PLAIN"))
    with serve(SimBucket("b", 4), options=options) as cluster:
        with RawClient("127.0.0.1", cluster.node(0).port) as client:
            assert client.hello().status == Status.SUCCESS
            listed = client.list_mechanisms()
            assert listed.status == Status.SUCCESS and listed.value == b"SCRAM-SHA256 PLAIN"
            refused = client.auth_scram("Administrator", "password", "SCRAM-SHA512")
            assert refused.status == Status.NOT_SUPPORTED
            assert client.auth_scram("Administrator", "password", "SCRAM-SHA256").status == (
                Status.SUCCESS
            )
        with RawClient("127.0.0.1", cluster.node(0).port) as client:
            assert client.hello().status == Status.SUCCESS
            assert client.auth_plain("Administrator", "password").status == Status.SUCCESS
