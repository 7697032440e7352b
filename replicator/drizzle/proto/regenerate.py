"""Regenerate the `*_pb2.py` / `*_pb2.pyi` modules beside this file from its `.proto` files.

    python -m replicator.drizzle.proto.regenerate          # rewrite the generated modules
    python -m replicator.drizzle.proto.regenerate --check  # exit 1 if any is out of date

Needs protoc, from grpcio-tools (`pip install -e '.[proto]'`); nothing else does: the generated
modules are committed, so running the replicator needs only the protobuf runtime. Each
generated module records the SHA-256 of the `.proto` it came from, so a test can tell, without
protoc, that someone edited a `.proto` and did not regenerate.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
# Imports in the .proto files are spelled from the repository root
# ("replicator/drizzle/proto/table.proto") so that protoc writes package-relative Python
# imports (`from replicator.drizzle.proto import table_pb2`), which work when installed.
IMPORT_ROOT = PROTO_DIR.parents[2]
PROTO_FILES = ("engine.proto", "event.proto", "schema.proto", "table.proto", "transaction.proto")
SOURCE_HASH_PREFIX = "# replicator: generated from "


def source_hash(proto: Path) -> str:
    """SHA-256 (hex) of a .proto file's bytes, as recorded in the module generated from it."""
    return hashlib.sha256(proto.read_bytes()).hexdigest()


def recorded_hash(generated: Path) -> str | None:
    """The source hash a generated module records, or None if it records none."""
    for line in generated.read_text(encoding="utf-8").splitlines()[:10]:
        if line.startswith(SOURCE_HASH_PREFIX):
            return line.rsplit(" sha256=", 1)[-1].strip()
    return None


def stale_modules() -> list[str]:
    """Generated modules missing, or made from a .proto other than the one beside them now."""
    stale = []
    for name in PROTO_FILES:
        proto = PROTO_DIR / name
        for suffix in ("_pb2.py", "_pb2.pyi"):
            generated = PROTO_DIR / (proto.stem + suffix)
            if not generated.exists() or recorded_hash(generated) != source_hash(proto):
                stale.append(generated.name)
    return stale


def _header(proto: Path, suffix: str) -> str:
    # ruff and mypy's strictness are for code people write. mypy reads the stubs (.pyi), where
    # protoc writes bare `Mapping` in constructor signatures.
    lines = [
        f"{SOURCE_HASH_PREFIX}{proto.name} sha256={source_hash(proto)}",
        "# by `python -m replicator.drizzle.proto.regenerate`: do not edit.",
        "# ruff: noqa",
    ]
    if suffix == "_pb2.pyi":
        lines.append('# mypy: disable-error-code="type-arg"')
    return "\n".join(lines) + "\n"


def generate(out_dir: Path) -> list[Path]:
    """Run protoc over PROTO_FILES into out_dir (laid out like IMPORT_ROOT); return the files."""
    try:
        from grpc_tools import protoc  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError as error:
        raise SystemExit(
            "regenerating needs protoc from grpcio-tools: pip install -e '.[proto]'"
        ) from error
    include = Path(protoc.__file__).parent / "_proto"
    relative = [str((PROTO_DIR / name).relative_to(IMPORT_ROOT)) for name in PROTO_FILES]
    args = [
        "protoc",
        f"-I{IMPORT_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *relative,
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {', '.join(relative)} (its message is above)")
    written = []
    package_dir = out_dir / PROTO_DIR.relative_to(IMPORT_ROOT)
    for name in PROTO_FILES:
        proto = PROTO_DIR / name
        for suffix in ("_pb2.py", "_pb2.pyi"):
            path = package_dir / (proto.stem + suffix)
            body = path.read_text(encoding="utf-8")
            path.write_text(_header(proto, suffix) + body, encoding="utf-8")
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replicator.drizzle.proto.regenerate")
    parser.add_argument(
        "--check", action="store_true", help="only report modules that differ; change nothing"
    )
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        generated = generate(Path(scratch))
        differing = []
        for path in generated:
            target = PROTO_DIR / path.name
            fresh = path.read_text(encoding="utf-8")
            if not target.exists() or target.read_text(encoding="utf-8") != fresh:
                differing.append(target.name)
                if not options.check:
                    target.write_text(fresh, encoding="utf-8")
    if options.check:
        if differing:
            print(f"out of date: {', '.join(differing)}; run without --check", file=sys.stderr)
            return 1
        print("generated modules are up to date")
        return 0
    print(f"rewrote {', '.join(differing)}" if differing else "nothing to rewrite")
    return 0


if __name__ == "__main__":
    sys.exit(main())
