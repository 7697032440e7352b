"""Every docstring example in the package runs: examples are documentation, so they must be true.

Modules are found by their text (any `>>>`), so a new module's examples run without a list to
keep. An example that needs a live Spark session, cluster or broker carries `# doctest: +SKIP`;
the others run here, none of them starting a JVM.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

import replicator

PACKAGE = Path(replicator.__file__).resolve().parent


def modules_with_examples() -> list[str]:
    """Dotted names of the package's modules whose source holds a `>>>`."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>>" not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_the_package_has_examples_to_run() -> None:
    assert len(modules_with_examples()) > 30


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    tests = [test for test in doctest.DocTestFinder().find(module) if test.examples]
    # A `>>>` doctest cannot find (in a comment, or a nested function's docstring) never runs.
    assert tests, f"{name} has a '>>>' but no example doctest finds"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
