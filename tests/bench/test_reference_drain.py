"""The drain's reference: Couchbase's Java DCP client on the same producer, and the goals on it.

The side-by-side test builds `jobs/java-drain` with Maven (its jars come from Maven Central once)
and drains an embedded producer over real TCP with both clients; it skips only where Java or
Maven is missing. Speeds are never asserted: only that both drained every document.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from replicator.bench.drain import DrainResult, measure_drain_side_by_side
from replicator.bench.goals import evaluate_goals
from replicator.bench.reference_drain import (
    REFERENCE_CLIENT,
    SOURCE_DIR,
    ReferenceDrain,
    ReferenceUnavailable,
    build_reference_client,
    parse_reference_output,
    seed_nodes,
)
from replicator.dcp.transport.auth import Credentials
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import DEFAULT_PASSWORD, DEFAULT_USERNAME, SimCluster
from replicator.sim.workload import initial_load

CREDENTIALS = Credentials(DEFAULT_USERNAME, DEFAULT_PASSWORD)
DOCS = 600


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    bucket = SimBucket("reference", num_vbuckets=32, seed=3)
    initial_load(bucket, DOCS, 512, seed=3)  # four collections in two scopes
    with SimCluster(bucket, nodes=2) as running:
        yield running


def test_both_clients_drain_every_document_of_the_same_producer(cluster: SimCluster) -> None:
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("the reference client needs java and mvn on PATH")
    result = measure_drain_side_by_side(
        cluster.connection_string, CREDENTIALS, expected_documents=DOCS, rounds=1
    )
    assert result.reference_unavailable is None
    assert result.reference is not None and result.reference.client == REFERENCE_CLIENT
    assert result.documents == result.reference.documents == DOCS
    assert result.reference.seconds > 0 and result.reference.cpu_seconds > 0
    # Keys and bodies: the Java client saw the bodies decompressed, as DcpClient does.
    assert result.reference.bytes > DOCS * 512
    # Built once: asking again with nothing changed leaves the compiled class alone.
    compiled = SOURCE_DIR / "target" / "classes" / "replicator" / "bench" / "JavaDrain.class"
    before = compiled.stat().st_mtime_ns
    build_reference_client()
    assert compiled.stat().st_mtime_ns == before


def test_without_the_reference_the_drain_stands_alone_and_says_why(cluster: SimCluster) -> None:
    def unavailable() -> str:
        raise ReferenceUnavailable("no `mvn` on PATH: install a JDK 17+ and Maven")

    result = measure_drain_side_by_side(
        cluster.connection_string, CREDENTIALS, expected_documents=DOCS, rounds=2,
        build_reference=unavailable,
    )  # fmt: skip
    assert (result.rounds, result.documents, result.reference) == (2, 2 * DOCS, None)
    assert result.reference_unavailable == "not run: no `mvn` on PATH: install a JDK 17+ and Maven"
    goals = evaluate_goals(drain=result, load_ratio=None, steady=(), memory=None, rollback=None)
    drain_goals = [g for g in goals if "Java DCP client" in g.goal]
    assert [g.verdict for g in drain_goals] == ["NOT RUN", "NOT RUN"]
    assert all("no `mvn` on PATH" in g.measured for g in drain_goals)


def test_missing_reference_sources_are_named(tmp_path: object) -> None:
    if shutil.which("java") is None or shutil.which("mvn") is None:
        pytest.skip("needs java and mvn on PATH")
    with pytest.raises(ReferenceUnavailable, match="sources are not at"):
        build_reference_client(tmp_path)  # type: ignore[arg-type]


def test_the_java_drains_output_is_read_or_refused_with_its_reason() -> None:
    line = (
        '{"messages": 1100, "documents": 1000, "bytes": 1040000, "seconds": 0.5, '
        '"cpu_seconds": 0.25, "error": null}'
    )
    parsed = parse_reference_output("SLF4J: noise\n" + line + "\n", 0)
    assert parsed == ReferenceDrain(REFERENCE_CLIENT, 1100, 1000, 1_040_000, 0.5, 0.25)
    assert (parsed.documents_per_second, parsed.documents_per_cpu_second) == (2000.0, 4000.0)
    failed = line.replace('"error": null', '"error": "vbucket 3 ended LOST_PRIVILEGES"')
    with pytest.raises(ReferenceUnavailable, match="vbucket 3 ended LOST_PRIVILEGES"):
        parse_reference_output(failed, 1)
    with pytest.raises(ReferenceUnavailable, match="exited 1 without a result: at x / Exception"):
        parse_reference_output("", 1, "at x\nException: boom")
    with pytest.raises(ReferenceUnavailable, match="unreadable result"):
        parse_reference_output('{"messages": 1}', 0)


def test_seed_nodes_come_from_the_connection_string() -> None:
    assert seed_nodes("couchbase://127.0.0.1:1210,127.0.0.1:1211/travel") == (
        "127.0.0.1:1210,127.0.0.1:1211",
        "travel",
    )
    with pytest.raises(ValueError, match="couchbase://host:port/bucket"):
        seed_nodes("couchbase://127.0.0.1:1210")


def _drain(seconds: float, cpu_seconds: float, reference: ReferenceDrain | None) -> DrainResult:
    return DrainResult(
        messages=1_100_000, documents=1_000_000, bytes=10**9, seconds=seconds,
        cpu_seconds=cpu_seconds, messages_per_second=1_100_000 / seconds,
        megabytes_per_second=1e3 / seconds, codec_messages_per_cpu_second=300_000.0,
        rounds=2, reference=reference,
    )  # fmt: skip


def test_drain_goals_compare_documents_per_second_and_cpu_per_document_with_java() -> None:
    java = ReferenceDrain(REFERENCE_CLIENT, 1_100_000, 1_000_000, 10**9, 10.0, 5.0)

    def verdicts(drain: DrainResult) -> list[tuple[str, str]]:
        goals = evaluate_goals(drain=drain, load_ratio=None, steady=(), memory=None, rollback=None)
        return [(g.verdict, g.measured) for g in goals if "Java DCP client" in g.goal]

    # As fast on the wall clock, twice the CPU: both goals met, just.
    assert verdicts(_drain(10.0, 10.0, java)) == [
        ("PASS", "1.00x: 100,000 against 100,000 documents/s"),
        ("PASS", "2.00x: 10.0 against 5.0 CPU us per document"),
    ]
    assert verdicts(_drain(12.5, 10.5, java)) == [
        ("MISS", "0.80x: 80,000 against 100,000 documents/s"),
        ("MISS", "2.10x: 10.5 against 5.0 CPU us per document"),
    ]
