"""The Delta jars: located from the cache or the override, with one clear message when missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from replicator.errors import DeltaJarsMissing
from replicator.runtime.jars import DELTA_ARTIFACTS, OVERRIDE_ENV, locate_delta_jars
from replicator.runtime.spark import build_session


def test_override_pointing_at_wrong_path_names_jars_and_override(tmp_path: Path) -> None:
    env = {OVERRIDE_ENV: str(tmp_path / "nowhere" / "delta-spark.jar")}
    with pytest.raises(DeltaJarsMissing) as caught:
        locate_delta_jars(env)
    message = str(caught.value)
    for artifact in DELTA_ARTIFACTS:
        assert artifact in message
    assert OVERRIDE_ENV in message
    assert "make jars" in message


def test_empty_cache_is_reported_with_its_path(tmp_path: Path) -> None:
    env = {"REPLICATOR_JAR_CACHE": str(tmp_path / "empty-cache")}
    with pytest.raises(DeltaJarsMissing, match="empty-cache"):
        locate_delta_jars(env)


def test_override_with_real_files_is_used(tmp_path: Path) -> None:
    jars = [tmp_path / "a.jar", tmp_path / "b.jar"]
    for jar in jars:
        jar.write_bytes(b"PK")
    location = locate_delta_jars({OVERRIDE_ENV: ",".join(str(j) for j in jars)})
    assert location.paths == tuple(jars)


def test_session_builder_fails_before_starting_a_jvm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OVERRIDE_ENV, str(tmp_path / "missing.jar"))
    with pytest.raises(DeltaJarsMissing, match=OVERRIDE_ENV):
        build_session("never-started", master="local[1]")


def test_locate_command_prints_one_line_without_traceback(tmp_path: Path) -> None:
    env = dict(os.environ, **{OVERRIDE_ENV: str(tmp_path / "gone.jar")})
    result = subprocess.run(
        [sys.executable, "-m", "replicator.runtime.jars", "locate"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "io.delta:delta-spark_2.13:4.0.1" in result.stderr


def run_jars_command(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "replicator.runtime.jars", *args],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )


def test_fetch_with_the_override_set_checks_it_instead_of_downloading(tmp_path: Path) -> None:
    jars = [tmp_path / "a.jar", tmp_path / "b.jar"]
    for jar in jars:
        jar.write_bytes(b"PK")
    # No Maven on PATH and an empty cache: a download attempt would fail.
    env = dict(os.environ, PATH="/nonexistent", REPLICATOR_JAR_CACHE=str(tmp_path / "cache"),
               **{OVERRIDE_ENV: ",".join(str(j) for j in jars)})
    result = run_jars_command("fetch", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(j) for j in jars]
    assert not (tmp_path / "cache").exists()

    env[OVERRIDE_ENV] = str(tmp_path / "gone.jar")
    refused = run_jars_command("fetch", env=env)
    assert refused.returncode == 2
    assert "Traceback" not in refused.stderr and OVERRIDE_ENV in refused.stderr


def test_fetch_without_maven_names_maven_and_the_override(tmp_path: Path) -> None:
    env = dict(os.environ, PATH="/nonexistent", REPLICATOR_JAR_CACHE=str(tmp_path / "cache"))
    env.pop(OVERRIDE_ENV, None)
    result = run_jars_command("fetch", env=env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "mvn" in result.stderr and OVERRIDE_ENV in result.stderr
