"""The source a config names: connecting to it, and what a run must learn of it before starting.

Shared by the pipeline (a run) and the read side (status and verify compare with the source),
so it sits beside the config rather than in either.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from replicator.config import ReplicatorConfig
from replicator.dcp.cluster.client import DcpClient
from replicator.dcp.cluster.connstr import ConnectionString
from replicator.dcp.cluster.options import ClientOptions
from replicator.dcp.transport.auth import Credentials, parse_sasl_mechanism
from replicator.dcp.transport.options import ConnectionOptions, TlsSettings
from replicator.errors import UnsupportedCommandError
from replicator.model.aliases import CommittedPosition
from replicator.staging.collections import collections_with_history

log = logging.getLogger(__name__)


def client_options(config: ReplicatorConfig, *, tls: bool) -> ClientOptions:
    return ClientOptions(
        connection=ConnectionOptions(
            flow_control_window=config.flow_control_window_kb * 1024,
            noop_interval=config.noop_interval_s,
            allow_plain_over_tcp=config.allow_plain_over_tcp,
            sasl_mechanism=(
                parse_sasl_mechanism(config.sasl_mechanism) if config.sasl_mechanism else None
            ),
            tls=TlsSettings(ca_file=config.tls_ca or None) if tls else TlsSettings(),
            change_streams=config.history,
            backfill_order=config.backfill_order,
        )
    )


def connect_source(
    config: ReplicatorConfig, *, committed_position: CommittedPosition | None = None
) -> DcpClient:
    """Bootstrap the DCP client; the errors name the node and what is wrong."""
    connection_string = ConnectionString.parse(config.source)
    credentials = Credentials(config.username, config.resolved_password().value)
    return DcpClient(
        connection_string, credentials,
        options=client_options(config, tls=connection_string.tls),
        committed_position=committed_position,
    )


@dataclass(frozen=True, slots=True)
class SourceCheck:
    """What a run learnt of the source before starting Spark."""

    manifest: dict[str, object]
    highs: dict[int, int] | None
    """Each active vbucket's high seqno; None when the source cannot tell them."""
    targets: dict[int, int] | None
    """With --until-caught-up, the high seqno each vbucket must reach."""
    history: bool = False
    """`history` was asked for and the producer streams history snapshots."""


def check_source(
    client: DcpClient, config: ReplicatorConfig, vbuckets: tuple[int, ...]
) -> SourceCheck:
    """Ask the source for everything the run needs before anything expensive starts (Spark,
    the table, the claim); a refusal is one line naming the node, the command and what to do.

    The DCP controls were already negotiated when the client connected."""
    try:
        manifest = client.collections_manifest()
    except UnsupportedCommandError as exc:
        raise UnsupportedCommandError(
            exc.node,
            f"{_detail(exc)}; the replicator needs the collections manifest to name each row's "
            "collection: use Couchbase Server 7.0 or later, or a proxy that forwards it",
            command=exc.command,
        ) from None
    highs: dict[int, int] | None = None
    try:
        highs = client.high_seqnos()
    except UnsupportedCommandError as exc:
        if config.until_caught_up:
            raise UnsupportedCommandError(
                exc.node,
                f"{_detail(exc)}; --until-caught-up needs them to know where to stop: run "
                "without it (a continuous run, stopped with Ctrl-C or SIGTERM), or against a "
                "server that supports the command",
                command=exc.command,
            ) from None
        # A continuous run goes on without them; the replication says the lag is unknown.
    targets = (
        {vb: highs.get(vb, 0) for vb in vbuckets}
        if config.until_caught_up and highs is not None else None
    )
    return SourceCheck(manifest, highs, targets, history=config.history and _history_ready(
        client, manifest
    ))


def _history_ready(client: DcpClient, manifest: Mapping[str, object]) -> bool:
    """Whether `history` can record anything; says clearly why not (the mirror runs anyway)."""
    if not client.change_streams():
        log.warning(
            "history: the producer of bucket %s refused change streams (Couchbase Server before "
            "7.2 has none): no history is recorded, the mirror is replicated as usual",
            client.bucket,
        )
        return False
    with_history = collections_with_history(manifest)
    if not with_history:
        log.warning(
            "history: no collection of bucket %s keeps history (history retention is off, or "
            "no collection has history enabled): the history table gets revisions only once "
            "one does",
            client.bucket,
        )
    else:
        log.info("history: recording every revision of %s", ", ".join(with_history))
    return True


def _detail(error: UnsupportedCommandError) -> str:
    """The error's text without its node prefix (the wrapping error names the node again)."""
    return str(error).removeprefix(f"{error.node}: ")
