"""Where the real frames from a real server live (shared/vectors), and how to read them.

Tests that use them skip, naming the path, when shared/ does not sit beside the repository.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from replicator.dcp.protocol.frame import encode_frame
from replicator.dcp.protocol.opcodes import Magic

VECTORS = Path(__file__).resolve().parents[1].parent / "shared" / "vectors"
GOMEMCACHED = VECTORS / "gomemcached"

requires_vectors = pytest.mark.skipif(not VECTORS.is_dir(), reason=f"no vectors at {VECTORS}")


def gomemcached_event_wire(name: str) -> bytes:
    """A classic frame's bytes, rebuilt from gomemcached's JSON dump (base64 Extras, Key, Body)."""
    event = json.loads((GOMEMCACHED / name).read_text())
    return encode_frame(
        Magic.REQUEST,
        event["Opcode"],
        datatype=event["DataType"],
        vbucket_or_status=event["VBucket"],
        opaque=event["Opaque"],
        cas=event["Cas"],
        extras=base64.b64decode(event["Extras"]),
        key=base64.b64decode(event["Key"]),
        value=base64.b64decode(event["Body"]),
    )
