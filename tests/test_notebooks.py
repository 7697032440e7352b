"""Both notebooks run top to bottom, and their assertions hold (issue 10).

The analyst tour runs without MIRROR_PATH, so its first cell builds the sample mirror with the
embedded producer (into a temporary directory); the audit notebook then reads that mirror through
MIRROR_PATH, the way a user points it at the demo's table. Each kernel is this interpreter
(`sys.executable`), so no installed kernel spec is needed: a fresh CI virtualenv works.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
CELL_TIMEOUT_S = 900
"""Per cell: building the sample mirror replicates three times."""

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(2 * CELL_TIMEOUT_S)]


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


def execute(name: str) -> nbformat.NotebookNode:
    """Run a notebook from the repository root; a failing cell raises CellExecutionError."""
    notebook = read(NOTEBOOKS / name)
    client = NotebookClient(
        notebook,
        km=ThisInterpreterKernelManager(),
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


@pytest.fixture
def kernel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    # A kernel must start its own Spark driver, never attach to this process's JVM.
    for name in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "MIRROR_PATH"):
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


def test_committed_notebooks_have_no_outputs() -> None:
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        notebook = read(path)
        nbformat.validate(notebook)
        code = [cell for cell in notebook.cells if cell.cell_type == "code"]
        assert code, f"{path.name} has no code"
        assert all(not cell.outputs and cell.execution_count is None for cell in code), path.name


def test_both_notebooks_run_on_a_sample_mirror_and_then_on_a_given_path(
    kernel_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    kernel_env.setenv("SAMPLE_MIRROR_DIR", str(tmp_path))

    tour = execute("01_analyst_tour.ipynb")

    mirror = tmp_path / "mirror"
    assert (mirror / "_delta_log").is_dir(), "the tour did not build its sample mirror"
    assert f"reading the mirror at {mirror}" in text_output(tour)
    assert images(tour) >= 1

    kernel_env.setenv("MIRROR_PATH", str(mirror))
    kernel_env.delenv("SAMPLE_MIRROR_DIR")
    audit = execute("02_time_travel_audit.ipynb")

    output = text_output(audit)
    assert "was rewound from seqno" in output  # the sample's failover, explained
    assert "document versions above seqno" in output
    assert images(audit) >= 1
