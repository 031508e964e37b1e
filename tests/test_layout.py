"""The layout rules, checked on the import graph of the project's own packages (``agent_rl``, ``envs``, ``servers``).

Every ``import`` and ``from ... import`` counts, at module level and inside functions alike (an import inside a
function still runs, later); imports under ``if TYPE_CHECKING:`` do not (they never run). A ``from pkg import name``
is an edge to ``pkg.name`` when that is a module, else to ``pkg`` (the package's ``__init__``); importing
``pkg.sub.mod`` from outside ``pkg.sub`` is an edge to ``pkg.sub`` too (its ``__init__`` runs first). Rules:

- no import cycles among ``agent_rl`` modules (a cycle hidden behind a function-level import is still a cycle: the
  modules cannot be understood, tested or moved one at a time);
- an ``agent_rl`` module imports a project module inside a function only to defer an optional heavy dependency
  (ray, vllm, peft), with a ``# deferred: ...`` comment on that line;
- data flows one way: ``envs/`` imports nothing of ``agent_rl/`` or ``servers/``; ``servers/`` imports nothing of
  ``agent_rl/``.

The graph is built by :func:`import_graph` (``ast`` only: nothing is imported), so the test also runs where an
optional dependency is missing; a synthetic package shows that a cycle, including one behind a function-level
import, is found, and that a ``TYPE_CHECKING`` import is not counted.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent_rl", "envs", "servers")


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> tuple[dict[str, set[str]], list[tuple]]:
    """The import graph of the modules of ``packages`` under ``root``.

    Returns:
        ``(edges, function_level)``: ``edges[m]`` the project modules ``m`` imports (module or function level,
        ``TYPE_CHECKING`` excluded); ``function_level`` one ``(module, line, targets)`` per import statement of a
        project module inside a function.
    """
    files = {_module_name(root, p): p for pkg in packages if (root / pkg).is_dir()
             for p in (root / pkg).rglob("*.py")}

    def resolve(dotted: str) -> str | None:
        parts = dotted.split(".")
        while parts:
            if ".".join(parts) in files:
                return ".".join(parts)
            parts.pop()
        return None

    edges: dict[str, set[str]] = {m: set() for m in files}
    function_level: list[tuple] = []
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]

        def targets(node: ast.Import | ast.ImportFrom) -> set[str]:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from .x import y
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" for a in node.names]
            found = {t for t in map(resolve, names) if t is not None and t != module}
            # importing pkg.sub.mod from outside pkg.sub runs pkg.sub/__init__ first (and pkg/__init__ from outside
            # pkg): an edge to each such package
            for t in list(found):
                parts = t.split(".")
                for depth in range(1, len(parts)):
                    parent = ".".join(parts[:depth])
                    if parent in files and not (module == parent or module.startswith(parent + ".")):
                        found.add(parent)
            return found

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child.test):
                    for stmt in child.orelse:  # the body never runs
                        visit_one(stmt, in_function)
                    continue
                visit_one(child, in_function)

        def visit_one(node: ast.AST, in_function: bool) -> None:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found = targets(node)
                edges[module] |= found
                if in_function and found:
                    function_level.append((module, node.lineno, sorted(found)))
            visit(node, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), False)
    return edges, function_level


def import_cycles(edges: dict[str, set[str]], prefix: str = "") -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), restricted to modules starting with
    ``prefix``; each sorted, the list sorted. Empty: no cycle."""
    nodes = [m for m in edges if m.startswith(prefix)]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(v: str) -> None:  # recursive: the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if not w.startswith(prefix):
                continue
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in nodes:
        if v not in index:
            strongconnect(v)
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, set[str]], list[tuple]]:
    return import_graph(ROOT)


def test_no_import_cycles_in_agent_rl(graph):
    edges, _ = graph
    assert import_cycles(edges, "agent_rl") == []


def test_function_level_imports_of_project_modules_only_defer_an_optional_heavy_dependency(graph):
    """An import of a project module inside a function hides an edge of the graph; it is there only to defer an
    optional heavy dependency (ray, vllm, peft), and says so on its line (``# deferred: ...``)."""
    _, function_level = graph
    unexplained = []
    for module, line, targets in function_level:
        if not module.startswith("agent_rl"):
            continue
        path = ROOT / (module.replace(".", "/") + ".py")
        if not path.is_file():
            path = ROOT / module.replace(".", "/") / "__init__.py"
        text = path.read_text(encoding="utf-8").splitlines()[line - 1]
        if "# deferred:" not in text:
            unexplained.append(f"{module}:{line} imports {', '.join(targets)}")
    assert unexplained == []


def test_envs_import_nothing_of_agent_rl_or_servers(graph):
    edges, _ = graph
    bad = sorted((m, t) for m, ts in edges.items() if m.split(".")[0] == "envs" for t in ts
                 if t.split(".")[0] in ("agent_rl", "servers"))
    assert bad == []


def test_servers_import_nothing_of_agent_rl(graph):
    edges, _ = graph
    bad = sorted((m, t) for m, ts in edges.items() if m.split(".")[0] == "servers" for t in ts
                 if t.split(".")[0] == "agent_rl")
    assert bad == []


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_a_cycle_behind_a_function_level_import_is_found_and_type_checking_imports_are_not(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        # a imports b at module level; b imports a inside a function: a cycle
        "pkg/a.py": "from pkg.b import helper\n",
        "pkg/b.py": """
            def helper():
                from pkg import a  # hidden, but it runs

                return a
            """,
        # c imports d only for type checking, d imports c: no cycle
        "pkg/c.py": """
            from typing import TYPE_CHECKING

            if TYPE_CHECKING:
                from pkg.d import D
            """,
        "pkg/d.py": "from pkg.c import TYPE_CHECKING as D\n",
        # relative imports resolve too: e <-> f
        "pkg/sub/__init__.py": "",
        "pkg/sub/e.py": "from . import f\n",
        "pkg/sub/f.py": "from .e import x\n",
        # importing pkg.p.y from outside pkg.p runs pkg/p/__init__, which imports x, which imports q: a cycle
        # through the package's __init__ (a sibling inside pkg.p importing pkg.p.y would not run it again)
        "pkg/q.py": "from pkg.p.y import Y\n",
        "pkg/p/__init__.py": "from pkg.p.x import X\n",
        "pkg/p/x.py": "import pkg.q\n",
        "pkg/p/y.py": "from pkg.p.x import X as Y\n",
    })
    edges, function_level = import_graph(tmp_path, ("pkg",))
    assert edges["pkg.b"] == {"pkg.a"} and edges["pkg.c"] == set() and edges["pkg.d"] == {"pkg.c"}
    assert edges["pkg.q"] == {"pkg.p", "pkg.p.y"} and edges["pkg.p.y"] == {"pkg.p.x"}
    assert function_level == [("pkg.b", 3, ["pkg.a"])]
    assert import_cycles(edges, "pkg") == [["pkg.a", "pkg.b"], ["pkg.p", "pkg.p.x", "pkg.p.y", "pkg.q"],
                                           ["pkg.sub.e", "pkg.sub.f"]]
    # the project's own check fails on such a graph: this is the assertion test_no_import_cycles_in_agent_rl makes
    with pytest.raises(AssertionError):
        assert import_cycles(edges, "pkg") == []
