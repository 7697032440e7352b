"""Change rows: schema, item conversion, collection names, many batches through one converter."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    SeqnoAdvanced,
    SystemEvent,
    SystemEventType,
)
from replicator.errors import ProtocolError
from replicator.staging.collections import CollectionRegistry, default_collection_names
from replicator.staging.rows import (
    CHANGE_SCHEMA,
    DELETE,
    UPSERT,
    ChangeRowConverter,
)
from tests.dcp.runs import as_runs

NOW = 1_700_000_000.0
VB = 33


def mutation(
    seqno: int,
    key: bytes = b"airline_10",
    value: bytes = b'{"name": "40-Mile Air"}',
    *,
    is_json: bool = True,
    expiration: int = 0,
    cas: int = 0x1234,
    collection_id: int = 0,
    xattrs: tuple[tuple[str, str], ...] = (),
) -> Mutation:
    return Mutation(
        VB, seqno, 2, cas, 0x02000006, expiration, 0, collection_id, key, value, is_json, xattrs
    )


@pytest.fixture(params=["typed events", "columnar runs"], autouse=True)
def item_shape(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every conversion test runs twice: on typed events and on the runs a connection makes."""
    _SHAPE["columnar"] = request.param == "columnar runs"
    yield
    _SHAPE["columnar"] = False


_SHAPE = {"columnar": False}


def convert(*items: object, names: object = default_collection_names) -> list[dict[str, object]]:
    converter = ChangeRowConverter(names, now=lambda: NOW)  # type: ignore[arg-type]
    shaped = as_runs(items) if _SHAPE["columnar"] else list(items)
    batch = converter.convert(shaped)  # type: ignore[arg-type]
    assert batch.schema.equals(CHANGE_SCHEMA)
    converted: list[dict[str, object]] = batch.to_pylist()
    return converted


def test_json_mutation_becomes_an_upsert_row() -> None:
    [row] = convert(mutation(5))
    assert row == {
        "vbucket": VB,
        "scope": "_default",
        "collection": "_default",
        "collection_id": 0,
        "key": "airline_10",
        "seqno": 5,
        "rev_seqno": 2,
        "cas": 0x1234,
        "flags": 0x02000006,
        "expiry": None,
        "op": UPSERT,
        "is_json": True,
        "doc": '{"name": "40-Mile Air"}',
        "value": None,
        "xattrs": None,
    }


def test_non_json_value_goes_to_the_binary_column() -> None:
    [row] = convert(mutation(6, value=b"\x00\xffraw", is_json=False))
    assert (row["is_json"], row["doc"], row["value"]) == (False, None, b"\x00\xffraw")


def test_xattrs_become_one_json_object() -> None:
    xattrs = (("_sync", '{"rev": "1-abc", "seq": 4}'), ("tag", '"blue"'))
    [with_xattrs, without] = convert(mutation(7, xattrs=xattrs), mutation(8, key=b"other"))
    assert json.loads(str(with_xattrs["xattrs"])) == {
        "_sync": {"rev": "1-abc", "seq": 4},
        "tag": "blue",
    }
    assert without["xattrs"] is None


def test_future_expiry_is_an_upsert_with_a_utc_timestamp() -> None:
    [row] = convert(mutation(9, expiration=int(NOW) + 60))
    assert row["op"] == UPSERT
    assert row["expiry"] == datetime.fromtimestamp(NOW + 60, tz=UTC)


@pytest.mark.parametrize("expiration", [int(NOW), int(NOW) - 3600])
def test_mutation_already_expired_becomes_a_delete(expiration: int) -> None:
    [row] = convert(mutation(10, expiration=expiration))
    assert row["op"] == DELETE
    assert (row["doc"], row["value"]) == (None, None)
    assert row["expiry"] == datetime.fromtimestamp(expiration, tz=UTC)


def test_expiry_is_judged_by_the_injected_clock() -> None:
    item = mutation(11, expiration=int(NOW) + 10)
    early = ChangeRowConverter(now=lambda: NOW).convert([item])
    late = ChangeRowConverter(now=lambda: NOW + 11).convert([item])
    assert early["op"].to_pylist() == [UPSERT]
    assert late["op"].to_pylist() == [DELETE]


def test_deletion_and_expiration_become_delete_rows() -> None:
    deletion = Deletion(VB, 12, 3, 99, 0, b"gone", 1_699_999_999, (("_sync", "{}"),))
    expiration = Expiration(VB, 13, 4, 100, 0, b"old", 1_699_999_999)
    rows = convert(deletion, expiration)
    assert [(row["key"], row["op"], row["seqno"], row["cas"]) for row in rows] == [
        ("gone", DELETE, 12, 99),
        ("old", DELETE, 13, 100),
    ]
    for row in rows:
        assert (row["flags"], row["expiry"], row["doc"], row["value"]) == (None,) * 4
        assert row["is_json"] is False
    assert json.loads(str(rows[0]["xattrs"])) == {"_sync": {}}
    assert rows[1]["xattrs"] is None


def test_system_events_and_seqno_advanced_produce_no_rows() -> None:
    event = SystemEvent(VB, 1, SystemEventType.SCOPE_CREATED, 0, "s", 2, 8, None)
    rows = convert(event, SeqnoAdvanced(VB, 2), mutation(3))
    assert [row["seqno"] for row in rows] == [3]


def test_empty_chunk_gives_an_empty_batch_with_the_schema() -> None:
    batch = ChangeRowConverter().convert([])
    assert batch.num_rows == 0 and batch.schema.equals(CHANGE_SCHEMA)


def test_key_that_is_not_utf8_names_vbucket_and_seqno() -> None:
    with pytest.raises(ProtocolError, match=f"vbucket {VB}: seqno 15: key is not valid UTF-8"):
        convert(mutation(14, key=b"fine"), mutation(15, key=b"bad\xc3("))


def test_json_document_that_is_not_utf8_is_rejected() -> None:
    with pytest.raises(ProtocolError, match="seqno 16: JSON document is not valid UTF-8"):
        convert(mutation(16, value=b'"\xff"'))


def test_cas_that_does_not_fit_int64_is_rejected() -> None:
    with pytest.raises(ProtocolError, match=f"vbucket {VB}: Mutation seqno 17: cas 0x8"):
        convert(mutation(17, cas=2**63))
    [row] = convert(mutation(18, cas=2**63 - 1))
    assert row["cas"] == 2**63 - 1


def test_unknown_collection_names_vbucket_and_seqno() -> None:
    with pytest.raises(ProtocolError, match=f"vbucket {VB}: Mutation seqno 19: collection id 0x9"):
        convert(mutation(19, collection_id=9))


def test_registry_learns_scopes_and_collections_from_system_events_in_order() -> None:
    registry = CollectionRegistry()
    events = [
        SystemEvent(VB, 20, SystemEventType.SCOPE_CREATED, 0, "inventory", 5, 8, None),
        SystemEvent(VB, 21, SystemEventType.COLLECTION_CREATED, 0, "hotel", 6, 8, 0xC),
        mutation(22, collection_id=0xC),
        mutation(23),
    ]
    rows = convert(*events, names=registry)
    assert [(row["scope"], row["collection"], row["collection_id"]) for row in rows] == [
        ("inventory", "hotel", 0xC),
        ("_default", "_default", 0),
    ]
    assert registry.manifest_uid == 6


def test_registry_keeps_names_of_dropped_collections() -> None:
    registry = CollectionRegistry()
    registry.learn(SystemEvent(VB, 1, SystemEventType.COLLECTION_CREATED, 0, "tmp", 2, 0, 0xA))
    registry.learn(SystemEvent(VB, 2, SystemEventType.COLLECTION_DROPPED, 0, "", 3, 0, 0xA))
    assert registry(0xA) == ("_default", "tmp")


MANIFEST = {
    "uid": "1f",
    "scopes": [
        {"name": "_default", "uid": "0", "collections": [{"name": "_default", "uid": "0"}]},
        {
            "name": "inventory",
            "uid": "8",
            "collections": [{"name": "airline", "uid": "a"}, {"name": "route", "uid": "b"}],
        },
    ],
}


def test_registry_loads_a_collections_manifest() -> None:
    registry = CollectionRegistry.from_manifest(json.dumps(MANIFEST))
    assert registry.manifest_uid == 0x1F
    assert registry(0) == ("_default", "_default")
    assert registry(0xA) == ("inventory", "airline")
    assert registry(0xB) == ("inventory", "route")
    with pytest.raises(LookupError, match="0xc is unknown"):
        registry(0xC)


def test_registry_reports_a_collection_of_an_unknown_scope() -> None:
    registry = CollectionRegistry()
    registry.learn(SystemEvent(VB, 1, SystemEventType.COLLECTION_CREATED, 0, "c", 2, 0x9, 0xD))
    with pytest.raises(LookupError, match="scope id 0x9"):
        registry(0xD)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ("{not json", "not JSON"),
        ("[]", "not a JSON object"),
        ({"scopes": []}, "manifest uid is missing"),
        ({"uid": "xyz", "scopes": []}, "manifest uid 'xyz' is not hex"),
        ({"uid": "1"}, "'scopes' is not a list"),
        ({"uid": "1", "scopes": [{"uid": "8"}]}, "scope name is missing"),
        (
            {"uid": "1", "scopes": [{"name": "s", "uid": "8", "collections": [{"name": "c"}]}]},
            "uid of collection s.c is missing",
        ),
    ],
)
def test_bad_manifest_is_rejected_naming_the_problem(manifest: object, message: str) -> None:
    registry = CollectionRegistry()
    with pytest.raises(ProtocolError, match=message):
        registry.load_manifest(manifest)  # type: ignore[arg-type]
    # Nothing of a rejected manifest is learned.
    assert registry.manifest_uid == 0


def test_default_names_know_only_the_default_collection() -> None:
    assert default_collection_names(0) == ("_default", "_default")
    with pytest.raises(LookupError):
        default_collection_names(8)


def test_one_converter_keeps_every_row_over_many_batches() -> None:
    items = [
        Mutation(VB, seqno, 1, seqno, 0, 0, 0, 0, b"user::%d" % seqno, b'{"n": %d}' % seqno, True)
        for seqno in range(1, 40_001)
    ]
    converter = ChangeRowConverter()
    rows = sum(converter.convert(items[i : i + 4096]).num_rows for i in range(0, 40_000, 4096))
    assert rows == 40_000


def test_schema_columns_and_types() -> None:
    assert CHANGE_SCHEMA.names == [
        "vbucket",
        "scope",
        "collection",
        "collection_id",
        "key",
        "seqno",
        "rev_seqno",
        "cas",
        "flags",
        "expiry",
        "op",
        "is_json",
        "doc",
        "value",
        "xattrs",
    ]
    assert CHANGE_SCHEMA.field("expiry").type == pa.timestamp("us", tz="UTC")
    assert CHANGE_SCHEMA.field("vbucket").type == pa.int32()
    assert CHANGE_SCHEMA.field("value").type == pa.binary()
