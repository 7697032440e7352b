"""The `replicator` command: run, status, verify, sim, demo.

A user's mistake (bad config, wrong password, unreachable node, a target that is not a mirror)
ends with one line on stderr and exit code 2, never a stack trace. `verify` exits 1 when the
mirror differs from the source. The spark-submit job (jobs/replicate.py) reuses the `run`
parser and the same error handling through `run_job`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replicator.cli.flags import add_engine_flag
from replicator.errors import ConfigError, ReplicatorError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replicator.config import ReplicatorConfig
    from replicator.inspect.status import MirrorStatus

EXIT_OK = 0
EXIT_DIFFERENT = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

log = logging.getLogger("replicator")

_RUN_FLAGS = (
    # (flag, config field, type, help)
    ("--source", "source", str,
     "couchbase://HOST[:PORT][,HOST2]/BUCKET (couchbases: TLS), drizzle-log:///PATH or "
     "drizzle+amqp://[USER@]HOST[:PORT]/QUEUE"),
    ("--target", "target", str, "path of the mirror Delta table"),
    ("--username", "username", str, "user name (password: REPLICATOR_PASSWORD or _FILE)"),
    ("--vbuckets", "vbuckets", str, "vbuckets this replicator owns: 0-511,600 or shard 1/2"),
    ("--tls-ca", "tls_ca", str, "CA bundle that signed the server certificates"),
    ("--memory-budget-mb", "memory_budget_mb", int, "staging memory before spilling to files"),
    ("--commit-interval-s", "commit_interval_s", float, "longest wait before a group commit"),
    ("--commit-max-rows", "commit_max_rows", int, "rows that trigger a group commit"),
    ("--staging-dir", "staging_dir", str, "spill directory (default beside the table)"),
    ("--progress", "progress", str, "auto, bar, lines or off"),
    ("--sasl-mechanism", "sasl_mechanism", str,
     "SCRAM-SHA512, SCRAM-SHA256, SCRAM-SHA1 or PLAIN (default: strongest SCRAM offered)"),
)


_METRICS_FLAGS = (
    ("--metrics-port", "metrics_port", int, "serve Prometheus metrics on http://HOST:PORT/metrics"),
    ("--metrics-host", "metrics_host", str, "address the metrics endpoint binds (default 0.0.0.0)"),
    ("--metrics-log-s", "metrics_log_s", float,
     "also log the metrics as one JSON line every this many seconds (spark-submit)"),
)


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML config file (REPLICATOR_CONFIG)")
    for flag, field, kind, text in _RUN_FLAGS:
        parser.add_argument(flag, dest=field, type=kind, default=None, help=text)
    parser.add_argument(
        "--allow-plain-over-tcp", dest="allow_plain_over_tcp", action="store_const",
        const=True, default=None, help="allow SASL PLAIN without TLS (sends the password in clear)",
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `replicator run` (and of `spark-submit jobs/replicate.py`)."""
    _add_config_flags(parser)
    parser.add_argument(
        "--until-caught-up", action="store_true",
        help="stop once every vbucket has committed the high seqno seen at start",
    )
    parser.add_argument(
        "--history", action="store_true",
        help="open change streams and keep every revision of collections with history "
        "retention in a history table beside the mirror (Couchbase 7.2+)",
    )
    for flag, field, kind, text in _METRICS_FLAGS:
        parser.add_argument(flag, dest=field, type=kind, default=None, help=text)


def config_from_args(
    args: argparse.Namespace, extra: dict[str, Any] | None = None
) -> ReplicatorConfig:
    """The config of parsed flags, merged over the TOML file and the environment."""
    from replicator.config import load_config

    flags = {
        field: getattr(args, field, None) for _, field, _, _ in (*_RUN_FLAGS, *_METRICS_FLAGS)
    }
    flags["allow_plain_over_tcp"] = getattr(args, "allow_plain_over_tcp", None)
    flags.update(extra or {})
    return load_config(config_file=args.config, flags=flags)


def run_command(args: argparse.Namespace, *, spark: SparkSession | None = None) -> int:
    """`replicator run`: replicate until stopped (SIGTERM/SIGINT) or caught up."""
    from replicator.drizzle.sources import is_drizzle_source
    from replicator.pipeline.runner import run_replication

    config = config_from_args(
        args,
        {
            "until_caught_up": True if args.until_caught_up else None,
            "history": True if args.history else None,
        },
    )
    config.require_source_and_target()
    if is_drizzle_source(config.source):
        from replicator.drizzle.replication import run_drizzle_replication

        print(run_drizzle_replication(config, spark=spark).describe())
        return EXIT_OK
    summary = run_replication(config, spark=spark)
    print(summary.describe())
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    return run_command(args)


def _cmd_status(args: argparse.Namespace) -> int:
    from replicator.inspect.health import HealthThresholds
    from replicator.inspect.status import read_status

    config = config_from_args(args)
    if not config.target:
        raise ConfigError("status needs --target PATH (or set target)")
    if (Path(config.target) / "_replicator" / "drizzle_progress").is_dir():
        return _relational_status(config.target, args.json)
    thresholds = HealthThresholds(
        max_lag_seqnos=args.max_lag_seqnos, max_lag_s=args.max_lag_s,
        stalled_after_s=args.stalled_after_s,
    )
    status = read_status(config, engine=args.engine, thresholds=thresholds)
    if args.plot:
        _plot(status, config.target, args.engine, args.plot)
    print(status.to_json_text() if args.json else status.render())
    return status.health.exit_code


def _plot(status: MirrorStatus, target: str, engine: str | None, path: str) -> None:
    from replicator.delta.reader import table_reader
    from replicator.inspect.commits import commit_activities
    from replicator.inspect.lag_plot import plot_status
    from replicator.inspect.mirror_history import read_history

    entries = read_history(table_reader(engine), target, checked=True)
    written = plot_status(status, commit_activities(entries), path)
    print(f"plotted lag and commit rate to {written}", file=sys.stderr)


def _cmd_verify(args: argparse.Namespace) -> int:
    from replicator.drizzle.sources import is_drizzle_source
    from replicator.inspect.verify import run_verify

    if args.max_keys < 0:
        raise ConfigError("--max-keys must not be negative")
    config = config_from_args(args)
    config.require_source_and_target()
    if is_drizzle_source(config.source):
        return _verify_relational(config.source, config.target, args.max_keys)
    report = run_verify(config, engine=args.engine)
    print(report.describe(max_keys=args.max_keys))
    return EXIT_OK if report.equal else EXIT_DIFFERENT


def _verify_relational(source: str, target: str, max_keys: int) -> int:
    """`verify` of a Drizzle mirror, against the state the producer's transaction log holds."""
    from replicator.drizzle.sources import parse_source
    from replicator.inspect.relational import replay_log, verify_mirror
    from replicator.runtime.spark import build_session

    kind, location = parse_source(source)
    if kind != "log":
        raise ConfigError(
            "a queue cannot be read without consuming it: verify a drizzle+amqp mirror against "
            "the producer's transaction log, --source drizzle-log:///PATH"
        )
    database = replay_log(location)
    report = verify_mirror(build_session("replicator-verify"), target, database)
    print(report.describe(max_keys=max_keys))
    return EXIT_OK if report.equal else EXIT_DIFFERENT


def _relational_status(target: str, as_json: bool) -> int:
    import json

    from replicator.inspect.relational import read_status
    from replicator.runtime.spark import build_session

    status = read_status(build_session("replicator-status"), target)
    if as_json:
        print(json.dumps({
            "target": status.target, "last_group": status.last_group,
            "landed": status.landed, "resume_from": status.resume_from,
            "source": status.source,
            "tables": {str(name): version for name, version in sorted(status.tables.items())},
        }, indent=2))
    else:
        print(status.render())
    return EXIT_OK


def _cmd_sim_drizzle(args: argparse.Namespace) -> int:
    import os

    from replicator.drizzle.amqp.publisher import TransactionPublisher
    from replicator.drizzle.amqp.source import AmqpSource
    from replicator.drizzle.log import TransactionLogWriter
    from replicator.drizzle.workload import Workload, WorkloadSettings

    if not args.log and not args.amqp:
        raise ConfigError("sim-drizzle needs --log PATH, --amqp URL, or both")
    if args.transactions < 1 or args.bulk_rows < 1:
        raise ConfigError("--transactions and --bulk-rows must be at least 1")
    password = os.environ.get("REPLICATOR_PASSWORD")
    publisher = (
        TransactionPublisher(AmqpSource.parse(args.amqp, password=password)).connect()
        if args.amqp else None
    )
    workload = Workload(WorkloadSettings(seed=args.seed, bulk_rows=args.bulk_rows))
    writer = TransactionLogWriter(args.log) if args.log else None
    messages = 0
    try:
        for message in workload.messages(args.transactions):
            if writer is not None:
                writer.append(message)
            if publisher is not None:
                publisher.publish(message.SerializeToString())
            messages += 1
    finally:
        if writer is not None:
            writer.close()
        if publisher is not None:
            publisher.close()
    where = " and ".join(x for x in (args.log, args.amqp and str(AmqpSource.parse(args.amqp)))
                         if x)
    tables = len(workload.database.tables)
    print(f"produced {args.transactions} transactions ({messages} messages, {tables} live "
          f"tables) to {where}")
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from replicator.cli.demo import run_demo

    result: int = run_demo(
        output_dir=args.output, docs=args.docs, vbuckets=args.vbuckets,
        live_seconds=args.live_seconds, live_rate=args.live_rate,
    )
    return result


def build_parser() -> argparse.ArgumentParser:
    """The parser of the `replicator` command and its subcommands."""
    from replicator.inspect.health import HealthThresholds

    parser = argparse.ArgumentParser(
        prog="replicator",
        description="Mirror a Couchbase bucket into Delta Lake through DCP.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="replicate a bucket into a Delta table")
    add_run_arguments(run)
    run.set_defaults(handler=_cmd_run)

    status = commands.add_parser(
        "status", help="per-vbucket positions, lag, rollbacks and health",
        description="Show where the mirror stands. Reads the mirror only; with --source (which "
        "needs the password) also the lag behind the producer's high seqnos. Exits with the "
        "health verdict: 0 ok, 3 lagging, 4 stalled, 5 fenced (2 on errors).",
    )
    _add_config_flags(status)
    status.add_argument("--json", action="store_true", help="machine-readable output")
    add_engine_flag(status)
    status.add_argument(
        "--plot", metavar="FILE.png",
        help="also draw the commit rate and each vbucket's lag into a PNG (needs matplotlib)",
    )
    defaults = HealthThresholds()
    status.add_argument(
        "--max-lag-seqnos", type=int, default=defaults.max_lag_seqnos,
        help="lagging above this many seqnos behind --source in all "
        f"(default {defaults.max_lag_seqnos})",
    )
    status.add_argument(
        "--max-lag-s", type=float, default=defaults.max_lag_s,
        help="lagging when a vbucket behind --source last committed longer ago "
        f"(default {defaults.max_lag_s:g})",
    )
    status.add_argument(
        "--stalled-after-s", type=float, default=defaults.stalled_after_s,
        help="stalled when a vbucket behind --source last committed longer ago "
        f"(default {defaults.stalled_after_s:g})",
    )
    status.set_defaults(handler=_cmd_status)

    verify = commands.add_parser(
        "verify", help="compare the mirror with the source",
        description="Stream every vbucket of the source up to its high seqno and compare with "
        "the mirror. Exit 0 when equal, 1 when different, 2 on errors.",
    )
    _add_config_flags(verify)
    verify.add_argument(
        "--max-keys", type=int, default=10, help="differing keys shown per vbucket (default 10)"
    )
    add_engine_flag(verify)
    verify.set_defaults(handler=_cmd_verify)

    sim = commands.add_parser("sim", help="serve a simulated bucket (the embedded producer)")
    from replicator.sim.cli import add_sim_arguments, run_sim

    add_sim_arguments(sim)
    sim.set_defaults(handler=run_sim)

    drizzle = commands.add_parser(
        "sim-drizzle",
        help="produce Drizzle transactions (the embedded producer): to a transaction log, "
        "and/or to a RabbitMQ queue",
        description="Generate a deterministic workload of Drizzle transactions (small, bulk "
        "in segments, rolled back, DDL) and append them to a transaction log (--log) and/or "
        "publish them to a queue (--amqp drizzle+amqp://HOST/QUEUE, password from "
        "REPLICATOR_PASSWORD). The same --seed continues the same producer only in one call.",
    )
    drizzle.add_argument("--log", help="transaction log file to append to")
    drizzle.add_argument("--amqp", help="drizzle+amqp://[USER@]HOST[:PORT]/QUEUE to publish to")
    drizzle.add_argument("--transactions", type=int, default=500, help="how many (default 500)")
    drizzle.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    drizzle.add_argument("--bulk-rows", type=int, default=300, help="rows of a bulk statement")
    drizzle.set_defaults(handler=_cmd_sim_drizzle)

    audit = commands.add_parser("audit", help="document history, time travel and rollbacks")
    from replicator.cli.audit import add_audit_arguments, run_audit

    add_audit_arguments(audit)
    audit.set_defaults(handler=run_audit)

    demo = commands.add_parser("demo", help="end-to-end demo on the embedded producer")
    demo.add_argument("--output", default="demo-output", help="where the demo leaves its table")
    demo.add_argument("--docs", type=int, default=20_000, help="initial documents")
    demo.add_argument("--vbuckets", type=int, default=64, help="vbuckets of the demo bucket")
    demo.add_argument("--live-seconds", type=float, default=8.0,
                      help="how long the live workload runs")
    demo.add_argument("--live-rate", type=float, default=400.0,
                      help="changes per second of the live workload")
    demo.set_defaults(handler=_cmd_demo)
    return parser


def build_job_parser(prog: str = "replicate.py") -> argparse.ArgumentParser:
    """The parser of the spark-submit job: the flags of `replicator run`."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="spark-submit entry point: replicate a Couchbase bucket into a Delta table "
        "(the flags of `replicator run`).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    add_run_arguments(parser)
    return parser


def _configure_logging(verbose: bool, *, quiet: bool = False) -> None:
    # `quiet`: the command narrates itself (the demo); only warnings and errors interleave.
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    # py4j logs every gateway call at INFO: noise to an operator.
    logging.getLogger("py4j").setLevel(logging.WARNING)


def guarded(action: Callable[[], int]) -> int:
    """Run a command: a ReplicatorError becomes one line on stderr and exit code 2."""
    try:
        return action()
    except ReplicatorError as exc:
        print(f"replicator: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `replicator` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.verbose, quiet=args.command == "demo")
    handler: Callable[[argparse.Namespace], int] = args.handler
    return guarded(lambda: handler(args))


def run_job(argv: Sequence[str] | None = None, *, prog: str = "replicate.py") -> int:
    """Entry point of the spark-submit job: `replicator run` in a session spark-submit set up.

    The session comes from `replicator.runtime.spark.build_session`, which keeps spark-submit's
    master and checks that Delta loads (spark-submit must bring its jars: `--jars` or `--packages`).
    Configuration and the password are checked before the session starts, so those mistakes
    fail fast.
    """
    args = build_job_parser(prog).parse_args(argv)
    _configure_logging(args.verbose)

    def job() -> int:
        from replicator.runtime.spark import build_session

        config = config_from_args(args)
        config.require_source_and_target()
        config.resolved_password()
        spark = build_session("replicator")
        return run_command(args, spark=spark)

    return guarded(job)


if __name__ == "__main__":
    raise SystemExit(main())
