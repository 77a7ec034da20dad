"""The package's import graph: no circles, and nothing below the CLI imports the CLI.

Every `import` in every module counts, the ones inside functions too (a lazy
import is still a dependency), except those under `if TYPE_CHECKING:`
(annotations only). `from pkg import name` depends on pkg.name when that is
a module, else on pkg.
"""

from __future__ import annotations

import ast
from pathlib import Path

import specdec_rs

ROOT = Path(specdec_rs.__file__).parent
PACKAGE = "specdec_rs"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
# compiled modules (the Rust extension, known by its stub): leaves of the graph
EXTENSIONS = {module_name(p) for p in ROOT.rglob("*.pyi")} - set(MODULES)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(name: str, annotations: bool = False) -> set[str]:
    """The package modules `name` imports (outside TYPE_CHECKING blocks,
    or everywhere with `annotations`)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node) and not annotations:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            if base.split(".")[0] == PACKAGE:
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub not in EXTENSIONS:
                        found.add(sub if sub in MODULES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(name)
    return {m for m in found if m in MODULES}


GRAPH = {name: imports(name) for name in MODULES}
TYPED = {name: imports(name, annotations=True) for name in MODULES}  # TYPE_CHECKING too


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles a depth-first walk of `graph` meets."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    return found


def test_the_import_graph_has_no_circles() -> None:
    found = circles(GRAPH)
    assert not found, "\n".join(" -> ".join(c) for c in found)


def test_no_circles_through_annotations_either() -> None:
    found = circles(TYPED)
    assert not found, "\n".join(" -> ".join(c) for c in found)


def under(name: str, package: str) -> bool:
    full = f"{PACKAGE}.{package}"
    return name == full or name.startswith(full + ".")


def offenders(importer: str, imported: tuple[str, ...]) -> dict[str, list[str]]:
    """The modules under `importer` that import (annotations included) one under `imported`."""
    return {
        name: sorted(m for m in deps if any(under(m, p) for p in imported))
        for name, deps in TYPED.items()
        if under(name, importer) and any(under(m, p) for m in deps for p in imported)
    }


def test_the_policies_never_import_generation_or_the_engine() -> None:
    """A γ policy sees rounds, rows and a forward profile, never the loop that runs them."""
    assert not offenders("policy", ("generation", "engine"))


def test_the_runner_imports_none_of_the_parts_that_call_it() -> None:
    """Every target forward lives in `runner`, below the loop, the engine,
    the drafters, the policies and the server that run it."""
    assert not offenders("runner", ("generation", "engine", "drafters", "policy", "serve"))


def test_the_server_never_imports_measurement() -> None:
    assert not offenders("serve", ("measure",))


def test_only_the_cli_imports_training() -> None:
    found = {
        name: sorted(m for m in deps if under(m, "training"))
        for name, deps in TYPED.items()
        if not (under(name, "training") or under(name, "cli"))
    }
    assert not {n: d for n, d in found.items() if d}


def test_nothing_below_the_cli_imports_the_cli() -> None:
    cli = f"{PACKAGE}.cli"
    offenders = {
        name: sorted(m for m in deps if m == cli or m.startswith(cli + "."))
        for name, deps in GRAPH.items()
        if not (name == cli or name.startswith(cli + ".") or name == f"{PACKAGE}.__main__")
    }
    assert not {n: d for n, d in offenders.items() if d}


def test_the_graph_sees_the_imports() -> None:
    """The walk reads real edges (a walk that found none could not fail),
    the ones under TYPE_CHECKING in TYPED only, and finds a circle."""
    assert f"{PACKAGE}.generation.decoder" in TYPED[f"{PACKAGE}.engine.engine"]
    assert f"{PACKAGE}.engine.requests" in TYPED[f"{PACKAGE}.engine.scheduler"]
    assert f"{PACKAGE}.engine.requests" not in GRAPH[f"{PACKAGE}.engine.scheduler"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert f"{PACKAGE}._core" in EXTENSIONS
    assert offenders("engine", ("generation",))
    assert f"{PACKAGE}.generation.decoder" in GRAPH[f"{PACKAGE}.generation.loop"]
    assert f"{PACKAGE}.cli.flags" in GRAPH[f"{PACKAGE}.cli.generate"]
    assert f"{PACKAGE}.processors" in GRAPH[f"{PACKAGE}.generation.decoder"]
