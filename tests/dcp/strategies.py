"""Hypothesis strategies for every wire message, shared by the round-trip and fuzz tests."""

from __future__ import annotations

from hypothesis import strategies as st

from replicator.dcp.protocol.codec import ClientRequest, ProducerMessage
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures, DcpNoop, SetVbucketState
from replicator.dcp.protocol.dcp_requests import (
    BufferAck,
    CloseStream,
    DcpControl,
    DcpOpen,
    GetFailoverLog,
    StreamRequest,
)
from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    OsoFlags,
    OsoSnapshot,
    SeqnoAdvanced,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
    SystemEvent,
    SystemEventType,
)
from replicator.dcp.protocol.opcodes import DcpOpenFlags, StreamRequestFlags, VbucketState
from replicator.dcp.protocol.pushes import ClustermapChangeNotification
from replicator.dcp.protocol.requests import (
    GetAllVbSeqnos,
    GetClusterConfig,
    GetCollectionsManifest,
    Hello,
    Noop,
    SaslAuth,
    SaslListMechs,
    SaslStep,
    SelectBucket,
)
from replicator.dcp.protocol.responses import Response

u8 = st.integers(0, 0xFF)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 0xFFFFFFFFFFFFFFFF)
vbuckets = st.integers(0, 1023)
opaques = u32
stream_ids = st.none() | u16
text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=20)
nonempty_text = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=20)
xattr_text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]))
xattrs = st.lists(st.tuples(xattr_text.filter(bool), xattr_text), max_size=3).map(tuple)
document_keys = st.binary(min_size=1, max_size=64)
features = st.builds(ConnectionFeatures, collections=st.booleans(), delete_times=st.booleans())


# --- client requests -------------------------------------------------------------------------

client_requests: st.SearchStrategy[ClientRequest] = st.one_of(
    st.builds(Hello, text, st.lists(u16, max_size=10).map(tuple), opaques),
    st.builds(SaslListMechs, opaques),
    st.builds(SaslAuth, nonempty_text, st.binary(max_size=64), opaques),
    st.builds(SaslStep, nonempty_text, st.binary(max_size=64), opaques),
    st.builds(SelectBucket, nonempty_text, opaques),
    st.builds(GetClusterConfig, opaques),
    st.builds(GetCollectionsManifest, opaques),
    st.builds(DcpOpen, nonempty_text, u32.map(DcpOpenFlags), opaques),
    st.builds(DcpControl, nonempty_text, text, opaques),
    st.builds(
        StreamRequest,
        vbucket=vbuckets,
        start_seqno=u64,
        end_seqno=u64,
        vbucket_uuid=u64,
        snapshot_start=u64,
        snapshot_end=u64,
        flags=u32.map(StreamRequestFlags),
        purge_seqno=st.none() | u64,
        stream_id=st.none() | st.integers(1, 0xFFFF),
        opaque=opaques,
    ),
    st.builds(CloseStream, vbuckets, stream_ids, opaques),
    st.builds(GetFailoverLog, vbuckets, opaques),
    st.builds(GetAllVbSeqnos, opaque=opaques),
    st.builds(GetAllVbSeqnos, st.sampled_from(VbucketState), st.none() | u32, opaques),
    st.builds(BufferAck, u32, opaques),
    st.builds(Noop, opaques),
)


# --- responses and server pushes -------------------------------------------------------------

responses = st.builds(
    Response,
    opcode=u8,
    status=u16,
    opaque=opaques,
    value=st.binary(max_size=64),
    extras=st.binary(max_size=32),
    key=st.binary(max_size=32),
    cas=u64,
    datatype=st.integers(0, 7),
    framing_extras=st.sampled_from([b"", b"\x02\x00\x10", b"\x12\x00\x01"]),
)

clustermap_notifications = st.one_of(
    st.builds(ClustermapChangeNotification, text, u32, st.none(), st.binary(max_size=64)),
    st.builds(
        ClustermapChangeNotification,
        text,
        st.integers(0, 2**63 - 1),
        st.integers(-(2**63), 2**63 - 1),
        st.binary(max_size=64),
    ),
)


# --- producer messages (they depend on the connection's features) ----------------------------


def _collection_ids(negotiated: ConnectionFeatures) -> st.SearchStrategy[int]:
    return u32 if negotiated.collections else st.just(0)


def _markers() -> st.SearchStrategy[SnapshotMarker]:
    flags = u32.map(SnapshotFlags)
    v1 = st.builds(SnapshotMarker, vbuckets, u64, u64, flags, stream_id=stream_ids)
    v20 = st.builds(
        SnapshotMarker,
        vbuckets,
        u64,
        u64,
        flags,
        max_visible_seqno=u64,
        high_completed_seqno=u64,
        stream_id=stream_ids,
    )
    v22 = st.builds(
        SnapshotMarker,
        vbuckets,
        u64,
        u64,
        flags,
        max_visible_seqno=u64,
        high_completed_seqno=u64,
        purge_seqno=u64,
        high_prepared_seqno=u64,
        stream_id=stream_ids,
    )
    return st.one_of(v1, v20, v22)


def _system_events() -> st.SearchStrategy[SystemEvent]:
    collection_events = st.sampled_from(
        [
            SystemEventType.COLLECTION_CREATED,
            SystemEventType.COLLECTION_DROPPED,
            SystemEventType.COLLECTION_FLUSHED,
            SystemEventType.COLLECTION_CHANGED,
        ]
    )
    scope_events = st.sampled_from([SystemEventType.SCOPE_CREATED, SystemEventType.SCOPE_DROPPED])
    common = {
        "vbucket": vbuckets,
        "by_seqno": u64,
        "version": st.integers(0, 1),
        "name": text,
        "manifest_uid": u64,
        "scope_id": u32,
        "stream_id": stream_ids,
    }
    return st.one_of(
        st.builds(SystemEvent, event=collection_events, collection_id=u32, **common),
        st.builds(SystemEvent, event=scope_events, collection_id=st.none(), **common),
    )


def producer_messages(negotiated: ConnectionFeatures) -> st.SearchStrategy[ProducerMessage]:
    """Every producer message, valid for a connection with `negotiated` features."""
    collection_ids = _collection_ids(negotiated)
    delete_times = u32 if negotiated.delete_times else st.just(0)
    return st.one_of(
        _markers(),
        st.builds(
            Mutation,
            vbucket=vbuckets,
            by_seqno=u64,
            rev_seqno=u64,
            cas=u64,
            flags=u32,
            expiration=u32,
            lock_time=u32,
            collection_id=collection_ids,
            key=document_keys,
            value=st.binary(max_size=256),
            is_json=st.booleans(),
            xattrs=xattrs,
            stream_id=stream_ids,
        ),
        st.builds(
            Deletion,
            vbucket=vbuckets,
            by_seqno=u64,
            rev_seqno=u64,
            cas=u64,
            collection_id=collection_ids,
            key=document_keys,
            delete_time=delete_times,
            xattrs=xattrs,
            stream_id=stream_ids,
        ),
        st.builds(
            Expiration,
            vbucket=vbuckets,
            by_seqno=u64,
            rev_seqno=u64,
            cas=u64,
            collection_id=collection_ids,
            key=document_keys,
            delete_time=u32,
            stream_id=stream_ids,
        ),
        _system_events(),
        st.builds(SeqnoAdvanced, vbuckets, u64, stream_ids),
        st.builds(OsoSnapshot, vbuckets, st.sampled_from(list(OsoFlags)), stream_ids),
        st.builds(StreamEnd, vbuckets, st.sampled_from(StreamEndReason), stream_ids),
        st.builds(DcpNoop, opaques),
        st.builds(
            SetVbucketState,
            vbuckets,
            st.sampled_from([s for s in VbucketState if s != VbucketState.ALIVE]),
            opaques,
        ),
    )
