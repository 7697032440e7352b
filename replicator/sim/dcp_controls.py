"""DCP_CONTROL on a simulated producer: which keys it accepts and what each one changes.

A pure function of the current settings and one (key, value) pair, following kv_engine's
`DcpProducer::control`: unknown keys and bad values answer EINVAL, features this producer does
not implement answer NOT_SUPPORTED, and `enable_expiry_opcode` is accepted but only takes effect
on a connection opened with INCLUDE_DELETE_TIMES (expirations then need delete times).
`change_streams` is accepted with "true" on a bucket that can retain history (magma) and
answers NOT_SUPPORTED on others, as kv_engine's storage check does.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from replicator.dcp.protocol.opcodes import Status

MAX_BUFFER_SIZE = 0xFFFFFFFF


class MarkerVersion(enum.Enum):
    """The snapshot-marker format a producer sends."""

    V1 = "1.0"
    V2_0 = "2.0"
    """Sent when sync replication (enable_sync_writes) is on."""
    V2_2 = "2.2"
    """Sent after max_marker_version=2.2 (collections connections only): carries the purge seqno."""


@dataclass(frozen=True, slots=True)
class ProducerSettings:
    """What a DCP producer connection's controls have set; the defaults are kv_engine's.

    `buffer_size` 0 means no flow control. `noop_interval_s` is in the control's unit (seconds).
    `expiry_opcode` is the effective setting (requested and delete times on).
    """

    buffer_size: int = 0
    noop_enabled: bool = False
    noop_interval_s: int = 1
    expiry_opcode: bool = False
    stream_end_on_close: bool = False
    sync_writes: bool = False
    max_marker_v2_2: bool = False
    force_compression: bool = False
    out_of_order_snapshots: bool = False
    priority: str = "medium"
    stream_ids: bool = False
    """enable_stream_id: several streams per vbucket, each message framed with its id."""
    change_streams: bool = False
    """change_streams: history is served as HISTORY snapshots (every revision retained)."""
    sequential_backfill: bool = False
    """backfill_order=sequential: one stream's backfill is served whole before the next's."""

    @property
    def marker_version(self) -> MarkerVersion:
        if self.max_marker_v2_2:
            return MarkerVersion.V2_2
        if self.sync_writes:
            return MarkerVersion.V2_0
        return MarkerVersion.V1


@dataclass(frozen=True, slots=True)
class ConnectionTraits:
    """What the connection negotiated before its controls: HELLO features and DCP_OPEN flags."""

    collections: bool = False
    snappy: bool = False
    delete_times: bool = False
    can_retain_history: bool = False
    """The bucket's storage can retain history (magma): change_streams may be enabled."""


@dataclass(frozen=True, slots=True)
class ControlOutcome:
    """The answer to one DCP_CONTROL: its status, the settings after it and, on error, why."""

    status: Status
    settings: ProducerSettings
    reason: str = ""


_TRUE_FALSE = {"true": True, "false": False}
_PRIORITIES = frozenset({"high", "medium", "low"})
_IGNORED_BOOLEANS = frozenset(
    {
        "supports_cursor_dropping",
        "supports_cursor_dropping_vulcan",
        "supports_hifi_MFU",
        "enable_ext_metadata",
        "enable_value_compression",
    }
)
"""Accepted with true/false and without effect here (no cursor dropping, no MFU, no ext meta)."""


def apply_control(
    settings: ProducerSettings, traits: ConnectionTraits, key: str, value: str
) -> ControlOutcome:
    """Apply one DCP_CONTROL (key, value) to `settings`.

    >>> outcome = apply_control(ProducerSettings(), ConnectionTraits(), "enable_noop", "true")
    >>> outcome.status.name, outcome.settings.noop_enabled
    ('SUCCESS', True)
    """
    if key == "connection_buffer_size":
        size = _unsigned(value)
        if size is None or size > MAX_BUFFER_SIZE:
            return _invalid(settings, key, value)
        return _ok(replace(settings, buffer_size=size))
    if key == "enable_noop":
        flag = _TRUE_FALSE.get(value)
        if flag is None:
            return _invalid(settings, key, value)
        return _ok(replace(settings, noop_enabled=flag))
    if key == "set_noop_interval":
        interval = _unsigned(value)
        if interval is None or not 1 <= interval <= 10800:
            return _invalid(settings, key, value)
        return _ok(replace(settings, noop_interval_s=interval))
    if key == "set_priority":
        if value not in _PRIORITIES:
            return _invalid(settings, key, value)
        return _ok(replace(settings, priority=value))
    if key == "enable_expiry_opcode":
        flag = _TRUE_FALSE.get(value)
        if flag is None:
            return _invalid(settings, key, value)
        # Expirations carry a delete time, so they need the INCLUDE_DELETE_TIMES open flag.
        return _ok(replace(settings, expiry_opcode=flag and traits.delete_times))
    if key == "send_stream_end_on_client_close_stream":
        if value not in _TRUE_FALSE:
            return _invalid(settings, key, value)
        # One-way: a client may turn it on, never back off.
        enabled = settings.stream_end_on_close or value == "true"
        return _ok(replace(settings, stream_end_on_close=enabled))
    if key == "max_marker_version":
        if value != "2.2":
            return _invalid(settings, key, value)
        if not traits.collections:
            return _invalid(settings, key, value, "max_marker_version 2.2 needs collections")
        return _ok(replace(settings, max_marker_v2_2=True))
    if key == "enable_sync_writes":
        if value != "true":
            return _invalid(settings, key, value)
        return _ok(replace(settings, sync_writes=True))
    if key == "force_value_compression":
        flag = _TRUE_FALSE.get(value)
        if flag is None:
            return _invalid(settings, key, value)
        if not traits.snappy:
            return _invalid(settings, key, value, "force_value_compression needs SNAPPY")
        return _ok(replace(settings, force_compression=flag))
    if key == "enable_out_of_order_snapshots":
        # Accepted; this producer never needs to reorder, which the protocol allows.
        if value not in ("true", "true_with_seqno_advanced"):
            return _invalid(settings, key, value)
        return _ok(replace(settings, out_of_order_snapshots=True))
    if key == "backfill_order":
        if value not in ("round-robin", "sequential"):
            return _invalid(settings, key, value)
        return _ok(replace(settings, sequential_backfill=value == "sequential"))
    if key == "v7_dcp_status_codes":
        if value != "true":
            return _invalid(settings, key, value)
        return _ok(settings)
    if key in _IGNORED_BOOLEANS:
        if value not in _TRUE_FALSE:
            return _invalid(settings, key, value)
        return _ok(settings)
    if key == "enable_stream_id":
        # One-way, as in kv_engine: once on, every stream request must name a stream id.
        if value != "true":
            return _invalid(settings, key, value)
        return _ok(replace(settings, stream_ids=True))
    if key == "change_streams":
        # One-way, as in kv_engine: only "true" is valid. kv_engine checks the storage only
        # (couchstore cannot retain history), not whether the connection has collections.
        if value != "true":
            return _invalid(settings, key, value)
        if not traits.can_retain_history:
            reason = "change_streams needs a bucket that can retain history (magma)"
            return ControlOutcome(Status.NOT_SUPPORTED, settings, reason)
        return _ok(replace(settings, change_streams=True))
    if key in (
        "stream_buffer_size",
        "flatbuffers_system_events",
        "cache_transfer",
    ):
        return ControlOutcome(Status.NOT_SUPPORTED, settings, f"{key} is not supported")
    return _invalid(settings, key, value, f"unknown control key {key[:60]!r}")


def _unsigned(text: str) -> int | None:
    if not text or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def _ok(settings: ProducerSettings) -> ControlOutcome:
    return ControlOutcome(Status.SUCCESS, settings)


def _invalid(
    settings: ProducerSettings, key: str, value: str, reason: str | None = None
) -> ControlOutcome:
    why = reason or f"invalid value {value[:40]!r} for {key[:60]!r}"
    return ControlOutcome(Status.EINVAL, settings, why)
