"""A node's management port: the part of Couchbase's REST API that clients read the cluster from.

The cluster map advertises each node's `mgmt` port, and SDKs poll or stream the bucket config
there (gocbcore by default, alongside CCCP on the data port). Each simulated node serves, over
HTTP with basic auth (the bucket's users and passwords):

- `GET /pools`: the cluster's version and its one pool, `default`;
- `GET /pools/default`: the nodes, their services and ports, and where the buckets are;
- `GET /pools/default/buckets` and `/pools/default/buckets/BUCKET`: the bucket config;
- `GET /pools/default/b/BUCKET`: the terse bucket config, the cluster map CCCP hands out;
- `GET /pools/default/bs/BUCKET` and `/pools/default/bucketsStreaming/BUCKET`: the same,
  streamed: a chunked response that sends the config at once and again on every change,
  each followed by four newlines, as ns_server separates them;
- `GET /pools/default/buckets/BUCKET/scopes`: the collections manifest, every collection with
  its `maxTTL` and `history`, as ns_server lists them.

The full bucket configs (`/pools/default/buckets...`) of a magma bucket add its history
retention settings (`historyRetentionSeconds`, `historyRetentionBytes`,
`historyRetentionCollectionDefault`); the terse ones do not, as ns_server's do not.

Unknown paths and buckets answer 404, a missing or wrong password 401, other methods 405.
Views (`couchApiBase`) and HTTPS management ports are not simulated (docs/simulator.md).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from replicator.dcp.transport.socket_io import format_address
from replicator.sim.cluster_config import BucketTopology, bucket_uuid
from replicator.sim.sasl_server import CredentialStore

log = logging.getLogger(__name__)

IMPLEMENTATION_VERSION = "7.6.2-3721-enterprise"
"""The server version the management API reports (a 7.6 release, as the HELLO features)."""

CONFIG_SEPARATOR = b"\n\n\n\n"
"""What ns_server writes after each config of a streaming response."""

_REALM = 'Basic realm="Couchbase Server Admin / REST"'
_STREAM_POLL_S = 0.5


class ManagementContext(Protocol):
    """What a management server asks its cluster."""

    @property
    def credentials(self) -> CredentialStore: ...

    @property
    def topology(self) -> BucketTopology: ...

    def config_json(self, node: int) -> bytes: ...

    def scopes_json(self) -> bytes: ...

    def bucket_settings(self) -> dict[str, Any]: ...


class ManagementServer:
    """One node's management port, on `host:port` (ephemeral for 0), in its own threads."""

    def __init__(self, cluster: ManagementContext, node: int, *, host: str, port: int = 0) -> None:
        self._cluster = cluster
        self.node = node
        self._changed = threading.Condition()
        self._generation = 0
        self._stopping = False
        self._server = _HttpServer((host, port), _Handler, self)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def cluster(self) -> ManagementContext:
        return self._cluster

    def start(self) -> ManagementServer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                name=f"sim-mgmt-{self.node}", daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; streaming responses end."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(10)
            self._thread = None
        self._server.server_close()

    def notify_changed(self) -> None:
        """The cluster map may have changed: streaming responses send it again if it did."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def wait_for_change(self, seen: int, timeout: float) -> int | None:
        """The generation after `seen` once there is one; None when stopping."""
        with self._changed:
            self._changed.wait_for(lambda: self._generation != seen or self._stopping, timeout)
            return None if self._stopping else self._generation

    @property
    def generation(self) -> int:
        with self._changed:
            return self._generation


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
        owner: ManagementServer,
    ) -> None:
        self.owner = owner
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "Couchbase Server"
    sys_version = ""
    server: _HttpServer

    def do_GET(self) -> None:
        owner = self.server.owner
        if not self._authorised(owner.cluster.credentials):
            self._send(401, b"", content_type="text/plain", extra={"WWW-Authenticate": _REALM})
            return
        path = unquote(urlsplit(self.path).path).rstrip("/")
        bucket = owner.cluster.topology.bucket
        route: dict[str, Callable[[], Any]] = {
            "/pools": lambda: pools(),
            "/pools/default": lambda: pool_default(owner.cluster.topology, owner.node),
            "/pools/default/buckets": lambda: [self._full_config()],
            f"/pools/default/buckets/{bucket}": self._full_config,
            f"/pools/default/b/{bucket}": self._config,
            f"/pools/default/buckets/{bucket}/scopes": lambda: json.loads(
                owner.cluster.scopes_json()
            ),
        }
        if path in route:
            self._send(200, json.dumps(route[path](), separators=(",", ":")).encode())
        elif path in (f"/pools/default/bs/{bucket}", f"/pools/default/bucketsStreaming/{bucket}"):
            self._stream_configs(owner)
        else:
            self._send(404, b"Requested resource not found.\r\n", content_type="text/plain")

    def do_POST(self) -> None:
        self._send(405, b"Method Not Allowed\r\n", content_type="text/plain")

    do_PUT = do_DELETE = do_POST

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("mgmt %s: " + format, self.server.owner.node, *args)

    def _config(self) -> Any:
        owner = self.server.owner
        return json.loads(owner.cluster.config_json(owner.node))

    def _full_config(self) -> Any:
        config = self._config()
        config.update(self.server.owner.cluster.bucket_settings())
        return config

    def _authorised(self, credentials: CredentialStore) -> bool:
        header = self.headers.get("Authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return credentials.check_plain(user, password)

    def _send(
        self, status: int, body: bytes, *, content_type: str = "application/json",
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _stream_configs(self, owner: ManagementServer) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        sent: bytes | None = None
        seen = owner.generation
        try:
            while True:
                config = owner.cluster.config_json(owner.node)
                if config != sent:
                    self._chunk(config + CONFIG_SEPARATOR)
                    sent = config
                changed = owner.wait_for_change(seen, _STREAM_POLL_S)
                if changed is None:
                    self._chunk(b"")  # the last chunk: the stream ends cleanly
                    return
                seen = changed
        except (BrokenPipeError, ConnectionResetError):
            return  # the client went away

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def pools() -> dict[str, Any]:
    """`GET /pools`: the cluster's version and its one pool."""
    uuid = bucket_uuid("cluster")
    return {
        "isAdminCreds": True,
        "isROAdminCreds": False,
        "isEnterprise": True,
        "allowedServices": ["kv"],
        "uuid": uuid,
        "implementationVersion": IMPLEMENTATION_VERSION,
        "componentsVersion": {"ns_server": IMPLEMENTATION_VERSION,
                              "kv_engine": IMPLEMENTATION_VERSION},
        "pools": [{
            "name": "default",
            "uri": f"/pools/default?uuid={uuid}",
            "streamingUri": f"/poolsStreaming/default?uuid={uuid}",
        }],
    }  # fmt: skip


def pool_default(topology: BucketTopology, this_node: int) -> dict[str, Any]:
    """`GET /pools/default`: the nodes and where the buckets are."""
    uuid = bucket_uuid("cluster")
    nodes = []
    for index, node in enumerate(topology.nodes):
        entry: dict[str, Any] = {
            "hostname": format_address(node.host, node.mgmt_port),
            "clusterMembership": "active",
            "status": "healthy",
            "version": IMPLEMENTATION_VERSION,
            "services": ["kv"],
            "ports": {"direct": node.kv_port},
            "otpNode": f"n_{index}@{node.host}",
        }
        if node.kv_tls_port is not None:
            entry["ports"]["directSSL"] = node.kv_tls_port
        if index == this_node:
            entry["thisNode"] = True
        nodes.append(entry)
    return {
        "name": "default",
        "nodes": nodes,
        "buckets": {
            "uri": f"/pools/default/buckets?v={topology.rev}&uuid={uuid}",
            "terseBucketsBase": "/pools/default/b/",
            "terseStreamingBucketsBase": "/pools/default/bs/",
        },
        "rebalanceStatus": "none",
        "balanced": True,
        "clusterName": "",
    }


__all__ = ["CONFIG_SEPARATOR", "IMPLEMENTATION_VERSION", "ManagementServer"]
