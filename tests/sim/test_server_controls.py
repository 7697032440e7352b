"""DCP_CONTROL keys on the simulated producer, as a pure table (no sockets)."""

from __future__ import annotations

import pytest

from replicator.dcp.protocol.opcodes import Status
from replicator.sim.dcp_controls import (
    ConnectionTraits,
    MarkerVersion,
    ProducerSettings,
    apply_control,
)

COLLECTIONS = ConnectionTraits(collections=True, snappy=True, delete_times=True)
PLAIN = ConnectionTraits()


def apply(
    key: str, value: str, traits: ConnectionTraits = COLLECTIONS
) -> tuple[Status, ProducerSettings]:
    outcome = apply_control(ProducerSettings(), traits, key, value)
    return outcome.status, outcome.settings


def test_buffer_size_noop_and_interval() -> None:
    assert apply("connection_buffer_size", "10485760") == (
        Status.SUCCESS,
        ProducerSettings(buffer_size=10485760),
    )
    assert apply("connection_buffer_size", "0")[1].buffer_size == 0  # flow control off
    assert apply("connection_buffer_size", "4294967296")[0] == Status.EINVAL
    assert apply("enable_noop", "true")[1].noop_enabled
    assert apply("set_noop_interval", "120")[1].noop_interval_s == 120
    for bad in ("", "abc", "0", "-5", "10801", "1.5"):
        assert apply("set_noop_interval", bad)[0] == Status.EINVAL, bad


def test_expiry_opcode_takes_effect_only_with_delete_times() -> None:
    status, settings = apply("enable_expiry_opcode", "true", COLLECTIONS)
    assert status == Status.SUCCESS and settings.expiry_opcode
    status, settings = apply("enable_expiry_opcode", "true", PLAIN)
    assert status == Status.SUCCESS and not settings.expiry_opcode


def test_stream_end_on_close_can_only_be_turned_on() -> None:
    on = apply_control(
        ProducerSettings(), PLAIN, "send_stream_end_on_client_close_stream", "true"
    ).settings
    assert on.stream_end_on_close
    still_on = apply_control(on, PLAIN, "send_stream_end_on_client_close_stream", "false")
    assert still_on.status == Status.SUCCESS and still_on.settings.stream_end_on_close


@pytest.mark.parametrize(
    ("controls", "expected"),
    [
        ((), MarkerVersion.V1),
        ((("enable_sync_writes", "true"),), MarkerVersion.V2_0),
        ((("max_marker_version", "2.2"),), MarkerVersion.V2_2),
        ((("enable_sync_writes", "true"), ("max_marker_version", "2.2")), MarkerVersion.V2_2),
    ],
)
def test_marker_version(controls: tuple[tuple[str, str], ...], expected: MarkerVersion) -> None:
    settings = ProducerSettings()
    for key, value in controls:
        outcome = apply_control(settings, COLLECTIONS, key, value)
        assert outcome.status == Status.SUCCESS
        settings = outcome.settings
    assert settings.marker_version is expected


def test_max_marker_version_needs_collections_and_the_value_2_2() -> None:
    assert apply("max_marker_version", "2.2", PLAIN)[0] == Status.EINVAL
    assert apply("max_marker_version", "2.0")[0] == Status.EINVAL
    outcome = apply_control(ProducerSettings(), PLAIN, "max_marker_version", "2.2")
    assert "collections" in outcome.reason


def test_unknown_keys_are_einval_and_unsimulated_features_not_supported() -> None:
    outcome = apply_control(ProducerSettings(), COLLECTIONS, "enable_teleport", "true")
    assert outcome.status == Status.EINVAL and "enable_teleport" in outcome.reason
    assert apply("change_streams", "true")[0] == Status.NOT_SUPPORTED
    assert apply("enable_stream_id", "true")[1].stream_ids
    assert apply("enable_stream_id", "false")[0] == Status.EINVAL
    assert apply("supports_cursor_dropping", "true")[0] == Status.SUCCESS
    assert apply("set_priority", "urgent")[0] == Status.EINVAL
    assert apply("force_value_compression", "true", PLAIN)[0] == Status.EINVAL
    assert apply("force_value_compression", "true")[1].force_compression
    assert apply("enable_out_of_order_snapshots", "true_with_seqno_advanced")[0] == Status.SUCCESS


def test_change_streams_needs_true_and_a_bucket_that_can_retain_history() -> None:
    magma = ConnectionTraits(can_retain_history=True)  # no collections: kv_engine accepts
    status, settings = apply("change_streams", "true", magma)
    assert status == Status.SUCCESS and settings.change_streams
    for value in ("false", "", "TRUE", "1"):
        assert apply("change_streams", value, magma)[0] == Status.EINVAL, value
    outcome = apply_control(ProducerSettings(), COLLECTIONS, "change_streams", "true")
    assert outcome.status == Status.NOT_SUPPORTED and "magma" in outcome.reason
    assert not outcome.settings.change_streams
