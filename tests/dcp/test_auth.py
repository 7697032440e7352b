"""SASL: mechanism choice, SCRAM against scramp's server, PLAIN, and secrets kept out of text."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from scramp import ScramException, ScramMechanism

from replicator.dcp.protocol.opcodes import Opcode, Status
from replicator.dcp.transport.auth import (
    Credentials,
    SaslMechanism,
    authenticate,
    choose_mechanism,
)
from replicator.errors import AuthenticationError, ConfigError

PASSWORD = "correct-horse-battery"
SCRAMP_NAMES = {
    "SCRAM-SHA512": "SCRAM-SHA-512",
    "SCRAM-SHA256": "SCRAM-SHA-256",
    "SCRAM-SHA1": "SCRAM-SHA-1",
}


@pytest.mark.parametrize(
    ("offered", "tls", "expected"),
    [
        (
            ["PLAIN", "SCRAM-SHA1", "SCRAM-SHA256", "SCRAM-SHA512"],
            False,
            SaslMechanism.SCRAM_SHA512,
        ),
        (["SCRAM-SHA1", "SCRAM-SHA256"], False, SaslMechanism.SCRAM_SHA256),
        (["PLAIN", "SCRAM-SHA1"], False, SaslMechanism.SCRAM_SHA1),
        (["PLAIN", "SCRAM-SHA1"], True, SaslMechanism.SCRAM_SHA1),
        (["PLAIN"], True, SaslMechanism.PLAIN),
    ],
)
def test_strongest_common_mechanism(offered: list[str], tls: bool, expected: SaslMechanism) -> None:
    assert choose_mechanism(offered, tls=tls) is expected


def test_plain_over_tcp_is_refused_unless_allowed() -> None:
    with pytest.raises(ConfigError, match="clear over plain TCP"):
        choose_mechanism(["PLAIN"], tls=False)
    assert choose_mechanism(["PLAIN"], tls=False, allow_plain_over_tcp=True) is SaslMechanism.PLAIN


def test_nothing_usable_offered() -> None:
    with pytest.raises(ConfigError, match="CRAM-MD5"):
        choose_mechanism(["CRAM-MD5"], tls=True)


@pytest.mark.parametrize("offered", [["PLAIN"], ["CRAM-MD5"]])
def test_refused_mechanism_choice_names_the_node(offered: list[str]) -> None:
    def roundtrip(opcode: int, key: bytes, value: bytes) -> tuple[int, bytes]:
        raise AssertionError("nothing may be sent")

    with pytest.raises(ConfigError) as caught:
        authenticate(roundtrip, Credentials("dcp", PASSWORD), offered, node="db7:11210", tls=False)
    assert str(caught.value).startswith("db7:11210: ")
    assert PASSWORD not in str(caught.value)


def test_credentials_never_show_the_password() -> None:
    credentials = Credentials("dcp", PASSWORD)
    assert PASSWORD not in repr(credentials)
    assert PASSWORD not in str(credentials)
    assert PASSWORD not in f"{credentials}"
    assert "dcp" in repr(credentials)
    with pytest.raises(ConfigError):
        Credentials("", PASSWORD)


RoundTrip = Callable[[int, bytes, bytes], tuple[int, bytes]]


def scram_server(password: str, *, tamper_final: bool = False) -> tuple[RoundTrip, list[int]]:
    """A server side of SCRAM (scramp) as a SASL round trip; records the opcodes it saw."""
    seen: list[int] = []
    state: dict[str, object] = {}

    def roundtrip(opcode: int, key: bytes, value: bytes) -> tuple[int, bytes]:
        seen.append(opcode)
        mechanism = ScramMechanism(SCRAMP_NAMES[key.decode()])
        if opcode == Opcode.SASL_AUTH:
            info = mechanism.make_auth_info(password)
            server = mechanism.make_server(lambda _user: info)
            state["server"] = server
            server.set_client_first(value.decode())
            return Status.AUTH_CONTINUE, server.get_server_first().encode()
        server = state["server"]
        try:
            server.set_client_final(value.decode())  # type: ignore[attr-defined]
        except ScramException:
            return Status.AUTH_ERROR, b""
        final = server.get_server_final()  # type: ignore[attr-defined]
        if tamper_final:
            final = "v=" + "A" * (len(final) - 2)
        return Status.SUCCESS, final.encode()

    return roundtrip, seen


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"])
def test_scram_exchange_succeeds(mechanism: str) -> None:
    roundtrip, seen = scram_server(PASSWORD)
    used = authenticate(
        roundtrip, Credentials("dcp", PASSWORD), [mechanism, "PLAIN"], node="n:1", tls=False
    )
    assert used.value == mechanism
    assert seen == [Opcode.SASL_AUTH, Opcode.SASL_STEP]


def test_wrong_password_names_node_and_user_but_not_the_password() -> None:
    roundtrip, _ = scram_server("the-real-one")
    with pytest.raises(AuthenticationError) as caught:
        authenticate(
            roundtrip, Credentials("dcp", PASSWORD), ["SCRAM-SHA512"], node="db1:11210", tls=False
        )
    text = str(caught.value)
    assert "db1:11210" in text and "'dcp'" in text
    assert PASSWORD not in text and "the-real-one" not in text
    assert caught.value.node == "db1:11210"


def test_server_that_cannot_prove_the_password_is_refused() -> None:
    roundtrip, _ = scram_server(PASSWORD, tamper_final=True)
    with pytest.raises(AuthenticationError, match="does not prove") as caught:
        authenticate(roundtrip, Credentials("dcp", PASSWORD), ["SCRAM-SHA256"], node="n", tls=False)
    assert PASSWORD not in str(caught.value)


def test_plain_sends_user_and_password_once_over_tls() -> None:
    sent: list[tuple[int, bytes, bytes]] = []

    def roundtrip(opcode: int, key: bytes, value: bytes) -> tuple[int, bytes]:
        sent.append((opcode, key, value))
        return Status.SUCCESS, b""

    used = authenticate(roundtrip, Credentials("dcp", PASSWORD), ["PLAIN"], node="n", tls=True)
    assert used is SaslMechanism.PLAIN
    assert sent == [(Opcode.SASL_AUTH, b"PLAIN", b"\x00dcp\x00" + PASSWORD.encode())]


def test_other_failure_status_is_an_authentication_error() -> None:
    def roundtrip(opcode: int, key: bytes, value: bytes) -> tuple[int, bytes]:
        return Status.EINVAL, b""

    with pytest.raises(AuthenticationError, match="EINVAL") as caught:
        authenticate(roundtrip, Credentials("u", PASSWORD), ["PLAIN"], node="n", tls=True)
    assert PASSWORD not in str(caught.value)


def test_continue_after_plain_is_refused() -> None:
    def roundtrip(opcode: int, key: bytes, value: bytes) -> tuple[int, bytes]:
        return Status.AUTH_CONTINUE, b""

    with pytest.raises(AuthenticationError, match="continue a PLAIN"):
        authenticate(roundtrip, Credentials("u", PASSWORD), ["PLAIN"], node="n", tls=True)


def test_scram_challenge_with_a_foreign_nonce_is_refused() -> None:
    def roundtrip(opcode: int, key: bytes, value: bytes) -> tuple[int, bytes]:
        return Status.AUTH_CONTINUE, b"r=not-our-nonce,s=QUJD,i=4096"

    with pytest.raises(AuthenticationError, match="bad server challenge"):
        authenticate(roundtrip, Credentials("u", PASSWORD), ["SCRAM-SHA1"], node="n", tls=False)


# --- a mechanism asked for (sasl_mechanism) ----------------------------------------------------


@pytest.mark.parametrize("requested", list(SaslMechanism))
def test_the_requested_mechanism_wins_over_the_preference(requested: SaslMechanism) -> None:
    offered = ["SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1", "PLAIN"]
    assert choose_mechanism(offered, tls=True, requested=requested) is requested


@pytest.mark.parametrize(
    ("offered", "requested", "tls", "allow", "fragments"),
    [
        (["SCRAM-SHA512", "PLAIN"], SaslMechanism.SCRAM_SHA1, False, False,
         ["asks for SCRAM-SHA1", "server offers only: SCRAM-SHA512, PLAIN.", "unset"]),
        (["SCRAM-SHA512"], SaslMechanism.PLAIN, True, False,
         ["asks for PLAIN", "server offers only: SCRAM-SHA512."]),
        ([], SaslMechanism.SCRAM_SHA256, True, False, ["server offers only: none."]),
        (["SCRAM-SHA512", "PLAIN"], SaslMechanism.PLAIN, False, False,
         ["PLAIN", "clear over plain TCP", "couchbases://", "--allow-plain-over-tcp"]),
    ],
)
def test_a_requested_mechanism_that_cannot_be_used_sends_nothing(
    offered: list[str], requested: SaslMechanism, tls: bool, allow: bool, fragments: list[str]
) -> None:
    def roundtrip(opcode: int, key: bytes, value: bytes) -> tuple[int, bytes]:
        raise AssertionError("nothing may be sent")

    with pytest.raises(ConfigError) as caught:
        authenticate(
            roundtrip, Credentials("dcp", PASSWORD), offered, node="db7:11210", tls=tls,
            allow_plain_over_tcp=allow, requested=requested,
        )
    text = str(caught.value)
    assert text.startswith("db7:11210: ")
    for fragment in fragments:
        assert fragment in text
    assert PASSWORD not in text


def test_requested_plain_over_tcp_when_allowed_sends_it() -> None:
    sent: list[bytes] = []

    def roundtrip(opcode: int, key: bytes, value: bytes) -> tuple[int, bytes]:
        sent.append(key)
        return Status.SUCCESS, b""

    used = authenticate(
        roundtrip, Credentials("dcp", PASSWORD), ["SCRAM-SHA512", "PLAIN"], node="n", tls=False,
        allow_plain_over_tcp=True, requested=SaslMechanism.PLAIN,
    )
    assert used is SaslMechanism.PLAIN and sent == [b"PLAIN"]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA256", "SCRAM-SHA1"])
def test_requested_scram_runs_that_exchange(mechanism: str) -> None:
    roundtrip, seen = scram_server(PASSWORD)
    used = authenticate(
        roundtrip, Credentials("dcp", PASSWORD), ["SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1"],
        node="n", tls=False, requested=SaslMechanism(mechanism),
    )
    assert used.value == mechanism
    assert seen == [Opcode.SASL_AUTH, Opcode.SASL_STEP]
