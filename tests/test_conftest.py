"""The suite's own ordering: a renamed or deleted module must not silently drop out of it."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONGEST_FIRST

REPO = Path(__file__).resolve().parents[1]


def test_every_longest_first_module_exists_once() -> None:
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    missing = [module for module in LONGEST_FIRST if not (REPO / module).is_file()]
    assert missing == []
