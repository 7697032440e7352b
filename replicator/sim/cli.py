"""`replicator sim`: serve a simulated bucket over TCP until SIGTERM or SIGINT.

The first line on stdout is the connection string (`couchbase://127.0.0.1:11210/default`), so
a script can start the simulator and read where to connect; a second line follows with the
`couchbases://` string when TLS is on. The password is never printed. Live changes
(`--rate`) and periodic faults (`--faults`, `--fault-interval`) run until the process stops.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from types import FrameType

from replicator.dcp.transport.auth import parse_sasl_mechanism
from replicator.errors import ConfigError
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import (
    DEFAULT_PASSWORD,
    DEFAULT_USERNAME,
    SimCluster,
    server_tls_context,
)
from replicator.sim.faults import MalformedFrame
from replicator.sim.history_items import DocumentNotFoundError
from replicator.sim.sasl_server import MECHANISMS, check_mechanisms
from replicator.sim.server import ServerOptions
from replicator.sim.workload import Workload, initial_load, run_workload

log = logging.getLogger(__name__)

PASSWORD_ENV = "REPLICATOR_SIM_PASSWORD"
FAULT_KINDS = ("drop", "failover", "rebalance", "purge", "restart", "stall", "malformed")
"""What `--faults` may name; each interval applies the next one in turn."""


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `sim` options to `parser` (the `replicator sim` subcommand or `-m` entry)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port",
        type=int,
        default=11210,
        help="first node's data port; node i takes port+i (0: ephemeral ports)",
    )
    parser.add_argument("--bucket", default="default", help="bucket name")
    parser.add_argument("--vbuckets", type=int, default=1024, help="number of vbuckets")
    parser.add_argument("--nodes", type=int, default=1, help="number of nodes")
    parser.add_argument("--docs", type=int, default=1000, help="documents loaded at start")
    parser.add_argument("--doc-size", type=int, default=512, help="approximate document bytes")
    parser.add_argument("--rate", type=float, default=0.0, help="live changes per second (0: none)")
    parser.add_argument("--username", default=DEFAULT_USERNAME, help="user clients log in as")
    parser.add_argument(
        "--password",
        default=None,
        help=f"the user's password (default: ${PASSWORD_ENV}, else '{DEFAULT_PASSWORD}')",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for data and uuids")
    parser.add_argument("--tls-cert", default=None, help="PEM certificate: also serve TLS")
    parser.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    parser.add_argument(
        "--tls-port",
        type=int,
        default=0,
        help="first node's TLS port; node i takes port+i (0: ephemeral ports)",
    )
    parser.add_argument(
        "--mgmt-port",
        type=int,
        default=None,
        help="first node's management (REST) port; node i takes port+i (0: ephemeral ports; "
        "default 8091, ephemeral with --port 0)",
    )
    parser.add_argument(
        "--send-rate",
        type=int,
        default=None,
        metavar="BYTES_PER_S",
        help="cap every connection's send rate (a slow network)",
    )
    parser.add_argument(
        "--sasl-mechanisms",
        default=",".join(MECHANISMS),
        metavar="NAMES",
        help="comma-separated SASL mechanisms the nodes offer (default: all, "
        f"{','.join(MECHANISMS)})",
    )
    parser.add_argument(
        "--faults",
        default="",
        help=f"comma-separated faults to inject in turn: {', '.join(FAULT_KINDS)}",
    )
    parser.add_argument(
        "--fault-interval", type=float, default=30.0, help="seconds between injected faults"
    )
    parser.add_argument(
        "--failover-lose", type=int, default=10, help="items a failover fault loses"
    )
    parser.add_argument(
        "--superseded-window",
        type=int,
        default=None,
        metavar="SEQNOS",
        help="free a version once the seqno that replaced it is this far behind its vbucket's "
        "high seqno (default: keep every version, so memory grows with every write); failovers "
        "then lose at most that many seqnos",
    )
    parser.add_argument(
        "--storage-backend",
        choices=("couchstore", "magma"),
        default=None,
        help="the bucket's storage; only magma retains history and accepts DCP change streams "
        "(default: magma with a --history-* option, else couchstore)",
    )
    parser.add_argument(
        "--history-retention-seconds",
        type=int,
        default=0,
        metavar="SECONDS",
        help="retain every revision of history collections this long, by CAS time (0: off)",
    )
    parser.add_argument(
        "--history-retention-bytes",
        type=int,
        default=0,
        metavar="BYTES",
        help="retain the newest revisions within this many bytes, split over the vbuckets "
        "(0: off)",
    )
    parser.add_argument(
        "--history-collections",
        default=None,
        metavar="PATHS",
        help="collections that keep history: 'all', 'none' or comma-separated scope.collection "
        "paths (_default._default is the default collection); default on magma: all",
    )


def sim_password(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> str:
    """The password clients log in with: --password, else $REPLICATOR_SIM_PASSWORD, else the
    development default ("password")."""
    return args.password or environ.get(PASSWORD_ENV) or DEFAULT_PASSWORD


def run_sim(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT; 0 on a clean stop. Bad options raise ConfigError."""
    faults = _parse_faults(args.faults)
    mechanisms = _parse_mechanisms(args.sasl_mechanisms)
    _check_options(args, faults)
    password = sim_password(args)
    tls_context = None
    if args.tls_cert:
        try:
            tls_context = server_tls_context(args.tls_cert, args.tls_key)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load --tls-cert/--tls-key: {exc}") from None
    bucket = _build_bucket(args)
    workload: Workload | None = None
    if args.docs:
        workload = initial_load(bucket, args.docs, args.doc_size, seed=args.seed)
    cluster = SimCluster(
        bucket,
        args.nodes,
        host=args.host,
        base_port=args.port,
        users={args.username: password},
        tls_context=tls_context,
        tls_base_port=args.tls_port,
        mgmt_base_port=args.mgmt_port,
        options=ServerOptions(
            send_rate_bytes_per_second=args.send_rate, sasl_mechanisms=mechanisms
        ),
    )
    try:
        cluster.start()
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {args.host} (data port {args.port}, management port "
            f"{args.mgmt_port}): {exc}; choose free ports, or 0 for ephemeral ones"
        ) from None
    stop = threading.Event()
    previous = _install_stop_handlers(stop)
    threads: list[threading.Thread] = []
    try:
        print(cluster.connection_string, flush=True)
        if cluster.tls_connection_string is not None:
            print(cluster.tls_connection_string, flush=True)
        print(f"management REST API: {', '.join(cluster.management_urls)}", file=sys.stderr,
              flush=True)
        if args.rate > 0:
            threads.append(
                _start(
                    "sim-workload",
                    lambda: _run_live_changes(bucket, args, workload, stop),
                )
            )
        if faults:
            rng = random.Random(args.seed)
            threads.append(
                _start(
                    "sim-faults",
                    lambda: _inject_faults(
                        cluster, faults, args.fault_interval, args.failover_lose, stop, rng
                    ),
                )
            )
        log.info(
            "serving bucket %r on %d node(s); stop with SIGTERM or Ctrl-C", args.bucket, args.nodes
        )
        stop.wait()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10.0)
        cluster.close()
        _restore_handlers(previous)
    return 0


def _run_live_changes(
    bucket: SimBucket, args: argparse.Namespace, workload: Workload | None, stop: threading.Event
) -> None:
    """Apply the workload at `--rate` until `stop`, starting over after faults lose data."""
    seed = args.seed
    while not stop.is_set():
        if workload is None:
            workload = Workload(seed=seed, doc_size=max(args.doc_size, 1))
            workload.ensure_collections(bucket)
        try:
            run_workload(bucket, args.rate, workload=workload, stop_event=stop)
        except DocumentNotFoundError:
            # A failover or wipe took documents the workload counted on: forget them.
            log.info("live changes: documents were lost to a fault; the workload starts over")
            workload = None
            seed += 1


def _build_bucket(args: argparse.Namespace) -> SimBucket:
    """The bucket the options describe; ConfigError for history options it cannot take."""
    spec = args.history_collections
    history_default: bool | None = None
    paths: list[str] = []
    if spec is not None:
        text = spec.strip()
        if text == "all":
            history_default = True
        elif text == "none":
            history_default = False
        else:
            history_default = False
            paths = [path.strip() for path in text.split(",") if path.strip()]
            if not paths:
                raise ConfigError("--history-collections: name 'all', 'none' or collections")
    try:
        return SimBucket(
            args.bucket,
            args.vbuckets,
            seed=args.seed,
            history_retention_seconds=args.history_retention_seconds,
            history_retention_bytes=args.history_retention_bytes,
            history_collections=paths,
            history_collection_default=history_default,
            storage_backend=args.storage_backend,
            superseded_window=args.superseded_window,
        )
    except ValueError as exc:
        raise ConfigError(f"history options: {exc}") from None


def _check_options(args: argparse.Namespace, faults: Sequence[str]) -> None:
    if not 1 <= args.vbuckets <= 1024:
        raise ConfigError(f"--vbuckets must be 1..1024, got {args.vbuckets}")
    if not 1 <= args.nodes <= min(64, args.vbuckets):
        raise ConfigError(f"--nodes must be 1..{min(64, args.vbuckets)}, got {args.nodes}")
    if args.mgmt_port is None:
        args.mgmt_port = 8091 if args.port else 0
    for flag, port in (("--port", args.port), ("--tls-port", args.tls_port),
                       ("--mgmt-port", args.mgmt_port)):
        if not 0 <= port <= 65535 - args.nodes:
            raise ConfigError(f"{flag} {port} leaves no room for {args.nodes} node(s)")
    if args.docs < 0 or args.doc_size < 0:
        raise ConfigError("--docs and --doc-size must not be negative")
    if args.rate < 0:
        raise ConfigError(f"--rate must not be negative, got {args.rate}")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ConfigError("--tls-cert and --tls-key go together")
    if args.send_rate is not None and args.send_rate < 1:
        raise ConfigError(f"--send-rate must be positive, got {args.send_rate}")
    if faults and args.fault_interval <= 0:
        raise ConfigError(f"--fault-interval must be positive, got {args.fault_interval}")
    if "rebalance" in faults and args.nodes < 2:
        raise ConfigError("the rebalance fault needs --nodes 2 or more")
    if not args.username:
        raise ConfigError("--username must not be empty")
    if args.history_retention_seconds < 0 or args.history_retention_bytes < 0:
        raise ConfigError("--history-retention-seconds and --history-retention-bytes must not "
                          "be negative")
    window = args.superseded_window
    if window is not None:
        if window < 1:
            raise ConfigError(f"--superseded-window must be positive, got {window}")
        if args.history_retention_seconds or args.history_retention_bytes:
            raise ConfigError("--superseded-window cannot go with --history-retention-*: "
                              "a bucket that retains history keeps its versions")
        if "failover" in faults and window < args.failover_lose:
            raise ConfigError(f"--superseded-window {window} is below --failover-lose "
                              f"{args.failover_lose}: a failover could not restore what it "
                              "loses; raise the window")


def _parse_faults(text: str) -> list[str]:
    kinds = [kind.strip() for kind in text.split(",") if kind.strip()]
    unknown = [kind for kind in kinds if kind not in FAULT_KINDS]
    if unknown:
        raise ConfigError(f"unknown fault {unknown[0]!r}: choose from {', '.join(FAULT_KINDS)}")
    return kinds


def _parse_mechanisms(text: str) -> tuple[str, ...]:
    # The client's parser, so `scram-sha-256` works here as it does for --sasl-mechanism.
    try:
        names = [parse_sasl_mechanism(name).value for name in text.split(",") if name.strip()]
        return check_mechanisms(list(dict.fromkeys(names)))
    except ValueError as exc:
        raise ConfigError(
            f"--sasl-mechanisms: {exc}; choose from {', '.join(MECHANISMS)}"
        ) from None


def _start(name: str, target: object) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)  # type: ignore[arg-type]
    thread.start()
    return thread


def _inject_faults(
    cluster: SimCluster,
    kinds: Sequence[str],
    interval: float,
    failover_lose: int,
    stop: threading.Event,
    rng: random.Random,
) -> None:
    """Apply `kinds` in turn, one every `interval` seconds, until `stop` is set."""
    turn = 0
    while not stop.wait(interval):
        kind = kinds[turn % len(kinds)]
        turn += 1
        vbucket = rng.randrange(cluster.bucket.num_vbuckets)
        node = rng.randrange(len(cluster.nodes))
        if kind == "drop":
            cluster.drop_connections()
        elif kind == "failover":
            high = cluster.bucket.vbucket(vbucket).high_seqno
            cluster.failover(vbucket, min(failover_lose, high))
        elif kind == "rebalance":
            cluster.rebalance("rotate")
        elif kind == "purge":
            for vb in range(cluster.bucket.num_vbuckets):
                cluster.purge_tombstones(vb)
        elif kind == "restart":
            cluster.restart_node(node)
        elif kind == "stall":
            cluster.stall(node)
            stop.wait(interval / 2)
            cluster.release(node)
        else:
            cluster.send_malformed_frame(MalformedFrame.BAD_LENGTHS)
        log.info("injected fault %s (vbucket %d, node %d)", kind, vbucket, node)


def _install_stop_handlers(
    stop: threading.Event,
) -> dict[int, object]:
    def handle(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, handle)
    return previous


def _restore_handlers(previous: dict[int, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)  # type: ignore[arg-type]
