"""Replicator settings: one frozen `ReplicatorConfig`, defaults < TOML < environment < flags.

Passwords come only from the environment (`REPLICATOR_PASSWORD`) or a file
(`password_file` / `REPLICATOR_PASSWORD_FILE`), never from a flag that shows in the process list,
and a config's repr never shows them.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from replicator.dcp.transport.auth import SASL_MECHANISM_NAMES, parse_sasl_mechanism
from replicator.dcp.transport.options import BACKFILL_ORDERS
from replicator.errors import ConfigError

FIRST_LOAD_WRITERS = ("auto", "spark")
STEADY_WRITERS = ("spark", "deletion-vectors")
"""Who appends first loads: `auto` is the Arrow path (pyarrow's files, delta-rs's commit;
replicator.delta.arrow_append) where the data table allows it, Spark elsewhere; `spark` is
always Spark."""

ENV_PREFIX = "REPLICATOR_"


@dataclass(frozen=True, slots=True)
class Secret:
    """A password that never prints."""

    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "Secret(***)"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class VbucketSelection:
    """Which vbuckets this replicator owns: all of them, a list of ranges, or shard k of n."""

    ranges: tuple[tuple[int, int], ...] = ()
    shard: tuple[int, int] | None = None

    @classmethod
    def parse(cls, spec: str) -> VbucketSelection:
        """Parse `0-511,600`, or `1/2` (shard 1 of 2, counted from 1), or `all`.

        >>> VbucketSelection.parse("0-3,8").resolve(16)
        (0, 1, 2, 3, 8)
        >>> VbucketSelection.parse("2/2").resolve(4)
        (2, 3)
        """
        spec = spec.strip()
        if spec in ("", "all"):
            return cls()
        try:
            if "/" in spec:
                index, count = (int(part) for part in spec.split("/"))
                if not 1 <= index <= count:
                    raise ValueError
                return cls(shard=(index, count))
            ranges = []
            for part in spec.split(","):
                low, _, high = part.strip().partition("-")
                first, last = int(low), int(high or low)
                if first < 0 or last < first:
                    raise ValueError
                ranges.append((first, last))
            return cls(ranges=tuple(ranges))
        except ValueError:
            raise ConfigError(
                f"invalid vbuckets {spec!r}: use ranges like 0-511,700 or a shard like 1/2"
            ) from None

    def resolve(self, num_vbuckets: int) -> tuple[int, ...]:
        """The vbucket ids selected out of a bucket with `num_vbuckets`."""
        if self.shard is not None:
            index, count = self.shard
            size = num_vbuckets // count
            extra = num_vbuckets % count
            start = (index - 1) * size + min(index - 1, extra)
            end = start + size + (1 if index <= extra else 0)
            return tuple(range(start, end))
        if not self.ranges:
            return tuple(range(num_vbuckets))
        selected = sorted({vb for low, high in self.ranges for vb in range(low, high + 1)})
        beyond = [vb for vb in selected if vb >= num_vbuckets]
        if beyond:
            raise ConfigError(
                f"vbuckets {beyond[0]}.. do not exist: the bucket has {num_vbuckets} vbuckets"
            )
        return tuple(selected)

    def __str__(self) -> str:
        if self.shard is not None:
            return f"{self.shard[0]}/{self.shard[1]}"
        if not self.ranges:
            return "all"
        return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in self.ranges)


def vbucket_ranges(vbuckets: Iterable[int]) -> str:
    """Vbuckets written as `--vbuckets` takes them, runs joined (pure).

    >>> vbucket_ranges([7, 0, 1, 2, 3])
    '0-3,7'
    """
    ordered = sorted(set(vbuckets))
    if not ordered:
        return ""
    parts: list[str] = []
    start = previous = ordered[0]
    for vbucket in [*ordered[1:], None]:
        if vbucket is not None and vbucket == previous + 1:
            previous = vbucket
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if vbucket is not None:
            start = previous = vbucket
    return ",".join(parts)


@dataclass(frozen=True)
class ReplicatorConfig:
    """Everything `replicator run` needs. Field names are the TOML keys and, upper-cased with the
    `REPLICATOR_` prefix, the environment variables."""

    source: str = ""
    target: str = ""
    username: str = "Administrator"
    password: Secret | None = None
    password_file: str = ""
    vbuckets: VbucketSelection = VbucketSelection()
    tls_ca: str = ""
    allow_plain_over_tcp: bool = False
    sasl_mechanism: str | None = None
    """One of SASL_MECHANISM_NAMES; None: the strongest SCRAM the server offers."""
    until_caught_up: bool = False
    memory_budget_mb: int = 256
    commit_interval_s: float = 2.0
    commit_max_rows: int = 1_000_000
    flow_control_window_kb: int = 10_240
    noop_interval_s: int = 120
    backfill_order: str = "sequential"
    """DCP backfill order asked of the producer: `sequential` completes one vbucket's disk
    snapshot after another, so a first load commits while it streams; `round-robin` is the
    producer's default."""
    staging_dir: str = ""
    log_retention: str = "interval 30 days"
    deleted_file_retention: str = "interval 7 days"
    progress: str = "auto"
    status_interval_s: float = 10.0
    metrics_port: int = 0
    """Serve Prometheus metrics on this port (0: no endpoint)."""
    metrics_host: str = "0.0.0.0"
    metrics_log_s: float = 0.0
    """Write the metrics as a log line this often (0: never)."""
    source_check_interval_s: float = 30.0
    """How often a run asks the producer for its high seqnos: the lag's resolution."""
    first_load_writer: str = "auto"
    """Who appends first loads (FIRST_LOAD_WRITERS)."""
    steady_writer: str = "deletion-vectors"
    """Who commits steady batches (STEADY_WRITERS): Spark's MERGE, or deletion vectors and new
    files written by the replicator where the table and the batch allow it."""
    row_images: bool = True
    """With the deletion-vector writer, keep each data file's rows again as uncompressed Arrow
    beside the table (`_replicator/row_images`), so that a batch's preimages and a compaction's
    rows are taken by position instead of decoding the table's Parquet (disk: about the live
    documents' size uncompressed)."""
    writer_process: bool = True
    """Run the deletion-vector writer in a child process of its own, where its Arrow work never
    waits for the replication thread's GIL."""
    history: bool = False
    """Open change streams and keep every revision of collections with history retention in a
    history table beside the mirror (`_replicator/history`)."""

    def __post_init__(self) -> None:
        if self.memory_budget_mb < 8:
            raise ConfigError("memory_budget_mb must be at least 8")
        if self.commit_interval_s <= 0:
            raise ConfigError("commit_interval_s must be positive")
        if self.commit_max_rows < 1:
            raise ConfigError("commit_max_rows must be at least 1")
        if self.flow_control_window_kb < 16:
            raise ConfigError("flow_control_window_kb must be at least 16")
        if not 1 <= self.noop_interval_s <= 3600:
            raise ConfigError("noop_interval_s must be between 1 and 3600")
        if self.backfill_order not in BACKFILL_ORDERS:
            raise ConfigError(
                f"backfill_order must be one of {', '.join(BACKFILL_ORDERS)}, "
                f"not {self.backfill_order!r}"
            )
        if self.first_load_writer not in FIRST_LOAD_WRITERS:
            raise ConfigError(
                f"first_load_writer must be one of {', '.join(FIRST_LOAD_WRITERS)}, "
                f"not {self.first_load_writer!r}"
            )
        if self.steady_writer not in STEADY_WRITERS:
            raise ConfigError(
                f"steady_writer must be one of {', '.join(STEADY_WRITERS)}, "
                f"not {self.steady_writer!r}"
            )
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError("metrics_port must be between 1 and 65535 (0: no endpoint)")
        if self.source_check_interval_s <= 0:
            raise ConfigError("source_check_interval_s must be positive")
        if self.metrics_log_s < 0:
            raise ConfigError("metrics_log_s must not be negative (0: no metrics log lines)")
        if self.progress not in ("auto", "bar", "lines", "off"):
            raise ConfigError("progress must be one of auto, bar, lines, off")
        if self.sasl_mechanism is not None:
            # One spelling per mechanism for every reader; frozen, hence object.__setattr__.
            object.__setattr__(self, "sasl_mechanism", _sasl_mechanism_name(self.sasl_mechanism))

    def require_source_and_target(self) -> None:
        if not self.source:
            raise ConfigError("no source: pass --source couchbase://HOST/BUCKET (or set source)")
        if not self.target:
            raise ConfigError("no target: pass --target PATH (or set target)")

    def resolved_password(self) -> Secret:
        """The password from the environment or the password file."""
        if self.password is not None:
            return self.password
        if self.password_file:
            try:
                text = Path(self.password_file).expanduser().read_text().strip()
            except OSError as exc:
                raise ConfigError(
                    f"cannot read password_file {self.password_file}: {exc.strerror}"
                ) from None
            return Secret(text)
        raise ConfigError(
            "no password: set REPLICATOR_PASSWORD or REPLICATOR_PASSWORD_FILE "
            "(passwords are never taken from flags)"
        )


_FIELDS = {f.name: f for f in fields(ReplicatorConfig)}
_SECRET_KEYS = {"password"}


def _coerce(name: str, raw: Any) -> Any:
    """Turn a TOML, environment or flag value into the field's type, or fail naming the key."""
    if name == "password":
        return raw if isinstance(raw, Secret) else Secret(str(raw))
    if name == "vbuckets":
        return raw if isinstance(raw, VbucketSelection) else VbucketSelection.parse(str(raw))
    default = _FIELDS[name].default
    try:
        if isinstance(default, bool):
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"invalid value for {name}: {raw!r}") from None
    return str(raw)


def _sasl_mechanism_name(raw: str) -> str | None:
    """The canonical name (`SCRAM-SHA512`) of what the user wrote; None for an empty value."""
    if not raw.strip():
        return None  # an empty value means "not set", as for the other settings
    try:
        return parse_sasl_mechanism(raw).value
    except ValueError as exc:
        raise ConfigError(
            f"invalid sasl_mechanism (--sasl-mechanism): {exc}; use one of "
            f"{SASL_MECHANISM_NAMES} (any case, SCRAM-SHA-512 spellings too), or leave it unset "
            "for the strongest SCRAM the server offers"
        ) from None


def load_config(
    *,
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> ReplicatorConfig:
    """Merge defaults, the TOML file, the environment and flags (later wins).

    Flags whose value is None are treated as not given.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}

    config_file = config_file or env.get(ENV_PREFIX + "CONFIG") or None
    if config_file:
        try:
            with open(config_file, "rb") as handle:
                document = tomllib.load(handle)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_file} is not valid TOML: {exc}") from None
        section = document.get("replicator", document)
        for key, raw in section.items():
            if key not in _FIELDS:
                raise ConfigError(f"unknown setting {key!r} in {config_file}")
            if key in _SECRET_KEYS:
                raise ConfigError(
                    f"{config_file}: put the password in REPLICATOR_PASSWORD or password_file, "
                    "not in the config file"
                )
            values[key] = _coerce(key, raw)

    for name in _FIELDS:
        raw_env = env.get(ENV_PREFIX + name.upper())
        if raw_env is not None and raw_env != "":
            values[name] = _coerce(name, raw_env)

    for name, raw in (flags or {}).items():
        if raw is None:
            continue
        if name not in _FIELDS:
            raise ConfigError(f"unknown setting {name!r}")
        if name in _SECRET_KEYS:
            raise ConfigError("passwords are never taken from flags: set REPLICATOR_PASSWORD")
        values[name] = _coerce(name, raw)

    return dataclasses.replace(ReplicatorConfig(), **values)
