"""One SparkSession per test run (built by replicator.spark, as jobs and notebooks do)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from replicator.spark import build_session

    session = build_session("replicator-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    path = SHARED / "vectors"
    if not path.is_dir():
        pytest.fail(f"golden vectors not found at {path}: shared/ must sit beside the repo")
    return path
