"""One SparkSession per test run (built by replicator.runtime.spark, as jobs and notebooks do)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from replicator.runtime.spark import SMALL_DATA_CONF
from tests.golden_vectors import VECTORS

LONGEST_FIRST = (
    "tests/test_crash_loop.py",
    "tests/test_faults_e2e.py",
    "tests/drizzle/test_mirror_e2e.py",
    "tests/inspect/test_audit.py",
    "tests/test_rollback_scenarios.py",
    "tests/cli/test_end_to_end.py",
    "tests/test_notebooks.py",
    "tests/bench/test_bench_smoke.py",
    "tests/test_exactly_once.py",
    "tests/test_rollback_e2e.py",
    "tests/test_never_silent.py",
    "tests/test_quiet_run.py",
    "tests/test_readme.py",
    "tests/cli/test_clean_stop.py",
    "tests/cli/test_metrics.py",
    "tests/delta/test_recovery.py",
    "tests/runtime/test_standalone_cluster.py",
    "tests/pipeline/test_replication.py",
)
"""Modules taking a minute or more of a worker, longest first (measured): `make test` hands
modules out in collection order, so the long ones start early and the short ones even out the
end. xdist's default order (most tests first) would leave a long module of few tests for last."""


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from replicator.runtime.spark import build_session

    # Planned as the tests' short-lived drivers are (small data: no generated code, no adaptive
    # re-planning), which took 7% off a run of the fault and rollback modules; the spark-submit
    # tests keep Spark's defaults.
    session = build_session("replicator-tests", conf=SMALL_DATA_CONF)
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
    rank = {module: index for index, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
