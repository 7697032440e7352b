"""The simulated node's SASL server side, without sockets."""

from __future__ import annotations

import pytest
from scramp import ScramClient

from replicator.dcp.opcodes import Status
from replicator.sim.sasl_server import CredentialStore, SaslExchange

_SCRAMP = {
    "SCRAM-SHA512": "SCRAM-SHA-512",
    "SCRAM-SHA256": "SCRAM-SHA-256",
    "SCRAM-SHA1": "SCRAM-SHA-1",
}


@pytest.fixture(scope="module")
def store() -> CredentialStore:
    return CredentialStore({"Administrator": "password", "app": "p,=w"})


def scram(store: CredentialStore, mechanism: str, user: str, password: str) -> Status:
    client = ScramClient([_SCRAMP[mechanism]], user, password)
    exchange = SaslExchange(store)
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
