"""Where the runner puts spill files, checked before anything starts."""

from __future__ import annotations

import pytest

from replicator.config import ReplicatorConfig
from replicator.errors import ConfigError
from replicator.pipeline.runner import staging_dir_for


def config(target: str, staging_dir: str | None = None) -> ReplicatorConfig:
    return ReplicatorConfig(
        source="couchbase://127.0.0.1/travel", target=target, staging_dir=staging_dir
    )


def test_spill_files_go_beside_a_local_target_by_default() -> None:
    assert staging_dir_for(config("/data/travel/"), "vb0-3") == (
        "/data/travel/_replicator/staging/vb0-3"
    )
    # A file:// target is a local path too; its spill files must not land in a "file:" dir.
    assert staging_dir_for(config("file:///data/travel"), "vb0-3") == (
        "/data/travel/_replicator/staging/vb0-3"
    )


def test_an_explicit_staging_dir_wins_and_is_per_owner() -> None:
    chosen = staging_dir_for(config("s3a://bucket/travel", "/mnt/shared/spill"), "vb0-511")
    assert chosen == "/mnt/shared/spill/vb0-511"


def test_an_object_store_target_needs_a_staging_dir() -> None:
    with pytest.raises(ConfigError, match=r"s3a://.*set staging_dir \(--staging-dir\)"):
        staging_dir_for(config("s3a://bucket/travel"), "vb0-3")
