"""The reference for measurement 2: Couchbase's own Java DCP client draining the same producer.

`jobs/java-drain` is a small program on `com.couchbase.client:dcp-client` (Maven Central),
outside the package. The benchmark builds it with Maven when Java and Maven are present and
runs it in its own JVM beside the Python drain; without them it says why it could not.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from replicator.dcp.transport.auth import Credentials
from replicator.dcp.transport.flow_control import DEFAULT_WINDOW_BYTES
from replicator.errors import ReplicatorError

REFERENCE_CLIENT = "java-dcp-client 0.56.0"
"""The client and version `jobs/java-drain/pom.xml` builds against."""

SOURCE_DIR = Path(__file__).resolve().parents[2] / "jobs" / "java-drain"
PASSWORD_ENV = "REPLICATOR_BENCH_PASSWORD"
_MAIN_CLASS = "replicator.bench.JavaDrain"


class ReferenceUnavailable(ReplicatorError):
    """The reference client cannot run here (no Java or Maven, or its build failed)."""


class DocumentRates:
    """Documents per wall and per CPU second, for a drain result that counts both."""

    __slots__ = ()
    documents: int
    seconds: float
    cpu_seconds: float

    @property
    def documents_per_second(self) -> float:
        return self.documents / self.seconds

    @property
    def documents_per_cpu_second(self) -> float:
        return self.documents / self.cpu_seconds


@dataclass(frozen=True, slots=True)
class ReferenceDrain(DocumentRates):
    """What the Java client received draining every vbucket from 0 to its high seqno.

    `seconds` and `cpu_seconds` run from the start of streaming to the last stream end (the
    JVM's start and the handshake are not counted); `cpu_seconds` is the whole JVM's.
    """

    client: str
    messages: int
    documents: int
    bytes: int
    seconds: float
    cpu_seconds: float


def build_reference_client(source_dir: Path = SOURCE_DIR, *, timeout_s: float = 900.0) -> str:
    """Compile the reference client (Maven fetches its jars once); returns its class path.

    Raises ReferenceUnavailable naming what is missing or what failed.
    """
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            raise ReferenceUnavailable(f"no `{tool}` on PATH: install a JDK 17+ and Maven")
    if not (source_dir / "pom.xml").is_file():
        raise ReferenceUnavailable(f"its sources are not at {source_dir} (run from a clone)")
    target = source_dir / "target"
    target.mkdir(exist_ok=True)
    # One build at a time (two test workers may ask at once); none when nothing changed.
    with open(target / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _up_to_date(source_dir, target):
            _maven_build(source_dir, target, timeout_s)
    return os.pathsep.join((str(target / "classes"), str(target / "lib" / "*")))


def _maven_build(source_dir: Path, target: Path, timeout_s: float) -> None:
    command = [
        "mvn", "-q", "-B", "-f", str(source_dir / "pom.xml"),
        "compile", "dependency:copy-dependencies", f"-DoutputDirectory={target / 'lib'}",
    ]  # fmt: skip
    try:
        built = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise ReferenceUnavailable(f"its Maven build took over {timeout_s:.0f} s") from None
    if built.returncode != 0:
        errors = [line for line in built.stdout.splitlines() if "ERROR" in line][:3]
        raise ReferenceUnavailable(
            f"its Maven build failed (exit {built.returncode}): " + " / ".join(errors)
        )


def _up_to_date(source_dir: Path, target: Path) -> bool:
    """Whether the compiled class is newer than the pom and every source, jars in place."""
    built = target / "classes" / Path(*_MAIN_CLASS.split(".")).with_suffix(".class")
    if not built.is_file() or not any((target / "lib").glob("dcp-client-*.jar")):
        return False
    sources = [source_dir / "pom.xml", *(source_dir / "src").rglob("*.java")]
    return built.stat().st_mtime >= max(path.stat().st_mtime for path in sources)


def measure_reference_drain(
    class_path: str,
    connection_string: str,
    credentials: Credentials,
    *,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    timeout_s: float = 900.0,
) -> ReferenceDrain:
    """Drain every vbucket of the producer at `connection_string` with the Java client.

    The same flow-control window as `DcpClient`'s, snappy and collections on; the password
    reaches the JVM through its environment, never its command line. Raises ReferenceUnavailable
    when the drain fails or is incomplete.
    """
    seeds, bucket = seed_nodes(connection_string)
    command = [
        "java", "-cp", class_path, _MAIN_CLASS, seeds, bucket, credentials.username,
        str(window_bytes), str(int(timeout_s)),
    ]  # fmt: skip
    environment = {**os.environ, PASSWORD_ENV: credentials.password}
    try:
        ran = subprocess.run(
            command, capture_output=True, text=True, env=environment, timeout=timeout_s + 120,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ReferenceUnavailable(f"the Java drain ran over {timeout_s + 120:.0f} s") from None
    return parse_reference_output(ran.stdout, ran.returncode, ran.stderr)


def parse_reference_output(stdout: str, returncode: int, stderr: str = "") -> ReferenceDrain:
    """The Java drain's JSON line as a ReferenceDrain; ReferenceUnavailable when it failed."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = " / ".join(stderr.strip().splitlines()[-2:]) or "no output"
        raise ReferenceUnavailable(f"the Java drain exited {returncode} without a result: {tail}")
    try:
        result = json.loads(lines[-1])
        if result.get("error"):
            raise ReferenceUnavailable(f"the Java drain failed: {result['error']}")
        return ReferenceDrain(
            client=REFERENCE_CLIENT,
            messages=int(result["messages"]),
            documents=int(result["documents"]),
            bytes=int(result["bytes"]),
            seconds=float(result["seconds"]),
            cpu_seconds=float(result["cpu_seconds"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ReferenceUnavailable(f"the Java drain printed an unreadable result: {exc}") from None


def seed_nodes(connection_string: str) -> tuple[str, str]:
    """("host:port,...", bucket) of a `couchbase://host:port/bucket` connection string."""
    parts = urlsplit(connection_string)
    bucket = parts.path.strip("/")
    if parts.scheme != "couchbase" or not parts.netloc or not bucket:
        raise ValueError(f"expected couchbase://host:port/bucket, got {connection_string!r}")
    return parts.netloc, bucket
