"""Fixtures of the Delta layer's tests: a mirror per module and an owner claim on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replicator.delta.ownership import OwnerClaim, OwnersTable
from replicator.delta.schema import MirrorConfig
from replicator.delta.table import MirrorTable, open_or_create

BUCKET = "travel"


@pytest.fixture(scope="module")
def mirror_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mirror") / "travel"


@pytest.fixture(scope="module")
def mirror(spark: Any, mirror_path: Path) -> MirrorTable:
    """One mirror per test module; tests keep to their own vbuckets so they stay independent.

    A bucket of 64 vbuckets: 16 partitions of 4 vbuckets each."""
    return open_or_create(spark, str(mirror_path), MirrorConfig(BUCKET, num_vbuckets=64))


@pytest.fixture(scope="module")
def owners(mirror: MirrorTable) -> OwnersTable:
    return OwnersTable.of(mirror)


@pytest.fixture(scope="module")
def claim(owners: OwnersTable) -> Iterator[OwnerClaim]:
    """This module's writer owns vbuckets 0-63."""
    granted = owners.claim(range(64), "module-writer")
    yield granted
    owners.release(granted)
