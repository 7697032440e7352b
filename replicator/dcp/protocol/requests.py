"""Requests a client (the consumer) sends outside DCP proper: HELLO, SASL, bucket selection,
cluster map, manifest, vbucket seqnos, NOOP. One type per message, its encoder and decoder
side by side.

The DCP_* requests live in `dcp_requests`; `codec.encode_request` / `codec.decode_request`
dispatch over both through the `ENCODERS` and `DECODERS` tables. The consumer encodes these,
the embedded producer decodes them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from replicator.dcp.protocol.frame import Frame
from replicator.dcp.protocol.opcodes import HelloFeature, Opcode, VbucketState
from replicator.dcp.protocol.wire import (
    U32,
    decode_text,
    expect_extras,
    expect_no_body,
    expect_no_key,
    expect_no_value,
    request_frame,
)

_U16 = struct.Struct(">H")
_GET_ALL_VB_SEQNOS_EXTRAS = struct.Struct(">II")


# --- HELLO


@dataclass(frozen=True, slots=True)
class Hello:
    """HELLO 0x1f: agent name as key, requested features as u16 each in the value."""

    agent: str
    features: tuple[int, ...]
    opaque: int = 0


def _encode_hello(r: Hello) -> bytes:
    return request_frame(
        Opcode.HELLO,
        opaque=r.opaque,
        key=r.agent.encode(),
        value=encode_hello_features(r.features),
    )


def _decode_hello(frame: Frame) -> Hello:
    expect_extras(frame, 0)
    return Hello(
        decode_text(frame.key, "agent name"), decode_hello_features(frame.value), frame.opaque
    )


def encode_hello_features(features: Iterable[int]) -> bytes:
    """The value of a HELLO request or reply: u16 per feature."""
    return b"".join(_U16.pack(f) for f in features)


def decode_hello_features(value: bytes) -> tuple[int, ...]:
    """The features of a HELLO value, HelloFeature members where known (ValueError if torn).

    >>> decode_hello_features(bytes.fromhex("0006ffff"))
    (<HelloFeature.XATTR: 6>, 65535)
    """
    if len(value) % 2:
        raise ValueError(f"feature list of {len(value)} bytes is not a whole number of u16")
    return tuple(_feature_code(code) for (code,) in _U16.iter_unpack(value))


def _feature_code(code: int) -> int:
    try:
        return HelloFeature(code)
    except ValueError:
        return code


# --- SASL


@dataclass(frozen=True, slots=True)
class SaslListMechs:
    """SASL_LIST_MECHS 0x20: no body; the reply lists mechanisms separated by spaces."""

    opaque: int = 0


def _encode_sasl_list_mechs(r: SaslListMechs) -> bytes:
    return request_frame(Opcode.SASL_LIST_MECHS, opaque=r.opaque)


def _decode_sasl_list_mechs(frame: Frame) -> SaslListMechs:
    expect_no_body(frame)
    return SaslListMechs(frame.opaque)


@dataclass(frozen=True, slots=True)
class SaslAuth:
    """SASL_AUTH 0x21: mechanism as key, first client message as value (never shown in repr)."""

    mechanism: str
    payload: bytes = field(repr=False)
    opaque: int = 0


def _encode_sasl_auth(r: SaslAuth) -> bytes:
    return request_frame(
        Opcode.SASL_AUTH, opaque=r.opaque, key=r.mechanism.encode(), value=r.payload
    )


def _decode_sasl_auth(frame: Frame) -> SaslAuth:
    expect_extras(frame, 0)
    return SaslAuth(_mechanism(frame), frame.value, frame.opaque)


@dataclass(frozen=True, slots=True)
class SaslStep:
    """SASL_STEP 0x22: mechanism as key, next client message as value (never shown in repr)."""

    mechanism: str
    payload: bytes = field(repr=False)
    opaque: int = 0


def _encode_sasl_step(r: SaslStep) -> bytes:
    return request_frame(
        Opcode.SASL_STEP, opaque=r.opaque, key=r.mechanism.encode(), value=r.payload
    )


def _decode_sasl_step(frame: Frame) -> SaslStep:
    expect_extras(frame, 0)
    return SaslStep(_mechanism(frame), frame.value, frame.opaque)


def _mechanism(frame: Frame) -> str:
    if not frame.key:
        raise ValueError("SASL mechanism (key) is empty")
    return decode_text(frame.key, "SASL mechanism")


# --- bucket, cluster map, manifest


@dataclass(frozen=True, slots=True)
class SelectBucket:
    """SELECT_BUCKET 0x89: bucket name as key."""

    bucket: str
    opaque: int = 0


def _encode_select_bucket(r: SelectBucket) -> bytes:
    return request_frame(Opcode.SELECT_BUCKET, opaque=r.opaque, key=r.bucket.encode())


def _decode_select_bucket(frame: Frame) -> SelectBucket:
    expect_extras(frame, 0)
    expect_no_value(frame)
    if not frame.key:
        raise ValueError("bucket name (key) is empty")
    return SelectBucket(decode_text(frame.key, "bucket name"), frame.opaque)


@dataclass(frozen=True, slots=True)
class GetClusterConfig:
    """GET_CLUSTER_CONFIG 0xb5: the reply's value is the bucket's cluster map JSON."""

    opaque: int = 0


def _encode_get_cluster_config(r: GetClusterConfig) -> bytes:
    return request_frame(Opcode.GET_CLUSTER_CONFIG, opaque=r.opaque)


def _decode_get_cluster_config(frame: Frame) -> GetClusterConfig:
    expect_no_body(frame)
    return GetClusterConfig(frame.opaque)


@dataclass(frozen=True, slots=True)
class GetCollectionsManifest:
    """GET_COLLECTIONS_MANIFEST 0xba: the reply's value is the manifest JSON."""

    opaque: int = 0


def _encode_get_collections_manifest(r: GetCollectionsManifest) -> bytes:
    return request_frame(Opcode.GET_COLLECTIONS_MANIFEST, opaque=r.opaque)


def _decode_get_collections_manifest(frame: Frame) -> GetCollectionsManifest:
    expect_no_body(frame)
    return GetCollectionsManifest(frame.opaque)


# --- GET_ALL_VB_SEQNOS, NOOP


@dataclass(frozen=True, slots=True)
class GetAllVbSeqnos:
    """GET_ALL_VB_SEQNOS 0x48, optionally filtered by vbucket state (and then by collection)."""

    vbucket_state: VbucketState | None = None
    collection_id: int | None = None
    opaque: int = 0

    def __post_init__(self) -> None:
        if self.collection_id is not None and self.vbucket_state is None:
            raise ValueError("a collection filter needs a vbucket state (ALIVE for all)")


def _encode_get_all_vb_seqnos(r: GetAllVbSeqnos) -> bytes:
    if r.vbucket_state is None:
        extras = b""
    elif r.collection_id is None:
        extras = U32.pack(r.vbucket_state)
    else:
        extras = _GET_ALL_VB_SEQNOS_EXTRAS.pack(r.vbucket_state, r.collection_id)
    return request_frame(Opcode.GET_ALL_VB_SEQNOS, opaque=r.opaque, extras=extras)


def _decode_get_all_vb_seqnos(frame: Frame) -> GetAllVbSeqnos:
    expect_no_key(frame)
    expect_no_value(frame)
    size = len(frame.extras)
    if size == 0:
        return GetAllVbSeqnos(opaque=frame.opaque)
    if size == 4:
        return GetAllVbSeqnos(VbucketState(U32.unpack(frame.extras)[0]), None, frame.opaque)
    if size == 8:
        state, collection_id = _GET_ALL_VB_SEQNOS_EXTRAS.unpack(frame.extras)
        return GetAllVbSeqnos(VbucketState(state), collection_id, frame.opaque)
    raise ValueError(f"extras of {size} bytes, expected 0, 4 or 8")


@dataclass(frozen=True, slots=True)
class Noop:
    """NOOP 0x0a: a client's keep-alive when no stream is open."""

    opaque: int = 0


def _encode_noop(r: Noop) -> bytes:
    return request_frame(Opcode.NOOP, opaque=r.opaque)


def _decode_noop(frame: Frame) -> Noop:
    expect_no_body(frame)
    return Noop(frame.opaque)


KvRequest = (
    Hello
    | SaslListMechs
    | SaslAuth
    | SaslStep
    | SelectBucket
    | GetClusterConfig
    | GetCollectionsManifest
    | GetAllVbSeqnos
    | Noop
)
"""The client requests outside DCP proper: memcached (KV) commands."""

ENCODERS: dict[type, Callable[[Any], bytes]] = {
    Hello: _encode_hello,
    SaslListMechs: _encode_sasl_list_mechs,
    SaslAuth: _encode_sasl_auth,
    SaslStep: _encode_sasl_step,
    SelectBucket: _encode_select_bucket,
    GetClusterConfig: _encode_get_cluster_config,
    GetCollectionsManifest: _encode_get_collections_manifest,
    GetAllVbSeqnos: _encode_get_all_vb_seqnos,
    Noop: _encode_noop,
}
"""Encoder by request type, for `codec.encode_request`."""

DECODERS: dict[int, Callable[[Frame], KvRequest]] = {
    Opcode.HELLO: _decode_hello,
    Opcode.SASL_LIST_MECHS: _decode_sasl_list_mechs,
    Opcode.SASL_AUTH: _decode_sasl_auth,
    Opcode.SASL_STEP: _decode_sasl_step,
    Opcode.SELECT_BUCKET: _decode_select_bucket,
    Opcode.GET_CLUSTER_CONFIG: _decode_get_cluster_config,
    Opcode.GET_COLLECTIONS_MANIFEST: _decode_get_collections_manifest,
    Opcode.GET_ALL_VB_SEQNOS: _decode_get_all_vb_seqnos,
    Opcode.NOOP: _decode_noop,
}
"""Decoder by opcode, for `codec.decode_request`."""
