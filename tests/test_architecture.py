"""The package's shape: imports run one way, no import cycle, no module too long unexplained.

Read from the source with `ast` (no module is imported), so a new module is checked as soon as
it exists. docs/architecture.md draws the same rules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "replicator"

LONG_MODULE_LINES = 500
"""About where a module holds more than one concern; a longer one says why at its top."""

FORBIDDEN: dict[str, tuple[str, ...]] = {
    # The shared vocabulary imports nothing of the pipeline.
    "replicator.model": ("replicator.dcp", "replicator.staging", "replicator.planning",
                         "replicator.delta", "replicator.pipeline", "replicator.inspect",
                         "replicator.cli", "replicator.runtime", "replicator.sim",
                         "replicator.drizzle"),
    "replicator.errors": ("replicator.dcp", "replicator.staging", "replicator.planning",
                          "replicator.delta", "replicator.pipeline", "replicator.inspect",
                          "replicator.cli", "replicator.sim"),
    # The wire knows nothing of what is done with it.
    "replicator.dcp": ("replicator.staging", "replicator.planning", "replicator.delta",
                       "replicator.pipeline", "replicator.inspect", "replicator.cli",
                       "replicator.runtime", "replicator.sim", "replicator.drizzle"),
    "replicator.dcp.protocol": ("replicator.dcp.transport", "replicator.dcp.cluster"),
    "replicator.dcp.transport": ("replicator.dcp.cluster",),
    # Staging comes before planning, planning before Delta; none of them opens a socket.
    "replicator.staging": ("replicator.planning", "replicator.delta", "replicator.pipeline",
                           "replicator.inspect", "replicator.cli", "replicator.dcp.transport",
                           "replicator.dcp.cluster", "replicator.runtime"),
    "replicator.planning": ("replicator.delta", "replicator.pipeline", "replicator.inspect",
                            "replicator.cli", "replicator.dcp.transport",
                            "replicator.dcp.cluster", "replicator.runtime"),
    "replicator.delta": ("replicator.pipeline", "replicator.inspect", "replicator.cli",
                         "replicator.dcp.transport", "replicator.dcp.cluster",
                         "replicator.sim"),
    "replicator.pipeline": ("replicator.inspect", "replicator.cli"),
    "replicator.inspect": ("replicator.pipeline", "replicator.cli"),
    "replicator.runtime": ("replicator.dcp", "replicator.staging", "replicator.planning",
                           "replicator.delta", "replicator.pipeline", "replicator.inspect",
                           "replicator.cli", "replicator.sim", "replicator.drizzle"),
    # The embedded producer is a stand-in for Couchbase Server: it shares only the wire.
    "replicator.sim": ("replicator.staging", "replicator.planning", "replicator.delta",
                       "replicator.pipeline", "replicator.inspect", "replicator.cli",
                       "replicator.drizzle"),
}
"""Package prefix -> packages it must not import (the most specific prefix's rule applies too)."""

TOOLS = ("replicator.bench", "replicator.soak", "replicator.cli")
"""Benchmarks, the crash soak and the command line sit on top: nothing else imports them."""


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> Iterator[Import]:
    """Every `replicator` module the file imports, wherever the import statement is."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import module` imports the module; `from module import name` the module.
            targets = [
                f"{node.module}.{alias.name}"
                if f"{node.module}.{alias.name}" in known else node.module
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target.startswith("replicator"):
                yield Import(name, target, node.lineno)


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def all_imports() -> list[Import]:
    found = modules()
    known = set(found)
    return [edge for name, path in found.items() for edge in imports_of(name, path, known)]


def test_imports_run_one_way() -> None:
    wrong = []
    for edge in all_imports():
        for package, forbidden in FORBIDDEN.items():
            if under(edge.importer, package):
                wrong += [
                    f"{edge.importer}:{edge.line} imports {edge.imported}"
                    for banned in forbidden if under(edge.imported, banned)
                ]
        if not any(under(edge.importer, tool) for tool in TOOLS):
            wrong += [
                f"{edge.importer}:{edge.line} imports the tool {edge.imported}"
                for tool in TOOLS if under(edge.imported, tool)
            ]
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(set(wrong)))


def test_no_import_cycle() -> None:
    """Between modules, counting every import (type-only and function-local ones too)."""
    graph: dict[str, set[str]] = {}
    for edge in all_imports():
        if edge.imported != edge.importer and not under(edge.importer, edge.imported):
            graph.setdefault(edge.importer, set()).add(edge.imported)
    cycles = []
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("name", sorted(modules()))
def test_long_modules_say_why(name: str) -> None:
    path = modules()[name]
    lines = path.read_text().count("\n")
    if lines <= LONG_MODULE_LINES or "_pb2" in name:
        return
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert "500 lines" in docstring, (
        f"{path.relative_to(PACKAGE.parent)} has {lines} lines: split it along its seams, or "
        f"say in its docstring why it is over 500 lines"
    )


def test_the_checks_see_a_wrong_import(tmp_path: Path) -> None:
    """The rule table is read as meant: a protocol module importing Delta would be caught."""
    module = tmp_path / "bad.py"
    module.write_text("from replicator.delta.table import MirrorTable\n")
    edges = list(imports_of("replicator.dcp.protocol.bad", module, set(modules())))
    assert [edge.imported for edge in edges] == ["replicator.delta.table"]
    assert any(
        under(edges[0].imported, banned) for banned in FORBIDDEN["replicator.dcp"]
    )


def test_the_public_surface_resolves_and_is_documented() -> None:
    import importlib
    import inspect

    import replicator

    for name in replicator.__all__:
        value = getattr(replicator, name)
        module = importlib.import_module(value.__module__)
        assert getattr(module, name) is value, name
        assert inspect.getdoc(value), f"replicator.{name} has no docstring"
    assert sorted(replicator.__all__) == sorted(replicator._HOME_OF)
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = replicator.nothing_here  # type: ignore[attr-defined]
