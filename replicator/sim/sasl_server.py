"""The server side of SASL as a simulated node runs it: SCRAM-SHA512/256/1 and PLAIN.

Credentials are kept salted (scramp's stored and server keys per mechanism), never in the
clear; PLAIN is checked against the SCRAM-SHA512 entry. Unknown users go through the whole
SCRAM exchange against a decoy entry and fail at the end, as kv_engine does, so a client cannot
tell a wrong user from a wrong password. Nothing here logs or echoes a password.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scramp import ScramException, ScramMechanism

from replicator.dcp.protocol.opcodes import Status

MECHANISMS = ("SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1", "PLAIN")
"""What SASL_LIST_MECHS answers by default, strongest first, spelled as Couchbase spells them."""


def check_mechanisms(mechanisms: Sequence[str]) -> tuple[str, ...]:
    """`mechanisms` as a tuple, or ValueError if it is empty, repeats one or names an unknown one.

    >>> check_mechanisms(["PLAIN"])
    ('PLAIN',)
    """
    unknown = [name for name in mechanisms if name not in MECHANISMS]
    if unknown:
        raise ValueError(
            f"unknown SASL mechanism {unknown[0]!r}: choose from {', '.join(MECHANISMS)}"
        )
    if not mechanisms or len(set(mechanisms)) != len(mechanisms):
        raise ValueError("a node must offer at least one SASL mechanism, each once")
    return tuple(mechanisms)

_SCRAMP_NAMES = {
    "SCRAM-SHA512": "SCRAM-SHA-512",
    "SCRAM-SHA256": "SCRAM-SHA-256",
    "SCRAM-SHA1": "SCRAM-SHA-1",
}

AuthInfo = tuple[bytes, bytes, bytes, int]
"""scramp's salted credential: (salt, stored key, server key, iteration count)."""


class CredentialStore:
    """Users and their salted SCRAM credentials, one entry per mechanism.

    >>> store = CredentialStore({"Administrator": "password"})
    >>> store.check_plain("Administrator", "password"), store.check_plain("Administrator", "x")
    (True, False)
    """

    def __init__(self, users: Mapping[str, str]) -> None:
        if not users:
            raise ValueError("a credential store needs at least one user")
        self._entries: dict[str, dict[str, AuthInfo]] = {}
        for username, password in users.items():
            if not username:
                raise ValueError("a user name must not be empty")
            self._entries[username] = {
                name: _auth_info(ScramMechanism(scramp_name), password)
                for name, scramp_name in _SCRAMP_NAMES.items()
            }
        decoy = secrets.token_hex(16)
        self._decoys = {
            name: _auth_info(ScramMechanism(scramp_name), decoy)
            for name, scramp_name in _SCRAMP_NAMES.items()
        }

    @property
    def usernames(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def scram_entry(self, username: str, mechanism: str) -> AuthInfo:
        """The salted entry to run SCRAM against: the user's, or a decoy for an unknown user."""
        entry = self._entries.get(username)
        return entry[mechanism] if entry is not None else self._decoys[mechanism]

    def check_plain(self, username: str, password: str) -> bool:
        """True if `password` is the user's: recompute the SHA-512 stored key and compare."""
        salt, stored_key, _server_key, iterations = self.scram_entry(username, "SCRAM-SHA512")
        _salt, candidate, _key, _iterations = ScramMechanism("SCRAM-SHA-512").make_auth_info(
            password, iteration_count=iterations, salt=salt
        )
        return username in self._entries and hmac.compare_digest(candidate, stored_key)


def _auth_info(mechanism: ScramMechanism, password: str) -> AuthInfo:
    salt, stored_key, server_key, iterations = mechanism.make_auth_info(password)
    return bytes(salt), stored_key, server_key, int(iterations)


@dataclass(frozen=True, slots=True)
class SaslReply:
    """What to answer a SASL_AUTH or SASL_STEP: a status and the server's message.

    `username` is set once the exchange succeeded.
    """

    status: Status
    payload: bytes = field(default=b"", repr=False)
    username: str | None = None


class SaslExchange:
    """One connection's SASL conversation: SASL_AUTH starts it, SASL_STEP continues SCRAM.

    `offered` is what the node lists (SASL_LIST_MECHS); any other mechanism is refused as
    unknown, as on a node where it is disabled.
    """

    def __init__(self, store: CredentialStore, *, offered: Sequence[str] = MECHANISMS) -> None:
        self._store = store
        self.offered = check_mechanisms(offered)
        self._mechanism: str | None = None
        self._scram: object | None = None
        self._username = ""

    def start(self, mechanism: str, payload: bytes) -> SaslReply:
        """Handle SASL_AUTH: PLAIN completes here; SCRAM answers with the server-first message."""
        self._mechanism = None
        self._scram = None
        if mechanism not in self.offered:
            return SaslReply(Status.NOT_SUPPORTED, f"unknown mechanism {mechanism[:40]}".encode())
        if mechanism == "PLAIN":
            return self._plain(payload)
        scramp_name = _SCRAMP_NAMES.get(mechanism)
        if scramp_name is None:
            return SaslReply(Status.NOT_SUPPORTED, f"unknown mechanism {mechanism[:40]}".encode())
        try:
            client_first = payload.decode()
            username = _scram_username(client_first)
            entry = self._store.scram_entry(username, mechanism)
            server = ScramMechanism(scramp_name).make_server(lambda _name: entry)
            server.set_client_first(client_first)
            server_first = server.get_server_first()
        except (ScramException, UnicodeDecodeError, ValueError):
            return SaslReply(Status.AUTH_ERROR)
        self._mechanism = mechanism
        self._scram = server
        self._username = username
        return SaslReply(Status.AUTH_CONTINUE, server_first.encode())

    def step(self, mechanism: str, payload: bytes) -> SaslReply:
        """Handle SASL_STEP: check the client proof; success carries the server signature."""
        server = self._scram
        if server is None or mechanism != self._mechanism:
            return SaslReply(Status.EINVAL)
        self._scram = None
        self._mechanism = None
        try:
            server.set_client_final(payload.decode())  # type: ignore[attr-defined]
            server_final = server.get_server_final()  # type: ignore[attr-defined]
        except (ScramException, UnicodeDecodeError, ValueError):
            return SaslReply(Status.AUTH_ERROR)
        if self._username not in self._store.usernames:
            return SaslReply(Status.AUTH_ERROR)  # the decoy's proof cannot match; be explicit
        return SaslReply(Status.SUCCESS, str(server_final).encode(), self._username)

    def _plain(self, payload: bytes) -> SaslReply:
        # PLAIN's message is authzid NUL authcid NUL password.
        parts = payload.split(b"\x00")
        if len(parts) != 3:
            return SaslReply(Status.AUTH_ERROR)
        try:
            username, password = parts[1].decode(), parts[2].decode()
        except UnicodeDecodeError:
            return SaslReply(Status.AUTH_ERROR)
        if not self._store.check_plain(username, password):
            return SaslReply(Status.AUTH_ERROR)
        return SaslReply(Status.SUCCESS, b"", username)


def _scram_username(client_first: str) -> str:
    """The user name (`n=`) of a SCRAM client-first message, unescaped."""
    # gs2 header: channel-binding flag "," [authzid] "," then the bare message.
    parts = client_first.split(",", 2)
    if len(parts) != 3:
        raise ValueError("SCRAM client-first message has no gs2 header")
    bare = parts[2]
    for attribute in bare.split(","):
        if attribute.startswith("n="):
            return attribute[2:].replace("=2C", ",").replace("=3D", "=")
    raise ValueError("SCRAM client-first message has no user name")
