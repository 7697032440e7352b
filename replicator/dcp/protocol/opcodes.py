"""The numbers of the memcached binary protocol and DCP, each table an explicit enum.

Values come from kv_engine's BinaryProtocol.md, status.h and feature.h and the DCP command pages;
see spec/NOTES.md where the docs' drawings disagree with real frames.
"""

from __future__ import annotations

import enum


class Magic(enum.IntEnum):
    """First header byte: direction of the message and whether flexible framing is used."""

    REQUEST = 0x80
    RESPONSE = 0x81
    FLEX_REQUEST = 0x08
    """A request whose byte 2 is the framing-extras length and byte 3 the key length."""
    FLEX_RESPONSE = 0x18
    SERVER_REQUEST = 0x82
    """Server-initiated request (duplex), e.g. a cluster-map change notification."""
    SERVER_RESPONSE = 0x83


class Opcode(enum.IntEnum):
    """Opcodes of client-initiated messages (magic 0x80/0x81/0x08/0x18) used by a DCP client.

    The DCP producer's messages to the consumer are requests too, so they live here.
    """

    NOOP = 0x0A
    HELLO = 0x1F
    SASL_LIST_MECHS = 0x20
    SASL_AUTH = 0x21
    SASL_STEP = 0x22
    GET_ALL_VB_SEQNOS = 0x48
    DCP_OPEN = 0x50
    DCP_ADD_STREAM = 0x51
    DCP_CLOSE_STREAM = 0x52
    DCP_STREAM_REQ = 0x53
    DCP_GET_FAILOVER_LOG = 0x54
    DCP_STREAM_END = 0x55
    DCP_SNAPSHOT_MARKER = 0x56
    DCP_MUTATION = 0x57
    DCP_DELETION = 0x58
    DCP_EXPIRATION = 0x59
    DCP_FLUSH = 0x5A
    DCP_SET_VBUCKET_STATE = 0x5B
    DCP_NOOP = 0x5C
    DCP_BUFFER_ACK = 0x5D
    DCP_CONTROL = 0x5E
    DCP_SYSTEM_EVENT = 0x5F
    DCP_PREPARE = 0x60
    DCP_SEQNO_ACKNOWLEDGED = 0x61
    DCP_COMMIT = 0x62
    DCP_ABORT = 0x63
    DCP_SEQNO_ADVANCED = 0x64
    DCP_OSO_SNAPSHOT = 0x65
    SELECT_BUCKET = 0x89
    GET_CLUSTER_CONFIG = 0xB5
    GET_COLLECTIONS_MANIFEST = 0xBA
    GET_ERROR_MAP = 0xFE


class ServerOpcode(enum.IntEnum):
    """Opcodes of server-initiated messages (magic 0x82/0x83)."""

    CLUSTERMAP_CHANGE_NOTIFICATION = 0x01
    AUTHENTICATE = 0x02
    ACTIVE_EXTERNAL_USERS = 0x03


class Status(enum.IntEnum):
    """Response status codes (kv_engine status.h). A client must tolerate codes not listed."""

    SUCCESS = 0x00
    KEY_ENOENT = 0x01
    KEY_EEXISTS = 0x02
    """Also: a stream already exists for the vbucket (stream request)."""
    E2BIG = 0x03
    EINVAL = 0x04
    NOT_STORED = 0x05
    DELTA_BADVAL = 0x06
    NOT_MY_VBUCKET = 0x07
    NO_BUCKET = 0x08
    LOCKED = 0x09
    DCP_STREAM_NOT_FOUND = 0x0A
    OPAQUE_NO_MATCH = 0x0B
    AUTH_STALE = 0x1F
    AUTH_ERROR = 0x20
    AUTH_CONTINUE = 0x21
    ERANGE = 0x22
    ROLLBACK = 0x23
    EACCESS = 0x24
    NOT_INITIALIZED = 0x25
    UNKNOWN_FRAME_INFO = 0x80
    UNKNOWN_COMMAND = 0x81
    ENOMEM = 0x82
    NOT_SUPPORTED = 0x83
    EINTERNAL = 0x84
    EBUSY = 0x85
    ETMPFAIL = 0x86
    XATTR_EINVAL = 0x87
    UNKNOWN_COLLECTION = 0x88
    NO_COLLECTIONS_MANIFEST = 0x89
    CANNOT_APPLY_COLLECTIONS_MANIFEST = 0x8A
    COLLECTIONS_MANIFEST_IS_AHEAD = 0x8B
    UNKNOWN_SCOPE = 0x8C
    DCP_STREAM_ID_INVALID = 0x8D


class HelloFeature(enum.IntEnum):
    """HELLO feature codes (kv_engine feature.h), sent as u16 each in the HELLO value."""

    TLS = 0x02
    TCP_NODELAY = 0x03
    MUTATION_SEQNO = 0x04
    TCP_DELAY = 0x05
    XATTR = 0x06
    XERROR = 0x07
    SELECT_BUCKET = 0x08
    SNAPPY = 0x0A
    JSON = 0x0B
    DUPLEX = 0x0C
    CLUSTERMAP_CHANGE_NOTIFICATION = 0x0D
    UNORDERED_EXECUTION = 0x0E
    TRACING = 0x0F
    ALT_REQUEST_SUPPORT = 0x10
    SYNC_REPLICATION = 0x11
    COLLECTIONS = 0x12
    SNAPPY_EVERYWHERE = 0x13
    PRESERVE_TTL = 0x14
    VATTR = 0x15
    PITR = 0x16
    SUBDOC_CREATE_AS_DELETED = 0x17
    SUBDOC_DOCUMENT_MACRO_SUPPORT = 0x18
    SUBDOC_REPLACE_BODY_WITH_XATTR = 0x19
    REPORT_UNIT_USAGE = 0x1A
    NON_BLOCKING_THROTTLING_MODE = 0x1B
    SUBDOC_REPLICA_READ = 0x1C
    GET_CLUSTER_CONFIG_WITH_KNOWN_VERSION = 0x1D
    DEDUPE_NOT_MY_VBUCKET_CLUSTERMAP = 0x1E
    CLUSTERMAP_CHANGE_NOTIFICATION_BRIEF = 0x1F
    SUBDOC_ALLOWS_ACCESS_ON_MULTIPLE_XATTR_KEYS = 0x20
    SUBDOC_BINARY_XATTR = 0x21


class Datatype(enum.IntFlag):
    """Datatype bits of a value. SNAPPY covers the whole value, xattr section included."""

    RAW = 0x00
    JSON = 0x01
    SNAPPY = 0x02
    XATTR = 0x04


KNOWN_DATATYPE_BITS = Datatype.JSON | Datatype.SNAPPY | Datatype.XATTR
"""Any other datatype bit in a frame is a protocol error."""


class DcpOpenFlags(enum.IntFlag):
    """DCP_OPEN flags (extras u32 after a reserved u32)."""

    NONE = 0x00
    PRODUCER = 0x01
    INCLUDE_XATTRS = 0x04
    NO_VALUE = 0x08
    INCLUDE_DELETE_TIMES = 0x20
    """Deletions come as v2 (21-byte extras with delete_time); needed for the expiry opcode."""
    NO_VALUE_WITH_UNDERLYING_DATATYPE = 0x40
    INCLUDE_DELETED_USER_XATTRS = 0x100
    SKIP_DELETES_IN_INITIAL_BACKFILL = 0x200


class StreamRequestFlags(enum.IntFlag):
    """STREAM_REQ flags (same bits as ADD_STREAM)."""

    NONE = 0x00
    TAKEOVER = 0x01
    DISK_ONLY = 0x02
    TO_LATEST = 0x04
    NO_VALUE = 0x08
    ACTIVE_VB_ONLY = 0x10
    STRICT_VBUUID = 0x20
    FROM_LATEST = 0x40
    IGNORE_PURGED_TOMBSTONES = 0x80
    """Never set by a mirror: it trades rollbacks for missed deletes (spec/NOTES.md section 4)."""
    CACHE_TRANSFER = 0x100


class VbucketState(enum.IntEnum):
    """Vbucket states, as in SET_VBUCKET_STATE and the GET_ALL_VB_SEQNOS filter (0: alive)."""

    ALIVE = 0x00
    """Only as a GET_ALL_VB_SEQNOS filter: active, replica and pending."""
    ACTIVE = 0x01
    REPLICA = 0x02
    PENDING = 0x03
    DEAD = 0x04


class FrameInfoId(enum.IntEnum):
    """Identifiers of flexible-framing request entries this codec reads or writes."""

    BARRIER = 0x00
    DURABILITY_REQUIREMENT = 0x01
    DCP_STREAM_ID = 0x02
