"""How fast the simulated producer serves: a backfill drained by a raw counting client.

Not a test: run `python -m replicator.sim.serve_bench` (or call `measure_serve_rate`) and read
the numbers. The client only walks frame headers (no decoding), acks flow control at 20% of
its window, and stops when every stream has ended, so the figure is the server's rate. By
default server and client share this process (and its GIL), as in the project's tests and
demo; `separate_process` runs the server as `python -m replicator.sim`, as an operator would.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from replicator.dcp.protocol.codec import ClientRequest, encode_request
from replicator.dcp.protocol.dcp_requests import BufferAck, DcpControl, DcpOpen, StreamRequest
from replicator.dcp.protocol.opcodes import DcpOpenFlags, HelloFeature, Opcode, Status
from replicator.dcp.protocol.requests import GetAllVbSeqnos, Hello, SaslAuth, SelectBucket
from replicator.sim.bucket import SimBucket
from replicator.sim.cli import PASSWORD_ENV
from replicator.sim.cluster import DEFAULT_PASSWORD, DEFAULT_USERNAME, SimCluster
from replicator.sim.workload import initial_load

_HEADER = struct.Struct(">BBHBBHII")
_STREAM_END = int(Opcode.DCP_STREAM_END)
_DCP_NOOP = int(Opcode.DCP_NOOP)
_RESPONSE = 0x81
_VBUCKET_SEQNO = struct.Struct(">HQ")


@dataclass(frozen=True, slots=True)
class ServeRate:
    """What a counting client received: DCP messages, their bytes, and how long it took."""

    messages: int
    bytes: int
    seconds: float

    @property
    def messages_per_second(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def megabytes_per_second(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds else 0.0


def measure_serve_rate(
    docs: int = 100_000,
    doc_size: int = 1024,
    *,
    vbuckets: int = 64,
    snappy: bool = False,
    window: int = 20 * 1024 * 1024,
    seed: int = 0,
    separate_process: bool = False,
) -> ServeRate:
    """Load `docs` documents, then time a counting client draining every vbucket's backfill."""
    if separate_process:
        with _simulator_process(docs, doc_size, vbuckets, seed) as port:
            return _drain(port, vbuckets, snappy=snappy, window=window)
    bucket = SimBucket("bench", vbuckets, seed=seed)
    initial_load(bucket, docs, doc_size, seed=seed)
    with SimCluster(bucket, nodes=1) as cluster:
        return _drain(cluster.node(0).port, vbuckets, snappy=snappy, window=window)


@contextmanager
def _simulator_process(docs: int, doc_size: int, vbuckets: int, seed: int) -> Iterator[int]:
    command = [
        sys.executable,
        "-m",
        "replicator.sim",
        "--port",
        "0",
        "--bucket",
        "bench",
        "--docs",
        str(docs),
        "--doc-size",
        str(doc_size),
        "--vbuckets",
        str(vbuckets),
        "--seed",
        str(seed),
    ]
    env = {**os.environ, PASSWORD_ENV: DEFAULT_PASSWORD}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if not line:
            raise RuntimeError("the simulator exited before printing its connection string")
        yield int(line.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    finally:
        process.terminate()
        process.wait(30)


def _drain(port: int, vbuckets: int, *, snappy: bool, window: int) -> ServeRate:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    try:
        _handshake(sock, snappy=snappy, window=window)
        highs = _high_seqnos(sock)
        started = time.perf_counter()
        for vb in range(vbuckets):
            request = StreamRequest(vb, 0, highs[vb], 0, 0, 0, opaque=1000 + vb)
            sock.sendall(encode_request(request))
        messages, received = _count_until_ended(sock, vbuckets, window)
        elapsed = time.perf_counter() - started
    finally:
        sock.close()
    return ServeRate(messages, received, elapsed)


def _high_seqnos(sock: socket.socket) -> dict[int, int]:
    sock.sendall(encode_request(GetAllVbSeqnos(opaque=6)))
    header = _recv_exactly(sock, 24)
    body = _recv_exactly(sock, _HEADER.unpack_from(header)[6])
    return {vb: seqno for vb, seqno in _VBUCKET_SEQNO.iter_unpack(body)}


def _handshake(sock: socket.socket, *, snappy: bool, window: int) -> None:
    features = [
        HelloFeature.XERROR,
        HelloFeature.SELECT_BUCKET,
        HelloFeature.JSON,
        HelloFeature.XATTR,
        HelloFeature.COLLECTIONS,
    ]
    if snappy:
        features.append(HelloFeature.SNAPPY)
    credentials = b"\x00" + DEFAULT_USERNAME.encode() + b"\x00" + DEFAULT_PASSWORD.encode()
    flags = DcpOpenFlags.PRODUCER | DcpOpenFlags.INCLUDE_XATTRS | DcpOpenFlags.INCLUDE_DELETE_TIMES
    requests: list[ClientRequest] = [
        Hello("serve-bench", tuple(features), 1),
        SaslAuth("PLAIN", credentials, 2),
        SelectBucket("bench", 3),
        DcpOpen("bench:counter", flags, 4),
        DcpControl("connection_buffer_size", str(window), 5),
    ]
    for request in requests:
        sock.sendall(encode_request(request))
        header = _recv_exactly(sock, 24)
        _magic, _opcode, _key, _extras, _type, status, body, _opaque = _HEADER.unpack_from(header)
        _recv_exactly(sock, body)
        if status != Status.SUCCESS:
            raise RuntimeError(f"{type(request).__name__} failed with status 0x{status:02x}")


def _count_until_ended(sock: socket.socket, streams: int, window: int) -> tuple[int, int]:
    ack_every = max(1, window // 5)
    ended = messages = received = unacked = 0
    buffer = b""
    unpack = _HEADER.unpack_from
    while ended < streams:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("the server closed the connection mid-benchmark")
        buffer = buffer + chunk if buffer else chunk
        position, end = 0, len(buffer)
        while end - position >= 24:
            magic, opcode, _key, _extras, _type, _vb, body, _opaque = unpack(buffer, position)
            size = 24 + body
            if end - position < size:
                break
            position += size
            if magic == _RESPONSE:
                continue  # the stream requests' replies
            if opcode == _DCP_NOOP:
                continue  # not counted by flow control, answered by nobody here
            messages += 1
            received += size
            unacked += size
            if opcode == _STREAM_END:
                ended += 1
        buffer = buffer[position:]
        if unacked >= ack_every:
            sock.sendall(encode_request(BufferAck(unacked)))
            unacked = 0
    return messages, received


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    parts, missing = [], size
    while missing:
        part = sock.recv(missing)
        if not part:
            raise RuntimeError("the server closed the connection during the handshake")
        parts.append(part)
        missing -= len(part)
    return b"".join(parts)


def main() -> None:
    """Print the serve rate for the sizes given on the command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--doc-size", type=int, default=1024)
    parser.add_argument("--vbuckets", type=int, default=64)
    parser.add_argument("--snappy", action="store_true")
    parser.add_argument("--separate-process", action="store_true", help="server in its own process")
    args = parser.parse_args()
    rate = measure_serve_rate(
        args.docs,
        args.doc_size,
        vbuckets=args.vbuckets,
        snappy=args.snappy,
        separate_process=args.separate_process,
    )
    print(
        f"{rate.messages} messages, {rate.bytes / 1e6:.1f} MB in {rate.seconds:.2f} s: "
        f"{rate.messages_per_second:,.0f} messages/s, {rate.megabytes_per_second:.1f} MB/s"
    )


if __name__ == "__main__":
    main()
