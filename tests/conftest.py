"""One SparkSession per test run (built by replicator.spark, as jobs and notebooks do)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from replicator.soak.process import SMALL_DATA_SPARK_CONF
from tests.golden_vectors import VECTORS

LONGEST_FIRST = (
    "test_crash_loop.py",
    "test_faults_e2e.py",
    "test_audit.py",
    "test_rollback_scenarios.py",
    "cli/test_end_to_end.py",
    "test_notebooks.py",
    "bench/test_bench_smoke.py",
    "test_exactly_once.py",
    "test_rollback_e2e.py",
    "delta/test_recovery.py",
    "test_standalone_cluster.py",
    "test_replication.py",
)
"""Modules taking a minute or more of a worker, longest first (measured): `make test` hands
modules out in collection order, so the long ones start early and the short ones even out the
end. xdist's default order (most tests first) would leave a long module of few tests for last."""


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from replicator.spark import build_session

    # Planned as the tests' short-lived drivers are (small data: no generated code, no adaptive
    # re-planning), which took 7% off a run of the fault and rollback modules; the spark-submit
    # tests keep Spark's defaults.
    session = build_session("replicator-tests", conf=dict(SMALL_DATA_SPARK_CONF))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    """shared/vectors; its tests skip, naming the path, like every golden-vector test."""
    if not VECTORS.is_dir():
        pytest.skip(f"no vectors at {VECTORS}: shared/ must sit beside the repository")
    return VECTORS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """LONGEST_FIRST's modules first, in its order; the others keep theirs."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    tests = Path(__file__).parent
    items.sort(key=lambda item: rank.get(item.path.relative_to(tests).as_posix(), len(rank)))
