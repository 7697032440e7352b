"""The simulator guide's examples run (docs/simulator.md; its modules' are in test_doctests)."""

from __future__ import annotations

import doctest
from pathlib import Path

SIMULATOR_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"


def test_simulator_guide_examples_run() -> None:
    outcome = doctest.testfile(str(SIMULATOR_GUIDE), module_relative=False)
    assert outcome.attempted >= 5 and outcome.failed == 0
