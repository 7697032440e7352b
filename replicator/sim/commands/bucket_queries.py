"""What a connection with a bucket selected may ask of it: the cluster map, the collections
manifest, high seqnos (GET_ALL_VB_SEQNOS, OBSERVE_SEQNO) and failover logs."""

from __future__ import annotations

import struct

from replicator.dcp.protocol.codec import decode_request
from replicator.dcp.protocol.dcp_requests import GetFailoverLog
from replicator.dcp.protocol.events import SystemEvent
from replicator.dcp.protocol.frame import Frame
from replicator.dcp.protocol.opcodes import HelloFeature, Status, VbucketState
from replicator.dcp.protocol.requests import GetAllVbSeqnos
from replicator.dcp.protocol.responses import (
    VbucketSeqno,
    encode_failover_log,
    encode_vbucket_seqnos,
)
from replicator.sim.bucket import SimBucket
from replicator.sim.commands.state import ConnectionState

OBSERVE_SEQNO_OPCODE = 0x91

_U64 = struct.Struct(">Q")
_EPOCH_REVISION = struct.Struct(">qq")
_OBSERVE_SEQNO_V0 = struct.Struct(">BHQQQ")
_OBSERVE_SEQNO_V1 = struct.Struct(">BHQQQQQ")


class BucketQueries(ConnectionState):
    """Answers about the selected bucket and the cluster; none changes the DCP state."""

    def _on_cluster_config(self, frame: Frame) -> None:
        if not self._need_bucket(frame):
            return
        if frame.key or frame.value or len(frame.extras) not in (0, _EPOCH_REVISION.size):
            self._respond(frame, Status.EINVAL, context="Expected no key or value")
            return
        epoch, revision = self._cluster.config_revision()
        self.config_sent(epoch, revision)
        if frame.extras:
            known = _EPOCH_REVISION.unpack(frame.extras)
            if known >= (epoch, revision):
                self.config_sent(*known)
                self._respond(frame)  # the client already has this map
                return
        self._respond(
            frame,
            value=self._cluster.config_json(self._node),
            datatype=self._json_datatype(),
        )

    def _on_collections_manifest(self, frame: Frame) -> None:
        if not self._need_bucket(frame):
            return
        self._respond(
            frame,
            value=self._cluster.bucket.manifest_json().encode(),
            datatype=self._json_datatype(),
        )

    def _on_all_vb_seqnos(self, frame: Frame) -> None:
        if not self._need_bucket(frame):
            return
        request = decode_request(frame)
        assert isinstance(request, GetAllVbSeqnos)
        state = request.vbucket_state
        if request.collection_id is not None and HelloFeature.COLLECTIONS not in self.features:
            self._respond(frame, Status.EINVAL, context="A collection filter needs collections")
            return
        # Every vbucket of this node is active; it has no replicas, pending or dead ones.
        wanted = state is None or state in (VbucketState.ALIVE, VbucketState.ACTIVE)
        vbuckets = self._cluster.node_vbuckets(self._node) if wanted else ()
        bucket = self._cluster.bucket
        records = []
        with bucket.condition:
            for vb in vbuckets:
                vbucket = bucket.vbucket(vb)
                if request.collection_id is None:
                    seqno = vbucket.high_seqno
                else:
                    seqno = _collection_high_seqno(bucket, vb, request.collection_id)
                records.append(VbucketSeqno(vb, seqno))
        self._respond(frame, value=encode_vbucket_seqnos(records))

    def _on_failover_log(self, frame: Frame) -> None:
        if not self._need_bucket(frame):
            return
        request = decode_request(frame)
        assert isinstance(request, GetFailoverLog)
        if not self._owns(request.vbucket):
            self._not_my_vbucket(frame)
            return
        log_value = encode_failover_log(self._cluster.bucket.failover_log(request.vbucket))
        self._respond(frame, value=log_value)

    def _on_observe_seqno(self, frame: Frame) -> None:
        if not self._need_bucket(frame):
            return
        vb = frame.vbucket
        if len(frame.value) != 8:
            self._respond(frame, Status.EINVAL, context="Expected an 8-byte vbucket uuid")
            return
        if not self._owns(vb):
            self._not_my_vbucket(frame)
            return
        (uuid,) = _U64.unpack(frame.value)
        bucket = self._cluster.bucket
        with bucket.condition:
            vbucket = bucket.vbucket(vb)
            high = vbucket.high_seqno
            entries = vbucket.failover_log().entries
        current = entries[0].vbucket_uuid
        older = [i for i, entry in enumerate(entries) if entry.vbucket_uuid == uuid and i > 0]
        if older:
            # The client's uuid is from before a failover: say where its branch ended.
            branch_end = entries[older[0] - 1].seqno
            value = _OBSERVE_SEQNO_V1.pack(1, vb, current, high, high, uuid, branch_end)
        else:
            value = _OBSERVE_SEQNO_V0.pack(0, vb, current, high, high)
        self._respond(frame, value=value)


def _collection_high_seqno(bucket: SimBucket, vbucket: int, collection_id: int) -> int:
    """The highest seqno of an item of `collection_id` in a vbucket (0 if none): a scan."""
    vb = bucket.vbucket(vbucket)
    for seqno in range(vb.high_seqno, 0, -1):
        item = vb.item_at(seqno)
        if isinstance(item, SystemEvent):
            if item.collection_id == collection_id:
                return seqno
        elif item.collection_id == collection_id:
            return seqno
    return 0
