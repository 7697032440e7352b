"""The error map a simulated node returns to GET_ERROR_MAP (0xfe).

Clients such as gocbcore fetch it during bootstrap and use the attributes to decide what to
do with a status they do not know. The map is version 1 (the format every client reads): keys
are status codes in hex without 0x, each with a name, a description and attributes.
"""

from __future__ import annotations

import json

from replicator.dcp.protocol.opcodes import Status

ERROR_MAP_VERSION = 1
ERROR_MAP_REVISION = 1

_ENTRIES: dict[Status, tuple[str, tuple[str, ...]]] = {
    Status.SUCCESS: ("Success", ("success",)),
    Status.KEY_ENOENT: ("Not Found", ("item-only",)),
    Status.KEY_EEXISTS: ("key already exists, or CAS mismatch", ("item-only",)),
    Status.E2BIG: ("Value is too big", ("item-only", "invalid-input")),
    Status.EINVAL: ("Invalid packet", ("internal", "invalid-input")),
    Status.NOT_MY_VBUCKET: (
        "Server is not responsible for this command",
        ("fetch-config", "invalid-input"),
    ),
    Status.NO_BUCKET: ("Not connected to a bucket", ("conn-state-invalidated",)),
    Status.DCP_STREAM_NOT_FOUND: ("No DCP stream for this vbucket", ("dcp",)),
    Status.OPAQUE_NO_MATCH: ("Opaque does not match a DCP stream", ("dcp",)),
    Status.AUTH_STALE: ("Reauthenticate", ("conn-state-invalidated", "auth")),
    Status.AUTH_ERROR: ("Authentication failed", ("conn-state-invalidated", "auth")),
    Status.AUTH_CONTINUE: ("Continue authentication", ("special-handling", "auth")),
    Status.ERANGE: ("Range error", ("invalid-input",)),
    Status.ROLLBACK: ("Rollback required", ("dcp", "special-handling")),
    Status.EACCESS: ("No access", ("support", "conn-state-invalidated")),
    Status.NOT_INITIALIZED: ("Node not initialized", ("temp", "retry-later")),
    Status.UNKNOWN_FRAME_INFO: ("Unknown frame info", ("support", "invalid-input")),
    Status.UNKNOWN_COMMAND: ("Unknown command", ("support", "invalid-input")),
    Status.ENOMEM: ("Out of memory", ("temp", "retry-later")),
    Status.NOT_SUPPORTED: ("Not supported", ("support",)),
    Status.EINTERNAL: ("Internal error", ("internal",)),
    Status.EBUSY: ("System is busy", ("temp", "retry-later")),
    Status.ETMPFAIL: ("Temporary failure", ("temp", "retry-later")),
    Status.UNKNOWN_COLLECTION: ("Unknown collection", ("fetch-config",)),
    Status.NO_COLLECTIONS_MANIFEST: ("No collections manifest", ("invalid-input",)),
    Status.UNKNOWN_SCOPE: ("Unknown scope", ("fetch-config",)),
    Status.DCP_STREAM_ID_INVALID: ("Invalid DCP stream id", ("dcp", "invalid-input")),
}


def error_map_json(requested_version: int) -> bytes:
    """The error map in the highest format <= `requested_version` this node knows (1).

    Raises ValueError for version 0, which no client may ask for.
    """
    if requested_version < 1:
        raise ValueError(f"error map version {requested_version} does not exist")
    errors = {
        f"{int(status):x}": {"name": status.name, "desc": desc, "attrs": list(attrs)}
        for status, (desc, attrs) in _ENTRIES.items()
    }
    document = {
        "version": ERROR_MAP_VERSION,
        "revision": ERROR_MAP_REVISION,
        "errors": errors,
    }
    return json.dumps(document, separators=(",", ":")).encode()
