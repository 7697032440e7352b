"""SASL authentication to a data node: mechanism choice and the exchange, without sockets.

Preference: SCRAM-SHA512 > SCRAM-SHA256 > SCRAM-SHA1 (scramp's client; the server proves it knows
the password too), unless the caller asks for one mechanism (`requested`), for servers and proxies
that need it. PLAIN sends the password in clear, so it is used only over TLS unless the caller
explicitly allows it over plain TCP, requested or not. The password never appears in a repr, a
log line or an exception text.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from scramp import ScramClient, ScramException

from replicator.dcp.protocol.opcodes import Opcode, Status
from replicator.errors import AuthenticationError, ConfigError


@dataclass(frozen=True, slots=True, repr=False)
class Credentials:
    """User name and password of a Couchbase RBAC user (needs the DCP reader role)."""

    username: str
    password: str

    def __post_init__(self) -> None:
        if not self.username:
            raise ConfigError("credentials need a non-empty user name")

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=<hidden>)"

    __str__ = __repr__


class SaslMechanism(enum.Enum):
    """SASL mechanisms by the names kv_engine lists them with (no dash after SHA)."""

    SCRAM_SHA512 = "SCRAM-SHA512"
    SCRAM_SHA256 = "SCRAM-SHA256"
    SCRAM_SHA1 = "SCRAM-SHA1"
    PLAIN = "PLAIN"


SASL_MECHANISM_NAMES = ", ".join(mechanism.value for mechanism in SaslMechanism)
"""The names a user may ask for, as error messages list them."""


def parse_sasl_mechanism(name: str) -> SaslMechanism:
    """The mechanism a user named: any case, and the RFC spelling with a dash after SHA too.

    ValueError for a name that is none of SASL_MECHANISM_NAMES.

    >>> parse_sasl_mechanism("scram-sha-256").value
    'SCRAM-SHA256'
    """
    # kv_engine writes SCRAM-SHA512 where RFC 5802 and scramp write SCRAM-SHA-512: accept both.
    canonical = name.strip().upper().replace("_", "-").replace("SHA-", "SHA")
    try:
        return SaslMechanism(canonical)
    except ValueError:
        raise ValueError(f"unknown SASL mechanism {name[:40]!r}") from None


SCRAM_PREFERENCE = (
    SaslMechanism.SCRAM_SHA512,
    SaslMechanism.SCRAM_SHA256,
    SaslMechanism.SCRAM_SHA1,
)

_SCRAMP_NAMES = {
    SaslMechanism.SCRAM_SHA512: "SCRAM-SHA-512",
    SaslMechanism.SCRAM_SHA256: "SCRAM-SHA-256",
    SaslMechanism.SCRAM_SHA1: "SCRAM-SHA-1",
}


def choose_mechanism(
    offered: Iterable[str],
    *,
    tls: bool,
    allow_plain_over_tcp: bool = False,
    node: str | None = None,
    requested: SaslMechanism | None = None,
) -> SaslMechanism:
    """Pick `requested` if given, else the strongest mechanism both sides support.

    ConfigError when PLAIN would be used on a plain-TCP connection (and is not allowed), when
    the server does not offer `requested`, or when nothing usable is offered; its text starts
    with `node` (host:port) when given.

    >>> choose_mechanism(["PLAIN", "SCRAM-SHA1", "SCRAM-SHA512"], tls=False).value
    'SCRAM-SHA512'
    >>> choose_mechanism(["SCRAM-SHA512", "PLAIN"], tls=True, requested=SaslMechanism.PLAIN).value
    'PLAIN'
    """
    # Keep the server's order (strongest first on kv_engine) for the error texts.
    names = list(dict.fromkeys(name.strip().upper() for name in offered if name.strip()))
    where = f"{node}: " if node else ""
    listed = ", ".join(names) or "none"
    if requested is not None:
        if requested.value not in names:
            raise ConfigError(
                f"{where}sasl_mechanism (--sasl-mechanism) asks for {requested.value}, but the "
                f"server offers only: {listed}. Choose one of those, enable {requested.value} on "
                "the server, or unset sasl_mechanism to use the strongest SCRAM offered"
            )
        if requested is SaslMechanism.PLAIN and not (tls or allow_plain_over_tcp):
            raise ConfigError(
                f"{where}sasl_mechanism PLAIN would send the password in clear over plain TCP: "
                "connect with couchbases:// (TLS), choose a SCRAM mechanism, or, if the network "
                "is trusted, set allow_plain_over_tcp (--allow-plain-over-tcp)"
            )
        return requested
    for mechanism in SCRAM_PREFERENCE:
        if mechanism.value in names:
            return mechanism
    if SaslMechanism.PLAIN.value in names:
        if tls or allow_plain_over_tcp:
            return SaslMechanism.PLAIN
        raise ConfigError(
            f"{where}the server offers only SASL PLAIN, which would send the password in clear "
            "over plain TCP: connect with couchbases:// (TLS), enable SCRAM on the server, or, if "
            "the network is trusted, set allow_plain_over_tcp (--allow-plain-over-tcp)"
        )
    raise ConfigError(f"{where}no supported SASL mechanism offered (server lists: {listed})")


class SaslSession(Protocol):
    """One authentication exchange on one connection."""

    mechanism: SaslMechanism

    def initial_response(self) -> bytes:
        """The value of the SASL_AUTH request."""
        ...

    def step(self, challenge: bytes) -> bytes:
        """Answer the server's AUTH_CONTINUE challenge (the value of SASL_STEP)."""
        ...

    def finish(self, server_final: bytes) -> None:
        """Check the server's SUCCESS value (SCRAM: its signature)."""
        ...


class PlainSession:
    """SASL PLAIN: `\\0user\\0password` in one message."""

    mechanism = SaslMechanism.PLAIN

    def __init__(self, credentials: Credentials, *, node: str) -> None:
        self._credentials = credentials
        self._node = node

    def initial_response(self) -> bytes:
        c = self._credentials
        return b"\x00" + c.username.encode() + b"\x00" + c.password.encode()

    def step(self, challenge: bytes) -> bytes:
        raise AuthenticationError(self._node, "server asked to continue a PLAIN authentication")

    def finish(self, server_final: bytes) -> None:
        return None


class ScramSession:
    """SCRAM with SHA-512/256/1 via scramp; verifies the server's signature at the end."""

    def __init__(self, credentials: Credentials, mechanism: SaslMechanism, *, node: str) -> None:
        if mechanism not in _SCRAMP_NAMES:
            raise ValueError(f"{mechanism.value} is not a SCRAM mechanism")
        self.mechanism = mechanism
        self._node = node
        self._username = credentials.username
        try:
            self._client = ScramClient(
                [_SCRAMP_NAMES[mechanism]], credentials.username, credentials.password
            )
        except ScramException:
            # scramp's text may quote its input; say only what is wrong.
            raise ConfigError(
                f"user {credentials.username!r}: user name or password cannot be prepared "
                "for SCRAM (SASLprep rejected a character)"
            ) from None

    def initial_response(self) -> bytes:
        return str(self._client.get_client_first()).encode()

    def step(self, challenge: bytes) -> bytes:
        try:
            self._client.set_server_first(challenge.decode())
            return str(self._client.get_client_final()).encode()
        except (ScramException, UnicodeDecodeError) as exc:
            raise AuthenticationError(
                self._node, f"{self.mechanism.value}: bad server challenge ({_reason(exc)})"
            ) from None

    def finish(self, server_final: bytes) -> None:
        try:
            self._client.set_server_final(server_final.decode())
        except (ScramException, UnicodeDecodeError) as exc:
            raise AuthenticationError(
                self._node,
                f"{self.mechanism.value}: the server's final message does not prove it knows "
                f"the password of {self._username!r} ({_reason(exc)})",
            ) from None


def _reason(exc: Exception) -> str:
    # scramp messages never contain the password; keep only the first line, short.
    return str(exc.args[0] if exc.args else exc).splitlines()[0][:200]


def start_session(credentials: Credentials, mechanism: SaslMechanism, *, node: str) -> SaslSession:
    """A fresh session for `mechanism`."""
    if mechanism is SaslMechanism.PLAIN:
        return PlainSession(credentials, node=node)
    return ScramSession(credentials, mechanism, node=node)


SaslRoundTrip = Callable[[int, bytes, bytes], tuple[int, bytes]]
"""Send a SASL request (opcode, key = mechanism name, value) and return (status, value)."""


def authenticate(
    roundtrip: SaslRoundTrip,
    credentials: Credentials,
    offered: Iterable[str],
    *,
    node: str,
    tls: bool,
    allow_plain_over_tcp: bool = False,
    requested: SaslMechanism | None = None,
    max_steps: int = 4,
) -> SaslMechanism:
    """Run SASL_AUTH / SASL_STEP until the server says SUCCESS; return the mechanism used.

    The mechanism is `requested` if given, else the strongest offered (see choose_mechanism).
    AUTH_ERROR (or any other failure status) raises AuthenticationError naming the node and
    the user, never the password.
    """
    mechanism = choose_mechanism(
        offered, tls=tls, allow_plain_over_tcp=allow_plain_over_tcp, node=node,
        requested=requested,
    )
    session = start_session(credentials, mechanism, node=node)
    key = mechanism.value.encode()
    status, value = roundtrip(Opcode.SASL_AUTH, key, session.initial_response())
    for _ in range(max_steps):
        if status == Status.SUCCESS:
            session.finish(value)
            return mechanism
        if status != Status.AUTH_CONTINUE:
            break
        status, value = roundtrip(Opcode.SASL_STEP, key, session.step(value))
    if status == Status.AUTH_ERROR:
        raise AuthenticationError(
            node,
            f"authentication of user {credentials.username!r} with {mechanism.value} was "
            "refused: wrong user name or password, or the user lacks access",
        )
    if status == Status.AUTH_CONTINUE:
        raise AuthenticationError(node, f"{mechanism.value} did not finish in {max_steps} steps")
    raise AuthenticationError(
        node,
        f"authentication of user {credentials.username!r} with {mechanism.value} failed: "
        f"status {_status_name(status)}",
    )


def _status_name(status: int) -> str:
    try:
        return f"{Status(status).name} (0x{status:02x})"
    except ValueError:
        return f"0x{status:02x}"
