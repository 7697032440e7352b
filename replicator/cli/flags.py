"""Command-line flags more than one command takes."""

from __future__ import annotations

import argparse
from typing import Any


def add_engine_flag(parser: argparse.ArgumentParser, *, default: Any = None) -> None:
    """`--engine`: which implementation reads the mirror (delta-rs needs no JVM)."""
    parser.add_argument(
        "--engine", choices=("delta-rs", "spark"), default=default,
        help="read the mirror with delta-rs (default: no JVM, answers in a second) or Spark",
    )
