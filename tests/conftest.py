"""One SparkSession per test run (built by replicator.spark, as jobs and notebooks do)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.golden_vectors import VECTORS


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from replicator.spark import build_session

    session = build_session("replicator-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    """shared/vectors; its tests skip, naming the path, like every golden-vector test."""
    if not VECTORS.is_dir():
        pytest.skip(f"no vectors at {VECTORS}: shared/ must sit beside the repository")
    return VECTORS
