"""A private RabbitMQ broker on this host, for the tests, the demo and the benchmark.

Over 500 lines on purpose: it is one concern, a private node's life (finding the installation,
its files and environment, start, stop, control), whose parts share the node's ports,
directories and identity; stopping processes and reading logs are in replicator.runtime.processes.

`LocalBroker` runs Debian's `rabbitmq-server` (3.10; `apt-get install -y rabbitmq-server`) as a
child process with everything of its own, so that it neither meets nor disturbs a system broker
(the Debian package may start one on 5672 with node `rabbit@HOST`) or another `LocalBroker`:

- a unique node name (`replicator-PID-XXXXXX@localhost`) and a random Erlang cookie in a HOME
  of its own;
- free ports on 127.0.0.1 for AMQP, Erlang distribution and epmd (its own epmd: the system's on
  4369 is left alone), nothing listening beyond loopback;
- its data (mnesia), logs, config, enabled-plugins (none) and env files under one directory, a
  temporary one removed at `stop()` unless one was given;
- a user and vhost of its own with a random password, made at first boot from `default_user`
  and `default_vhost` in its config file (guest is not created).

`start()` returns once the broker accepts AMQP connections with those credentials (polled, with
a deadline). `stop()` asks the node to stop (SIGTERM, which RabbitMQ handles as a clean
shutdown), then ends its epmd, then any process still carrying this broker's id in its
environment (Erlang's port helpers), so nothing of it is left running. Should the Python process
die without `stop()`, the broker follows: the node runs an Erlang shell on a pipe from this
process (`RABBITMQ_ALLOW_INPUT`), and the end of that pipe halts it; its epmd watches a pipe too.

>>> with LocalBroker() as broker:  # doctest: +SKIP
...     with TransactionPublisher(broker.source("transactions")) as publisher:
...         publisher.publish_all(Workload(WorkloadSettings(seed=1)).serialized(50))
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import string
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

from replicator.drizzle.amqp.connection import ConnectionSettings, check_source
from replicator.drizzle.amqp.errors import AmqpError
from replicator.drizzle.amqp.source import AmqpSource
from replicator.errors import ReplicatorError
from replicator.runtime.processes import end_process_group, log_tail, one_line
from replicator.runtime.standalone import free_port

log = logging.getLogger(__name__)

INSTALL_COMMAND = "apt-get install -y rabbitmq-server"
"""The one command that installs what `LocalBroker` runs (as root, on Debian or Ubuntu)."""

DEBIAN_SCRIPTS = Path("/usr/lib/rabbitmq/bin")
"""Where Debian's package keeps the real scripts. /usr/sbin/rabbitmq-server is a wrapper that
switches to the `rabbitmq` user and its system directories, so it cannot run a private node."""

_ID_VARIABLE = "REPLICATOR_BROKER_ID"
"""Set in the broker's environment: every process it starts inherits it, which is how `stop()`
finds the helpers that left its process group."""

_POLL_S = 0.2


class RabbitMQNotInstalled(ReplicatorError):
    """rabbitmq-server (or Erlang's epmd) is not on this machine."""


class BrokerError(ReplicatorError):
    """The broker did not start, did not stop, or a command against it failed; the message says
    which, with the end of its log."""


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """What kind of broker to start.

    `server_script`: the real `rabbitmq-server` script (found by `find_rabbitmq_server` when
    None). `work_dir`: where the broker keeps its data, logs and config; None means a temporary
    directory under `base_dir` (the system's temporary directory when None), removed at stop.
    """

    vhost: str = "drizzle"
    username: str = "replicator"
    start_timeout_s: float = 120.0
    stop_timeout_s: float = 30.0
    server_script: Path | None = None
    work_dir: Path | None = None
    base_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.vhost or not self.username:
            raise ValueError("a broker needs a vhost and a user name")
        for name in (self.vhost, self.username):
            # They go into the broker's config file as bare values.
            if not set(name) <= set(string.ascii_letters + string.digits + "-_."):
                raise ValueError(f"{name!r}: use letters, digits, '-', '_' and '.' only")
        if self.start_timeout_s <= 0 or self.stop_timeout_s <= 0:
            raise ValueError("the broker's start and stop timeouts must be positive")


def find_rabbitmq_server(explicit: Path | None = None) -> Path:
    """The `rabbitmq-server` script to run: `explicit`, Debian's, or one on PATH that is the
    real script (a generic-unix RabbitMQ's sbin/). Raises RabbitMQNotInstalled."""
    if explicit is not None:
        if not os.access(explicit, os.X_OK):
            raise RabbitMQNotInstalled(f"{explicit} is not an executable rabbitmq-server script")
        return explicit
    candidates = [DEBIAN_SCRIPTS / "rabbitmq-server"]
    on_path = shutil.which("rabbitmq-server")
    if on_path is not None:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if os.access(candidate, os.X_OK) and candidate.resolve().name == "rabbitmq-server":
            return candidate
    raise RabbitMQNotInstalled(
        f"rabbitmq-server is not installed (looked in {DEBIAN_SCRIPTS} and on PATH): install "
        f"it with `{INSTALL_COMMAND}` (as root); `make setup` does so where it can"
    )


def _find_epmd(server_script: Path) -> Path:
    found = shutil.which("epmd") or shutil.which("epmd", path="/usr/lib/erlang/bin")
    if found is None:
        raise RabbitMQNotInstalled(
            f"Erlang's epmd is not on PATH, though {server_script} is there: the Erlang runtime "
            f"is incomplete; reinstall it with `{INSTALL_COMMAND}`"
        )
    return Path(found)


# epmd in the foreground under a shell that ends it when its stdin closes: at stop(), or when
# this process dies without stopping it.
_EPMD_WATCH = 'epmd="$1"; shift; "$epmd" "$@" & pid=$!; cat >/dev/null; kill "$pid"; wait "$pid"'


class LocalBroker:
    """A RabbitMQ node of its own, on free loopback ports (see the module's docstring)."""

    host = "127.0.0.1"

    def __init__(self, settings: BrokerSettings | None = None) -> None:
        self.settings = settings or BrokerSettings()
        self.broker_id = f"{os.getpid()}-{secrets.token_hex(3)}"
        self.node_name = f"replicator-{self.broker_id}@localhost"
        self._password = secrets.token_hex(16)
        self.port = 0
        self.dist_port = 0
        self.epmd_port = 0
        self.work_dir: Path | None = None
        self._owns_work_dir = False
        self._server: subprocess.Popen[bytes] | None = None
        self._epmd: subprocess.Popen[bytes] | None = None
        self._outputs: list[IO[bytes]] = []
        self._last_probe_error = ""
        self._script = Path()
        self._epmd_path = Path()

    # What clients need.

    @property
    def vhost(self) -> str:
        return self.settings.vhost

    @property
    def username(self) -> str:
        return self.settings.username

    @property
    def password(self) -> str:
        """The broker user's password (random for each broker). Never log it."""
        return self._password

    def source(self, queue: str) -> AmqpSource:
        """A queue on this broker, with its credentials."""
        self._require_started()
        return AmqpSource(
            host=self.host,
            queue=queue,
            port=self.port,
            vhost=self.vhost,
            username=self.username,
            password=self._password,
        )

    @property
    def log_path(self) -> Path:
        """The node's own log file."""
        return self._dir("log") / f"{self.node_name}.log"

    @property
    def running(self) -> bool:
        return self._server is not None and self._server.poll() is None

    # Starting and stopping.

    def start(self) -> LocalBroker:
        """Start the node; return once it accepts AMQP connections. Raises RabbitMQNotInstalled
        or BrokerError (with the end of the node's log), leaving nothing running but the work
        directory, for its logs."""
        if self._server is not None:
            raise BrokerError(f"broker {self.node_name} was started already")
        self._script = find_rabbitmq_server(self.settings.server_script)
        self._epmd_path = _find_epmd(self._script)
        self._make_work_dir()
        self.port, self.dist_port, self.epmd_port = (free_port() for _ in range(3))
        self._write_files()
        self._boot()
        return self

    def restart(self) -> LocalBroker:
        """Stop the node cleanly and start it again: same node, ports, user and data, so
        durable queues and their persistent messages are still there; connections are not."""
        self._require_started()
        self._halt()
        self._boot()
        return self

    def stop(self) -> None:
        """Stop the node cleanly (SIGKILL after `stop_timeout_s`), then its epmd and any helper
        left; remove the work directory if it was a temporary one. Safe to call again."""
        try:
            self._halt()
        finally:
            if self._owns_work_dir and self.work_dir is not None:
                shutil.rmtree(self.work_dir, ignore_errors=True)
                self.work_dir = None
                self._owns_work_dir = False
            self.port = 0

    def _boot(self) -> None:
        environment = self._environment()
        started = time.monotonic()
        watch = ["sh", "-c", _EPMD_WATCH, "sh", str(self._epmd_path)]
        try:
            self._epmd = self._launch(
                [*watch, "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                environment,
                "epmd.out",
            )
            self._wait_for(self._epmd_listens, "epmd to listen", processes=(self._epmd,))
            self._server = self._launch([str(self._script)], environment, "server.out")
            self._wait_for(self._accepts_amqp, "AMQP connections", processes=(self._server,))
        except BaseException:
            # Nothing left running; the work directory stays for the logs the error names
            # (stop() removes a temporary one).
            self._halt()
            raise
        log.info(
            "RabbitMQ node %s accepts AMQP on %s:%d (vhost %s, user %s) after %.1fs",
            self.node_name,
            self.host,
            self.port,
            self.vhost,
            self.username,
            time.monotonic() - started,
        )

    def _halt(self) -> None:
        server, self._server = self._server, None
        epmd, self._epmd = self._epmd, None
        try:
            if server is not None:
                end_process_group(
                    server, self.settings.stop_timeout_s, first=signal.SIGTERM, whole_group=False
                )
            if epmd is not None:
                # Closing its stdin ends the watching shell, which ends epmd.
                with contextlib.suppress(OSError):
                    if epmd.stdin is not None:
                        epmd.stdin.close()
                end_process_group(epmd, self.settings.stop_timeout_s, first=None)
            self._end_strays()
        finally:
            for output in self._outputs:
                output.close()
            self._outputs.clear()

    def leftover_processes(self) -> list[int]:
        """Processes of this broker still running (none after `stop()`)."""
        return broker_processes(self.broker_id)

    def close_connections(self, reason: str = "closed on purpose") -> None:
        """Have the broker close every client connection, in every vhost (as an operator or a
        failing node would): consumers' unacknowledged deliveries go back to their queues."""
        self.rabbitmqctl("close_all_connections", "--global", reason)

    def rabbitmqctl(self, *arguments: str, timeout_s: float = 60.0) -> str:
        """Run `rabbitmqctl` against this node; return what it printed."""
        self._require_started()
        script = find_rabbitmq_server(self.settings.server_script).parent / "rabbitmqctl"
        environment = self._environment()
        # The CLI is an Erlang node too: give it a free distribution port of its own, so that
        # two brokers' commands never collide on RabbitMQ's default 35672-35682.
        ctl_port = str(free_port())
        environment["RABBITMQ_CTL_DIST_PORT_MIN"] = environment["RABBITMQ_CTL_DIST_PORT_MAX"] = (
            ctl_port
        )
        command = [str(script), "--node", self.node_name, *arguments]
        try:
            result = subprocess.run(
                command,
                env=environment,
                cwd=self.work_dir,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BrokerError(
                f"rabbitmqctl {' '.join(arguments)} against {self.node_name} did not finish in "
                f"{timeout_s:.0f}s; the node's log: {self.log_path}"
            ) from None
        output = result.stdout.decode(errors="replace")
        if result.returncode != 0:
            error = result.stderr.decode(errors="replace").strip() or output.strip()
            raise BrokerError(
                f"rabbitmqctl {' '.join(arguments)} against {self.node_name} failed with exit "
                f"code {result.returncode}: {one_line(error)}"
            )
        return output

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # The parts.

    def _make_work_dir(self) -> None:
        if self.settings.work_dir is not None:
            self.work_dir = self.settings.work_dir
            self.work_dir.mkdir(parents=True, exist_ok=True)
        else:
            base = self.settings.base_dir
            if base is not None:
                base.mkdir(parents=True, exist_ok=True)
            self.work_dir = Path(tempfile.mkdtemp(prefix="rabbitmq-", dir=base))
            self._owns_work_dir = True
        for name in ("home", "mnesia", "log"):
            self._dir(name).mkdir(mode=0o700, exist_ok=True)

    def _dir(self, name: str) -> Path:
        if self.work_dir is None:
            raise BrokerError(f"broker {self.node_name} has not been started")
        return self.work_dir / name

    def _write_files(self) -> None:
        config = "\n".join(
            [
                f"listeners.tcp.default = {self.host}:{self.port}",
                f"default_vhost = {self.vhost}",
                f"default_user = {self.username}",
                f"default_pass = {self._password}",
                "default_permissions.configure = .*",
                "default_permissions.read = .*",
                "default_permissions.write = .*",
                # The node's log file (log_path) is what a failed start's error quotes.
                "log.file.level = info",
                "",
            ]
        )
        _write_private(self._dir("rabbitmq.conf"), config)
        _write_private(self._dir("enabled_plugins"), "[].\n")
        # Empty: /etc/rabbitmq/rabbitmq-env.conf must not change this node's settings.
        _write_private(self._dir("rabbitmq-env.conf"), "")
        cookie = "".join(secrets.choice(string.ascii_uppercase) for _ in range(32))
        _write_private(self._dir("home") / ".erlang.cookie", cookie, mode=0o400)

    def _environment(self) -> dict[str, str]:
        # Nothing of a RabbitMQ or epmd configured for this shell reaches the private node.
        environment = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("RABBITMQ_", "ERL_EPMD_"))
        }
        environment.setdefault("LANG", "C.UTF-8")
        environment.update(
            {
                _ID_VARIABLE: self.broker_id,
                "HOME": str(self._dir("home")),
                "RABBITMQ_NODENAME": self.node_name,
                "RABBITMQ_NODE_IP_ADDRESS": self.host,
                "RABBITMQ_NODE_PORT": str(self.port),
                "RABBITMQ_DIST_PORT": str(self.dist_port),
                "ERL_EPMD_PORT": str(self.epmd_port),
                "ERL_EPMD_ADDRESS": "127.0.0.1",
                "RABBITMQ_MNESIA_BASE": str(self._dir("mnesia")),
                "RABBITMQ_LOG_BASE": str(self._dir("log")),
                "RABBITMQ_CONFIG_FILE": str(self._dir("rabbitmq.conf")),
                "RABBITMQ_ADVANCED_CONFIG_FILE": str(self._dir("advanced.config")),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(self._dir("enabled_plugins")),
                "RABBITMQ_CONF_ENV_FILE": str(self._dir("rabbitmq-env.conf")),
                # An Erlang shell on a pipe from this process: if it dies, the node halts.
                "RABBITMQ_ALLOW_INPUT": "true",
                # Distribution on loopback only, and no epmd of the node's own: ours runs.
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                    "-kernel inet_dist_use_interface {127,0,0,1} -start_epmd false"
                ),
                "RABBITMQ_CTL_ERL_ARGS": "-start_epmd false",
            }
        )
        return environment

    def _launch(
        self, command: list[str], environment: dict[str, str], output_name: str
    ) -> subprocess.Popen[bytes]:
        output = self._dir(output_name).open("ab")
        self._outputs.append(output)
        return subprocess.Popen(
            command,
            env=environment,
            cwd=self.work_dir,
            stdin=subprocess.PIPE,  # never written: its end tells the process this one is gone
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # away from the terminal's Ctrl-C; stop() ends it
        )

    def _epmd_listens(self) -> bool:
        return _listens(self.epmd_port)

    def _accepts_amqp(self) -> bool:
        # A plain TCP probe first: pika logs every refused attempt as an error.
        if not _listens(self.port):
            return False
        try:
            check_source(
                self.source("readiness-probe"),
                settings=ConnectionSettings(connect_timeout_s=5.0),
                queue=False,
            )
        except AmqpError as error:
            # Refused until the listener opens, late in the boot; anything else after the
            # deadline is reported with the last error.
            self._last_probe_error = str(error)
            return False
        return True

    def _wait_for(
        self,
        condition: Callable[[], bool],
        what: str,
        *,
        processes: tuple[subprocess.Popen[bytes], ...],
    ) -> None:
        timeout = self.settings.start_timeout_s
        deadline = time.monotonic() + timeout
        self._last_probe_error = ""
        while not condition():
            for process in processes:
                if process.poll() is not None:
                    raise BrokerError(
                        f"RabbitMQ node {self.node_name} exited with code {process.returncode} "
                        f"while waiting for {what}: {self._log_tail()}"
                    )
            if time.monotonic() > deadline:
                last = f" (last: {self._last_probe_error})" if self._last_probe_error else ""
                raise BrokerError(
                    f"RabbitMQ node {self.node_name} did not accept {what} within "
                    f"{timeout:.0f}s{last}: {self._log_tail()}"
                )
            time.sleep(_POLL_S)

    def _end_strays(self) -> None:
        # Erlang's port helpers (erl_child_setup, inet_gethost, the disk monitor's shell) start
        # sessions of their own and exit once the node is gone; wait for that, then end any
        # that did not.
        deadline = time.monotonic() + self.settings.stop_timeout_s
        while (left := self.leftover_processes()) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if left:
            log.warning("RabbitMQ node %s: killed %d leftover processes", self.node_name, len(left))

    def _log_tail(self) -> str:
        parts = []
        for path in (self.log_path, self._dir("server.out"), self._dir("epmd.out")):
            # The node never logs the password; scrubbed all the same, as errors carry this.
            text = log_tail(path).replace(self._password, "***")
            if text:
                parts.append(f"{path}: {text}")
        return " | ".join(parts) or f"no log in {self.work_dir}"

    def _require_started(self) -> None:
        if self._server is None or self.port == 0:
            raise BrokerError(f"broker {self.node_name} is not running: start() it first")


def _listens(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def broker_processes(broker_id: str) -> list[int]:
    """Processes of the broker `broker_id` (a `LocalBroker.broker_id`) still running: those
    carrying it in their environment, which every process the broker starts inherits."""
    marker = f"{_ID_VARIABLE}={broker_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if marker in environment.split(b"\0"):
            found.append(int(entry.name))
    return found


def _write_private(path: Path, text: str, *, mode: int = 0o600) -> None:
    # The config holds the broker user's password, the cookie gives control of the node.
    with contextlib.suppress(FileNotFoundError):
        path.chmod(0o600)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
    path.chmod(mode)


__all__ = [
    "INSTALL_COMMAND",
    "BrokerError",
    "BrokerSettings",
    "LocalBroker",
    "RabbitMQNotInstalled",
    "broker_processes",
    "find_rabbitmq_server",
    "free_port",
]
