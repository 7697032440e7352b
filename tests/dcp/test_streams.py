"""Stream requests from positions, reply outcomes, end actions, backoff, stream states."""

from __future__ import annotations

import random

import pytest

from replicator.dcp.cluster.streams import (
    EndAction,
    OutcomeKind,
    StreamState,
    VbucketStream,
    plan_stream_request,
    read_stream_response,
    stream_end_action,
)
from replicator.dcp.protocol.events import StreamEndReason
from replicator.dcp.protocol.opcodes import Opcode, Status, StreamRequestFlags
from replicator.dcp.protocol.responses import Response, encode_failover_log, encode_rollback_seqno
from replicator.errors import ConfigError, ProtocolError
from replicator.model.backoff import Backoff
from replicator.model.positions import MAX_SEQNO, FailoverLog, VbucketPosition

LOG = FailoverLog.of([(0xCC, 200), (0xBB, 100), (0xAA, 0)])


def test_resume_uses_the_failover_entry_of_the_committed_seqno() -> None:
    request = plan_stream_request(VbucketPosition.at_boundary(7, 0xCC, 150), LOG)
    assert (request.vbucket, request.start_seqno, request.end_seqno) == (7, 150, MAX_SEQNO)
    assert (request.snapshot_start, request.snapshot_end) == (150, 150)
    assert request.vbucket_uuid == 0xBB  # newest entry whose seqno <= 150, not the newest
    assert request.flags == StreamRequestFlags.ACTIVE_VB_ONLY
    assert not request.flags & StreamRequestFlags.IGNORE_PURGED_TOMBSTONES
    assert request.purge_seqno is None


def test_resume_exactly_at_a_branch_point_takes_that_branch() -> None:
    request = plan_stream_request(VbucketPosition.at_boundary(7, 0, 200), LOG)
    assert request.vbucket_uuid == 0xCC


def test_start_from_zero_uses_uuid_zero_and_needs_no_log() -> None:
    request = plan_stream_request(VbucketPosition.beginning(3), None, end_seqno=500)
    assert (request.start_seqno, request.vbucket_uuid, request.end_seqno) == (0, 0, 500)


def test_purge_seqno_sent_only_when_supported_and_known() -> None:
    position = VbucketPosition.at_boundary(1, 0xBB, 120, purge_seqno=90)
    assert plan_stream_request(position, LOG, send_purge_seqno=True).purge_seqno == 90
    assert plan_stream_request(position, LOG, send_purge_seqno=False).purge_seqno is None
    unknown = VbucketPosition.at_boundary(1, 0xBB, 120)
    assert plan_stream_request(unknown, LOG, send_purge_seqno=True).purge_seqno is None


def test_partial_snapshot_position_keeps_its_range() -> None:
    position = VbucketPosition(2, 0xBB, 120, 110, 130)
    request = plan_stream_request(position, LOG)
    assert (request.snapshot_start, request.start_seqno, request.snapshot_end) == (110, 120, 130)


def test_invalid_requests_are_refused_before_sending() -> None:
    with pytest.raises(ConfigError, match="needs the failover log"):
        plan_stream_request(VbucketPosition.at_boundary(1, 0xBB, 5), None)
    with pytest.raises(ConfigError, match="beyond the end"):
        plan_stream_request(VbucketPosition.at_boundary(1, 0xBB, 50), LOG, end_seqno=40)


def _reply(status: int, value: bytes = b"") -> Response:
    return Response(Opcode.DCP_STREAM_REQ, status, 9, value)


def test_success_reply_carries_the_failover_log() -> None:
    outcome = read_stream_response(_reply(Status.SUCCESS, encode_failover_log(LOG)))
    assert outcome.kind is OutcomeKind.OPENED
    assert outcome.failover_log == LOG


def test_rollback_seqno_is_read_from_the_value() -> None:
    outcome = read_stream_response(_reply(Status.ROLLBACK, encode_rollback_seqno(77)))
    assert (outcome.kind, outcome.rollback_seqno) == (OutcomeKind.ROLLBACK, 77)


def test_rollback_with_the_seqno_in_the_extras_is_a_protocol_error() -> None:
    reply = Response(Opcode.DCP_STREAM_REQ, Status.ROLLBACK, 9, b"", extras=b"\0" * 8)
    with pytest.raises(ProtocolError, match="rollback value of 0 bytes"):
        read_stream_response(reply)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (Status.ERANGE, OutcomeKind.OUT_OF_RANGE),
        (Status.ETMPFAIL, OutcomeKind.RETRY_LATER),
        (Status.EBUSY, OutcomeKind.RETRY_LATER),
        (Status.KEY_EEXISTS, OutcomeKind.ALREADY_EXISTS),
        (Status.EACCESS, OutcomeKind.FAILED),
        (0x99, OutcomeKind.FAILED),
    ],
)
def test_other_statuses(status: int, kind: OutcomeKind) -> None:
    assert read_stream_response(_reply(status)).kind is kind


def test_not_my_vbucket_may_carry_a_map() -> None:
    with_map = read_stream_response(_reply(Status.NOT_MY_VBUCKET, b'{"rev": 9}'))
    assert with_map.kind is OutcomeKind.NOT_MY_VBUCKET
    assert with_map.cluster_config == b'{"rev": 9}'
    assert read_stream_response(_reply(Status.NOT_MY_VBUCKET)).cluster_config is None


@pytest.mark.parametrize(
    ("reason", "action"),
    [
        (StreamEndReason.OK, EndAction.FINAL),
        (StreamEndReason.CLOSED, EndAction.FINAL),
        (StreamEndReason.STATE_CHANGED, EndAction.REFRESH_MAP_AND_REOPEN),
        (StreamEndReason.DISCONNECTED, EndAction.REOPEN),
        (StreamEndReason.TOO_SLOW, EndAction.REOPEN),
        (StreamEndReason.BACKFILL_FAILED, EndAction.REOPEN),
        (StreamEndReason.ROLLBACK, EndAction.REOPEN),
        (StreamEndReason.FILTER_EMPTY, EndAction.FINAL),
        (StreamEndReason.LOST_PRIVILEGES, EndAction.FINAL),
    ],
)
def test_stream_end_actions(reason: StreamEndReason, action: EndAction) -> None:
    assert stream_end_action(reason) is action


def test_backoff_doubles_up_to_its_cap() -> None:
    backoff = Backoff(initial=0.1, maximum=1.0, multiplier=2.0, jitter=False)
    assert [backoff.delay(n) for n in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_backoff_jitter_stays_within_half_to_full_delay() -> None:
    backoff = Backoff(initial=1.0, maximum=8.0)
    rng = random.Random(3)
    for failures in range(1, 8):
        base = min(8.0, 2.0 ** (failures - 1))
        assert base / 2 <= backoff.delay(failures, rng) <= base


def test_backoff_validation() -> None:
    with pytest.raises(ConfigError):
        Backoff(initial=0)
    with pytest.raises(ConfigError):
        Backoff(initial=2.0, maximum=1.0)
    with pytest.raises(ValueError):
        Backoff().delay(0)


def test_stream_life_and_opaque_matching() -> None:
    stream = VbucketStream(
        5, end_seqno=MAX_SEQNO, position=VbucketPosition.beginning(5), failover_log=None
    )
    assert stream.ready_to_send(now=0.0)
    request = plan_stream_request(VbucketPosition.beginning(5), None, opaque=42)
    stream.requested(request, 42, connection_id=1)
    assert stream.state is StreamState.REQUESTED
    assert not stream.accepts(42, 1)  # not open yet
    stream.opened()
    assert stream.accepts(42, 1)
    assert not stream.accepts(41, 1) and not stream.accepts(42, 2)
    assert stream.position is None  # a reopen asks the layer above again
    with pytest.raises(ProtocolError, match="cannot open a stream that is open"):
        stream.opened()
    stream.pending(awaiting_delivery=True)
    assert not stream.ready_to_send(now=10.0)
    stream.awaiting_delivery = False
    assert stream.ready_to_send(now=10.0)
    stream.closed()
    assert not stream.accepts(42, 1)


def test_failed_attempts_back_off_until_the_deadline() -> None:
    stream = VbucketStream(1, end_seqno=MAX_SEQNO, position=None, failover_log=None)
    backoff = Backoff(initial=1.0, maximum=4.0, deadline=10.0, jitter=False)
    assert stream.failed_attempt(100.0, backoff) == 101.0
    assert stream.failed_attempt(101.0, backoff) == 103.0
    stream.pending(not_before=103.0)
    assert not stream.ready_to_send(102.9) and stream.ready_to_send(103.0)
    assert stream.failed_attempt(111.0, backoff) is None  # past the deadline
