"""Couchbase connection strings: `couchbase://host[:port][,host2[:port]]/bucket`.

`couchbases://` selects TLS. Ports default to the data service's 11210 (plain) and 11207 (TLS);
IPv6 addresses go in brackets (`couchbase://[::1]:11210/b`). Query options (`?x=y`) are not
supported: every setting of this replicator is an explicit keyword option instead.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from replicator.dcp.transport.socket_io import format_address
from replicator.errors import ConfigError

KV_PORT = 11210
KV_TLS_PORT = 11207

_SCHEMES = {"couchbase": False, "couchbases": True}
_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62})?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62})?)*\.?")
_BUCKET_NAME = re.compile(r"[A-Za-z0-9._%-]{1,100}")


@dataclass(frozen=True, slots=True)
class SeedNode:
    """One node to bootstrap from: host (IPv6 without brackets) and data-service port."""

    host: str
    port: int

    @property
    def address(self) -> str:
        """`host:port`, with an IPv6 host in brackets; how errors and logs name the node."""
        return format_address(self.host, self.port)


@dataclass(frozen=True, slots=True)
class ConnectionString:
    """A parsed connection string: seed nodes, the bucket to mirror, and whether to use TLS."""

    seeds: tuple[SeedNode, ...]
    bucket: str
    tls: bool

    @classmethod
    def parse(cls, text: str) -> ConnectionString:
        """Parse `couchbase://` or `couchbases://` text; ConfigError naming what is wrong.

        >>> ConnectionString.parse("couchbases://db1,db2:11999/travel")
        ... # doctest: +NORMALIZE_WHITESPACE
        ConnectionString(seeds=(SeedNode(host='db1', port=11207),
            SeedNode(host='db2', port=11999)), bucket='travel', tls=True)
        """
        return parse_connection_string(text)


def parse_connection_string(text: str) -> ConnectionString:
    """Parse a connection string; see the module docstring for the accepted form."""
    if not isinstance(text, str):
        raise ConfigError(f"connection string must be a str, not {type(text).__name__}")
    scheme, sep, rest = text.strip().partition("://")
    if not sep:
        raise ConfigError(
            f"connection string {text!r} has no scheme: expected couchbase://host/bucket "
            "or couchbases://host/bucket"
        )
    if scheme.lower() not in _SCHEMES:
        raise ConfigError(
            f"connection string scheme {scheme!r} is not supported: use couchbase:// "
            "(plain) or couchbases:// (TLS)"
        )
    tls = _SCHEMES[scheme.lower()]
    if "?" in rest or "#" in rest:
        raise ConfigError(
            f"connection string {text!r}: query options are not supported; "
            "pass settings as client options"
        )
    hosts_part, slash, bucket = rest.partition("/")
    if not slash or not bucket:
        raise ConfigError(f"connection string {text!r} names no bucket: add /BUCKET at the end")
    if not _BUCKET_NAME.fullmatch(bucket):
        raise ConfigError(
            f"bucket name {bucket!r} is invalid: 1-100 characters of letters, digits, "
            "'.', '_', '-' and '%'"
        )
    if not hosts_part:
        raise ConfigError(f"connection string {text!r} names no host")
    default_port = KV_TLS_PORT if tls else KV_PORT
    seeds: list[SeedNode] = []
    for raw in hosts_part.split(","):
        seed = _parse_seed(raw.strip(), default_port, text)
        if seed not in seeds:
            seeds.append(seed)
    return ConnectionString(tuple(seeds), bucket, tls)


def _parse_seed(raw: str, default_port: int, text: str) -> SeedNode:
    if not raw:
        raise ConfigError(f"connection string {text!r} has an empty host in its host list")
    if raw.startswith("["):
        host, bracket, after = raw[1:].partition("]")
        if not bracket:
            raise ConfigError(f"host {raw!r}: IPv6 address lacks its closing ']'")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"host {raw!r}: {host!r} is not an IPv6 address") from None
        if after and not after.startswith(":"):
            raise ConfigError(f"host {raw!r}: expected ':PORT' after the IPv6 address")
        port_text = after[1:] if after else None
    else:
        if raw.count(":") > 1:
            raise ConfigError(
                f"host {raw!r}: an IPv6 address must be in brackets, e.g. [{raw}]:11210"
            )
        host, colon, port_text_raw = raw.partition(":")
        port_text = port_text_raw if colon else None
        if not _HOSTNAME.fullmatch(host):
            raise ConfigError(f"host {host!r} is not a valid host name or IPv4 address")
    port = default_port if port_text is None else _parse_port(port_text, raw)
    return SeedNode(host, port)


def _parse_port(port_text: str, raw: str) -> int:
    if not (port_text.isascii() and port_text.isdigit()):
        raise ConfigError(f"host {raw!r}: port {port_text!r} is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ConfigError(f"host {raw!r}: port {port} is outside 1-65535")
    return port
