"""The simulator's documented examples run: cluster.py's docstrings and docs/simulator.md."""

from __future__ import annotations

import doctest
from pathlib import Path

import replicator.sim.cluster as cluster_module

SIMULATOR_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"


def test_cluster_docstring_examples_run() -> None:
    outcome = doctest.testmod(cluster_module)
    assert outcome.attempted >= 4 and outcome.failed == 0


def test_simulator_guide_examples_run() -> None:
    outcome = doctest.testfile(str(SIMULATOR_GUIDE), module_relative=False)
    assert outcome.attempted >= 5 and outcome.failed == 0
