"""Connection strings: schemes, default ports, IPv6, and clear errors."""

from __future__ import annotations

import pytest

from replicator.dcp.cluster.connstr import ConnectionString, SeedNode, parse_connection_string
from replicator.errors import ConfigError


def test_plain_scheme_defaults_to_port_11210() -> None:
    parsed = parse_connection_string("couchbase://db1.example.com/travel-sample")
    assert parsed == ConnectionString((SeedNode("db1.example.com", 11210),), "travel-sample", False)


def test_tls_scheme_defaults_to_port_11207_and_keeps_explicit_ports() -> None:
    parsed = ConnectionString.parse("couchbases://a,b:12000,10.0.0.3/bucket")
    assert parsed.tls
    assert parsed.seeds == (
        SeedNode("a", 11207),
        SeedNode("b", 12000),
        SeedNode("10.0.0.3", 11207),
    )


def test_ipv6_hosts_in_brackets() -> None:
    parsed = parse_connection_string("couchbase://[::1]:11999,[fd00::5]/b")
    assert parsed.seeds == (SeedNode("::1", 11999), SeedNode("fd00::5", 11210))
    assert parsed.seeds[0].address == "[::1]:11999"


def test_scheme_is_case_insensitive_and_duplicate_seeds_collapse() -> None:
    parsed = parse_connection_string("COUCHBASE://h,h:11210/b")
    assert parsed.seeds == (SeedNode("h", 11210),)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("db1/travel", "no scheme"),
        ("http://db1/travel", "scheme 'http'"),
        ("couchbase://db1", "names no bucket"),
        ("couchbase://db1/", "names no bucket"),
        ("couchbase:///travel", "names no host"),
        ("couchbase://db1,,db2/travel", "empty host"),
        ("couchbase://db1:notaport/travel", "is not a number"),
        ("couchbase://db1:70000/travel", "outside 1-65535"),
        ("couchbase://::1/travel", "must be in brackets"),
        ("couchbase://[::1/travel", "closing ']'"),
        ("couchbase://[nothex]/travel", "not an IPv6 address"),
        ("couchbase://[::1]x/travel", "expected ':PORT'"),
        ("couchbase://db_1/travel", "not a valid host name"),
        ("couchbase://db1/tra vel", "bucket name"),
        ("couchbase://db1/travel?network=external", "query options"),
    ],
)
def test_bad_connection_strings_name_the_problem(text: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        parse_connection_string(text)
