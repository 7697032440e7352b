"""Both notebooks run top to bottom, and their assertions hold (issue 10).

The sample mirror is built once, in this process, by the function the notebooks call when no
MIRROR_PATH is set (`replicator.cli.demo.build_sample_mirror`) on the session's warm Spark; both
notebooks then read it through MIRROR_PATH, the way a user points them at the demo's table, so no
kernel builds a mirror in a cold JVM. Both run in one kernel, one after the other, to start one
Spark driver instead of two; between them the kernel forgets everything the first defined (its
names, imports and temporary views), so the second cannot lean on the first. The kernel is this
interpreter (`sys.executable`), so no installed kernel spec is needed: a fresh CI virtualenv works.
"""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from replicator.cli.demo import DemoConsole, build_sample_mirror
from tests.cli import FAST_START_SUBMIT_ARGS

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
CELL_TIMEOUT_S = 300
"""Per cell: a kernel's first cell starts its own Spark driver; the others read a small mirror."""


class ThisInterpreterKernelManager(KernelManager):
    """Starts the kernel with the interpreter running the tests, whatever specs are installed."""

    @property
    def kernel_spec(self) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="replicator tests",
            language="python",
        )


def read(path: Path) -> nbformat.NotebookNode:
    notebook: nbformat.NotebookNode = nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]
    return notebook


FORGET_THE_FIRST_NOTEBOOK = """\
from pyspark.sql import SparkSession as _Session

_active = _Session.getActiveSession()
if _active is not None:
    for _table in _active.catalog.listTables():
        if _table.isTemporary:
            _active.catalog.dropTempView(_table.name)
%reset -f
"""
"""Run between the notebooks: as if the second one started in a fresh kernel, but for the JVM."""


def execute_in_one_kernel(*names: str) -> list[nbformat.NotebookNode]:
    """Run the notebooks one after another in one kernel; each comes back with its outputs."""
    combined = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
    spans = []
    for index, name in enumerate(names):
        if index:
            combined.cells.append(
                nbformat.v4.new_code_cell(FORGET_THE_FIRST_NOTEBOOK)  # type: ignore[no-untyped-call]
            )
        cells = read(NOTEBOOKS / name).cells
        spans.append((len(combined.cells), len(combined.cells) + len(cells)))
        combined.cells.extend(cells)
    execute(combined)
    notebooks = []
    for start, end in spans:
        notebook = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
        notebook.cells = combined.cells[start:end]
        notebooks.append(notebook)
    return notebooks


def execute(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Run a notebook from the repository root; a failing cell raises CellExecutionError."""
    # The client builds (so owns) its kernel manager, and shuts the kernel, with its Spark
    # driver, down at the end instead of leaving it running until the test process exits.
    client = NotebookClient(
        notebook,
        kernel_manager_class=ThisInterpreterKernelManager,
        timeout=CELL_TIMEOUT_S,
        allow_errors=False,
        resources={"metadata": {"path": str(REPO)}},
    )
    client.execute()
    return notebook


def text_output(notebook: nbformat.NotebookNode) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def images(notebook: nbformat.NotebookNode) -> int:
    return sum(
        1 for cell in notebook.cells for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
    )


@pytest.fixture(scope="module")
def sample_mirror(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The notebooks' sample mirror: a load, changes, then a failover that forces one rollback."""
    quiet = DemoConsole(io.StringIO())
    return Path(build_sample_mirror(spark, tmp_path_factory.mktemp("sample"), console=quiet))


@pytest.fixture
def kernel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    # A kernel must start its own Spark driver, never attach to this process's JVM.
    for name in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "MIRROR_PATH",
                 "SAMPLE_MIRROR_DIR"):
        monkeypatch.delenv(name, raising=False)
    # Its driver lives for a few queries: the tests' fast-start JIT and GC flags halve its CPU.
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", FAST_START_SUBMIT_ARGS)
    yield monkeypatch


def test_committed_notebooks_have_no_outputs() -> None:
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        notebook = read(path)
        nbformat.validate(notebook)
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        assert code, f"{path.name} has no code"
        assert all(not cell.outputs and cell.execution_count is None for cell in code), path.name


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(4 * CELL_TIMEOUT_S)  # building the mirror, then the two notebooks
def test_both_notebooks_run_on_the_sample_mirror(
    sample_mirror: Path, kernel_env: pytest.MonkeyPatch
) -> None:
    kernel_env.setenv("MIRROR_PATH", str(sample_mirror))

    tour, audit = execute_in_one_kernel("01_analyst_tour.ipynb", "02_time_travel_audit.ipynb")

    assert f"reading the mirror at {sample_mirror}" in text_output(tour)
    assert images(tour) >= 1
    output = text_output(audit)
    assert f"reading the mirror at {sample_mirror}" in output
    assert output.count("was rewound from seqno") == 1  # the sample's one failover, explained
    assert "document versions above seqno" in output
    # The diff of the busiest document: the producer stamps every write with a rising
    # `version` (its write serial), so an update must show it changed, upwards.
    stamps = re.findall(r"^  version: changed (\d+) -> (\d+)$", output, flags=re.MULTILINE)
    assert len(stamps) == 1, output
    assert int(stamps[0][0]) < int(stamps[0][1])
    assert images(audit) >= 1
