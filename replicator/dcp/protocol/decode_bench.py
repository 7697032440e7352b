"""Decode throughput of the wire codec: mutations through FrameReader + decode_dcp_message.

Run `python -m replicator.dcp.protocol.decode_bench` for a number; not a test (machines differ).
"""

from __future__ import annotations

import time

from replicator.dcp.protocol.codec import decode_dcp_message, encode_dcp_message
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures
from replicator.dcp.protocol.events import Mutation
from replicator.dcp.protocol.frame import FrameReader

READ_SIZE = 64 * 1024
"""Bytes per simulated socket read."""


def _mutation_stream(n_messages: int, value_size: int, features: ConnectionFeatures) -> bytes:
    body = (b'{"k":"' + b"x" * max(value_size - 8, 0) + b'"}')[:value_size]
    return b"".join(
        encode_dcp_message(
            Mutation(
                vbucket=seqno % 1024,
                by_seqno=seqno,
                rev_seqno=1,
                cas=0x15C7C2B955AB0000 + seqno,
                flags=0,
                expiration=0,
                lock_time=0,
                collection_id=8,
                key=b"document-%08d" % seqno,
                value=body,
                is_json=True,
            ),
            opaque=0x1000 + seqno % 1024,
            features=features,
        )
        for seqno in range(1, n_messages + 1)
    )


def measure_decode_rate(n_messages: int, value_size: int) -> float:
    """Messages per second decoding `n_messages` mutations of `value_size`-byte values.

    The stream is encoded beforehand (collections on, classic framing) and fed to a
    FrameReader in 64 KiB reads, each frame decoded into a `Mutation`. Time is this process's
    CPU time, so other load on a shared machine does not count against the codec.
    """
    if n_messages <= 0:
        raise ValueError("n_messages must be positive")
    features = ConnectionFeatures(collections=True)
    stream = _mutation_stream(n_messages, value_size, features)
    reads = [stream[i : i + READ_SIZE] for i in range(0, len(stream), READ_SIZE)]
    reader = FrameReader()
    decoded = 0
    started = time.process_time()
    for chunk in reads:
        for frame in reader.feed(chunk):
            decode_dcp_message(frame, features)
            decoded += 1
    elapsed = time.process_time() - started
    if decoded != n_messages:
        raise RuntimeError(f"decoded {decoded} of {n_messages} messages")
    return n_messages / elapsed


if __name__ == "__main__":
    rate = measure_decode_rate(200_000, 1024)
    print(f"{rate:,.0f} mutations/s (1 KiB values)")
