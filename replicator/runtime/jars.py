"""Where Delta Lake's jars come from: a local cache filled once from Maven Central, or an override.

No PyPI package ships Delta's jars. `make` fills the cache with Maven
(`python -m replicator.runtime.jars fetch`), so no test or job downloads anything mid-run;
air-gapped operators point `REPLICATOR_DELTA_JARS` at jar files they copied in.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from replicator.errors import DeltaJarsMissing

DELTA_VERSION = "4.0.1"
DELTA_ARTIFACTS = (
    f"io.delta:delta-spark_2.13:{DELTA_VERSION}",
    f"io.delta:delta-storage:{DELTA_VERSION}",
)
OVERRIDE_ENV = "REPLICATOR_DELTA_JARS"
CACHE_ENV = "REPLICATOR_JAR_CACHE"


@dataclass(frozen=True, slots=True)
class JarLocation:
    """The jar files a session will load, and where they were looked for."""

    paths: tuple[Path, ...]
    source: str


def jar_file_name(artifact: str) -> str:
    """`group:name:version` -> the file name Maven gives the jar (`name-version.jar`)."""
    _group, name, version = artifact.split(":")
    return f"{name}-{version}.jar"


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "replicator" / "jars"


def missing_jars_message(looked_in: str) -> str:
    names = ", ".join(DELTA_ARTIFACTS)
    return (
        f"Delta Lake jars not found ({names}); looked in {looked_in}. "
        f"Run `make jars` to fetch them from Maven Central into {default_cache_dir()}, "
        f"or set {OVERRIDE_ENV} to the comma-separated paths of the two jar files."
    )


def locate_delta_jars(env: Mapping[str, str] | None = None) -> JarLocation:
    """Find the Delta jars, from the override if set, else from the cache; raise if any is missing.

    >>> locate_delta_jars().paths  # doctest: +SKIP
    (PosixPath('.../delta-spark_2.13-4.0.1.jar'), PosixPath('.../delta-storage-4.0.1.jar'))
    """
    env = os.environ if env is None else env
    override = env.get(OVERRIDE_ENV, "").strip()
    if override:
        paths = tuple(Path(p.strip()).expanduser() for p in override.split(",") if p.strip())
        source = f"{OVERRIDE_ENV}={override}"
        missing = [p for p in paths if not p.is_file()]
        if not paths or missing:
            raise DeltaJarsMissing(missing_jars_message(source))
        return JarLocation(paths, source)
    cache = default_cache_dir(env)
    paths = tuple(cache / jar_file_name(a) for a in DELTA_ARTIFACTS)
    if not all(p.is_file() for p in paths):
        raise DeltaJarsMissing(missing_jars_message(str(cache)))
    return JarLocation(paths, str(cache))


def fetch_delta_jars(cache: Path | None = None) -> tuple[Path, ...]:
    """Copy the Delta jars from Maven Central into `cache` with Maven; a no-op when present."""
    cache = cache or default_cache_dir()
    wanted = [(a, cache / jar_file_name(a)) for a in DELTA_ARTIFACTS]
    if all(path.is_file() for _, path in wanted):
        return tuple(path for _, path in wanted)
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DeltaJarsMissing(
            "Maven (mvn) is needed to fetch Delta's jars and is not on PATH. Install it "
            f"(apt-get install maven) or set {OVERRIDE_ENV} to local copies of "
            + ", ".join(DELTA_ARTIFACTS)
        )
    cache.mkdir(parents=True, exist_ok=True)
    for artifact, path in wanted:
        if path.is_file():
            continue
        result = subprocess.run(
            [mvn, "-q", "-B", "dependency:copy", f"-Dartifact={artifact}",
             f"-DoutputDirectory={cache}"],
            capture_output=True, text=True, check=False,
        )
        if result.returncode != 0 or not path.is_file():
            tail = (result.stdout + result.stderr).strip().splitlines()[-3:]
            raise DeltaJarsMissing(
                f"could not fetch {artifact} with Maven: {' / '.join(tail) or 'no output'}. "
                f"Check network access to Maven Central, or set {OVERRIDE_ENV}."
            )
    return tuple(path for _, path in wanted)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        if args == ["fetch"]:
            # With the override set (air-gapped hosts) there is nothing to download: check it.
            overridden = bool(os.environ.get(OVERRIDE_ENV, "").strip())
            for path in locate_delta_jars().paths if overridden else fetch_delta_jars():
                print(path)
            return 0
        if args == ["locate"]:
            for path in locate_delta_jars().paths:
                print(path)
            return 0
    except DeltaJarsMissing as exc:
        print(f"replicator: {exc}", file=sys.stderr)
        return 2
    print("usage: python -m replicator.runtime.jars fetch|locate", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
