"""The exceptions a user of replicator can meet, each naming what is wrong and what to do.

Callers catch meaning, not socket or py4j noise. Messages never contain secrets.
"""

from __future__ import annotations


class ReplicatorError(Exception):
    """Base of every error the replicator raises on purpose; its text is fit for an operator."""


class ConfigError(ReplicatorError):
    """A setting is missing or invalid."""


class DeltaJarsMissing(ReplicatorError):
    """Delta Lake's jars are not where the session builder looked for them."""


class ProtocolError(ReplicatorError):
    """A peer sent bytes that are not valid memcached binary protocol / DCP.

    `opcode` is the frame's opcode when the header could be read, else None.
    """

    def __init__(self, message: str, *, opcode: int | None = None) -> None:
        prefix = f"opcode 0x{opcode:02x}: " if opcode is not None else ""
        super().__init__(prefix + message)
        self.opcode = opcode


class NodeError(ReplicatorError):
    """Something went wrong with one node; `node` is its host:port."""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"{node}: {message}")
        self.node = node


class AuthenticationError(NodeError):
    """The node refused the credentials. Not retried: the same credentials fail again."""


class BucketNotFoundError(NodeError):
    """The node has no bucket of that name, or the user may not access it."""


class TlsError(NodeError):
    """The TLS handshake failed (wrong CA, wrong host name, not a TLS port)."""


class NodeUnreachableError(NodeError):
    """No TCP connection could be made to the node."""


class UnsupportedCommandError(NodeError):
    """The node refused a command the caller needs (an older server, or a proxy without it)."""

    def __init__(self, node: str, message: str, *, command: str) -> None:
        super().__init__(node, message)
        self.command = command


class ConnectionLostError(NodeError):
    """An established connection broke or went silent; the cluster client reconnects."""


class NotAMirrorError(ReplicatorError):
    """The target path holds something other than a mirror of this bucket."""


class OwnershipConflict(ReplicatorError):
    """Another live replicator owns some of the vbuckets this one was asked to mirror."""
