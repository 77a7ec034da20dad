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


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(name: str) -> set[str]:
    """The package modules `name` imports (outside TYPE_CHECKING blocks)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
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
                    found.add(sub if sub in MODULES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(name)
    return {m for m in found if m in MODULES}


GRAPH = {name: imports(name) for name in MODULES}


def test_the_import_graph_has_no_circles() -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            walk(name, [name])
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_nothing_below_the_cli_imports_the_cli() -> None:
    cli = f"{PACKAGE}.cli"
    offenders = {
        name: sorted(m for m in deps if m == cli or m.startswith(cli + "."))
        for name, deps in GRAPH.items()
        if not (name == cli or name.startswith(cli + ".") or name == f"{PACKAGE}.__main__")
    }
    assert not {n: d for n, d in offenders.items() if d}


def test_the_graph_sees_the_imports() -> None:
    """The walk reads real edges (a walk that found none could not fail)."""
    assert f"{PACKAGE}.generation.decoder" in GRAPH[f"{PACKAGE}.generation.loop"]
    assert f"{PACKAGE}.cli.flags" in GRAPH[f"{PACKAGE}.cli.generate"]
    assert f"{PACKAGE}.processors" in GRAPH[f"{PACKAGE}.generation.decoder"]
