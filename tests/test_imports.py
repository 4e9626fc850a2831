"""The shape of the house: no import cycle, layers import only downwards, no oversized module.

The import graph is read statically (``ast``) from the source of every module
of ``persistkit`` and of the adapters (``adapters/persistkit_*``). Counted as
an edge from module A to module B:

* every ``import`` / ``from ... import`` statement anywhere in A: at the top,
  inside functions and methods, in ``try`` blocks and under ``if
  TYPE_CHECKING:``. A lazy import postpones a dependency, it does not remove
  it (the ``_errors`` <-> ``_redact`` cycle hid behind one), and a type-only
  import still makes the lower module know the upper one's names;
* relative imports resolved against A's package; ``from pkg import name``
  counts as an edge to ``pkg.name`` when that is a module, else to ``pkg``.

Not counted: the parent packages Python imports implicitly (every submodule
would otherwise depend on ``persistkit/__init__``, which re-exports the API
and therefore sits at the top), and anything outside persistkit and its
adapters (stdlib, drivers, frameworks).
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The house rule ("modules stay under about 800 lines") as a number. Not more: a
# looser bound (850) would have let _serde.py grow to 814 lines unnoticed, and the
# largest module is 730 lines, so a fix still fits; a module that reaches the bound
# is split along a seam then, not after the next layer landed in it.
MAX_LINES = 800


@dataclass(frozen=True)
class Edge:
    target: str
    line: int
    where: str  # "top level", "inside a function", "under TYPE_CHECKING"


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for persistkit and every adapter package under ``root``."""
    found: dict[str, Path] = {}
    packages = [(root, root / "persistkit")]
    packages += [(root / "adapters", p) for p in sorted((root / "adapters").glob("persistkit_*"))]
    for base, package in packages:
        for path in sorted(package.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(name: str, path: Path, known: dict[str, Path]) -> list[Edge]:
    """The edges from module ``name`` to other known modules (see the module docstring)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: list[Edge] = []

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1])
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module or ""
        return [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target in targets(node):
                if target in known and target != name:
                    edges.append(Edge(target, node.lineno, where))
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, "under TYPE_CHECKING")
            for child in node.orelse:
                visit(child, where)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            where = "inside a function"
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), "top level")
    return edges


def graph(root: Path) -> dict[str, list[Edge]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(g: dict[str, list[Edge]]) -> list[list[str]]:
    """One shortest cycle (first module repeated at the end) per strongly connected group."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan; the graph is a few dozen modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in g[v]:
            if e.target not in index:
                connect(e.target)
                low[v] = min(low[v], low[e.target])
            elif e.target in on_stack:
                low[v] = min(low[v], index[e.target])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(g):
        if v not in index:
            connect(v)
    found = []
    for group in groups:
        start = min(group)
        previous: dict[str, str] = {}
        queue = deque([start])
        while queue:  # breadth first from start back to start, inside the group
            v = queue.popleft()
            for e in g[v]:
                if e.target == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    found.append([*reversed(path), start])
                    queue.clear()
                    break
                if e.target in group and e.target not in previous:
                    previous[e.target] = v
                    queue.append(e.target)
    return found


def describe(cycle: list[str], g: dict[str, list[Edge]]) -> str:
    steps = []
    for a, b in pairwise(cycle):
        e = next(e for e in g[a] if e.target == b)
        steps.append(f"  {a} imports {b} (line {e.line}, {e.where})")
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


# -- the library ---------------------------------------------------------------------------

GRAPH = graph(ROOT)


def test_the_walk_sees_every_module() -> None:
    assert {"persistkit", "persistkit._errors", "persistkit.backends.sqlite", "persistkit.wrappers"} <= set(GRAPH)
    assert {
        "persistkit_langgraph", "persistkit_crewai", "persistkit_openai_agents", "persistkit_pydantic_ai"
    } <= set(GRAPH)
    assert any(e.target == "persistkit.engine._store" for e in GRAPH["persistkit.engine._api"])


def test_no_import_cycle() -> None:
    found = cycles(GRAPH)
    assert not found, (
        "import cycles (make the dependency run one way: move what both need into the "
        "lower module, or let the lower one accept a callable):\n"
        + "\n".join(describe(c, GRAPH) for c in found)
    )


def _allowed(target: str, allowed: tuple[str, ...]) -> bool:
    """``"x"`` allows module x; ``"x.*"`` allows x and every module under it."""
    return any(
        target == a.removesuffix(".*") or (a.endswith(".*") and target.startswith(a[:-1]))
        for a in allowed
    )


# -- the floors of the house (docs/architecture.md, Layers) -----------------------------------

# Lowest first. A module may import modules of its own floor and of the floors below it,
# never above. An entry names a module or a package (and everything under it);
# "persistkit" names the root package's __init__ alone.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("ground floor", ("persistkit._errors", "persistkit._ids")),
    ("backends", ("persistkit.backends",)),
    ("driver", ("persistkit._io", "persistkit._retry")),
    ("wrappers", ("persistkit.wrappers",)),
    ("secrets", ("persistkit.secrets",)),
    ("codec", ("persistkit.codec",)),
    ("state", ("persistkit.state",)),
    ("coordination", ("persistkit.coordination",)),
    ("blackboard", ("persistkit.blackboard",)),
    ("streams", ("persistkit.streams",)),
    ("ops", ("persistkit.ops",)),
    ("flow", ("persistkit.flow",)),
    ("engine", ("persistkit.engine",)),
    ("surface", ("persistkit", "persistkit.__main__", "persistkit._cli", "persistkit.testing")),
]

# The floors that may name a floor above them, each with why. Only under TYPE_CHECKING:
# a type in an annotation, never code run (the floor above calls down, handing itself over).
UPWARD: dict[tuple[str, str], str] = {
    ("coordination", "engine"): "coordination is handed the Run or Store that calls it",
}


def floor_of(name: str) -> int | None:
    """The index in FLOORS of the floor that holds module ``name`` (the longest entry wins)."""
    best: tuple[int, int] | None = None
    for i, (_, entries) in enumerate(FLOORS):
        for entry in entries:
            inside = name == entry or (entry != "persistkit" and name.startswith(entry + "."))
            if inside and (best is None or len(entry) > best[1]):
                best = (i, len(entry))
    return None if best is None else best[0]


def _ours(name: str) -> bool:
    return name == "persistkit" or name.startswith("persistkit.")


def test_every_module_is_on_a_floor() -> None:
    lost = sorted(n for n in GRAPH if _ours(n) and floor_of(n) is None)
    assert not lost, (
        "modules on no floor of tests/test_imports.py FLOORS: put each into the package of its "
        "concern (docs/architecture.md, Layers), or add its package to FLOORS and the diagram:\n"
        + "\n".join(lost)
    )


def upward_imports(g: dict[str, list[Edge]]) -> list[str]:
    bad = []
    for name, edges in sorted(g.items()):
        if not _ours(name):
            continue
        mine = floor_of(name)
        for e in edges:
            theirs = floor_of(e.target)
            if mine is None or theirs is None or theirs <= mine:
                continue
            if (FLOORS[mine][0], FLOORS[theirs][0]) in UPWARD and e.where == "under TYPE_CHECKING":
                continue
            bad.append(
                f"{name} (floor {FLOORS[mine][0]!r}) imports {e.target} (floor {FLOORS[theirs][0]!r}, "
                f"above it) at line {e.line}, {e.where}"
            )
    return bad


def test_a_floor_imports_only_its_own_and_the_floors_below() -> None:
    bad = upward_imports(GRAPH)
    assert not bad, (
        "imports up a floor (docs/architecture.md, Layers: move what both need down, or let the "
        "lower module accept a callable):\n" + "\n".join(bad)
    )


def test_every_upward_exception_is_still_needed() -> None:
    names = [f for f, _ in FLOORS]
    for (low, high), why in UPWARD.items():
        assert names.index(low) < names.index(high), (low, high)
        used = [
            (n, e.target)
            for n, edges in GRAPH.items()
            if _ours(n) and floor_of(n) == names.index(low)
            for e in edges
            if floor_of(e.target) == names.index(high)
        ]
        assert used, f"UPWARD lets {low} name {high} ({why}), but no module does any more: remove the entry"


def test_an_upward_import_is_named_with_its_line(tmp_path: Path) -> None:
    g = _package(
        tmp_path,
        {
            "persistkit/_errors.py": "",
            "persistkit/codec/__init__.py": "",
            "persistkit/codec/_serde.py": "def f():\n    from ..engine import _run\n",
            "persistkit/engine/__init__.py": "",
            "persistkit/engine/_run.py": "from ..codec import _serde\n",
        },
    )
    bad = upward_imports(g)
    assert bad == [
        "persistkit.codec._serde (floor 'codec') imports persistkit.engine._run (floor 'engine', above it) "
        "at line 2, inside a function"
    ]
    # an allowed pair of floors still may not run code above it: only a type, under TYPE_CHECKING
    g = _package(
        tmp_path / "allowed",
        {
            "persistkit/coordination/__init__.py": "",
            "persistkit/coordination/_a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..engine import _run\n",
            "persistkit/coordination/_b.py": "from ..engine import _run\n",
            "persistkit/engine/__init__.py": "",
            "persistkit/engine/_run.py": "",
        },
    )
    assert [b.split(" (")[0] for b in upward_imports(g)] == ["persistkit.coordination._b"]


# -- narrower rules for some floors --------------------------------------------------------


@pytest.mark.parametrize(
    ("layer", "allowed"),
    [
        # The error tree is the ground floor: every module raises its errors.
        ("persistkit._errors", ()),
        # Stores know only the error tree and each other: backends/ holds stores alone.
        ("persistkit.backends", ("persistkit._errors", "persistkit.backends.*")),
        # Wrappers stack on the store protocol; the runtime (Run, Store, api) is above them.
        (
            "persistkit.wrappers",
            ("persistkit._errors", "persistkit._io", "persistkit.backends.*", "persistkit.wrappers.*"),
        ),
        # Adapters are built on what a user can import (DESIGN.md, Layers), and their own modules.
        ("persistkit_langgraph", ("persistkit", "persistkit_langgraph.*")),
        ("persistkit_openai_agents", ("persistkit", "persistkit_openai_agents.*")),
        ("persistkit_crewai", ("persistkit", "persistkit_crewai.*")),
        # The pytest plugin: the crash matrix, imported only when a test asks for its fixture.
        ("persistkit_pytest", ("persistkit.testing.crash_matrix",)),
        ("persistkit_pydantic_ai", ("persistkit", "persistkit_pydantic_ai.*")),
    ],
)
def test_layers_import_only_downwards(layer: str, allowed: tuple[str, ...]) -> None:
    bad = [
        f"{name} imports {e.target} (line {e.line}, {e.where})"
        for name, edges in GRAPH.items()
        if name == layer or name.startswith(layer + ".")
        for e in edges
        if not _allowed(e.target, allowed)
    ]
    assert not bad, f"{layer} may import only {allowed or 'nothing of persistkit'}:\n" + "\n".join(bad)


@pytest.mark.parametrize("name", sorted(modules(ROOT)))
def test_no_module_is_oversized(name: str) -> None:
    path = modules(ROOT)[name]
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, (
        f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES}): split it along a "
        "seam into its own module (docs/design-source-map.md, Layout)"
    )


# -- docs/design-source-map.md's folder map is the tree -------------------------------------


def folder_map(text: str) -> dict[str, set[str]]:
    """Package (``persistkit/engine``) -> the ``.py`` names the map lists under it.

    The map is the code block of the Layout section that starts with ``persistkit/``; a
    line ``  name/`` opens a package (its depth is its indentation), every ``x.py`` on the
    deeper lines below belongs to it; words after ``(planned)`` on a line are not the tree.
    """
    section = text.split("\n## Layout", 1)[1]
    block = section.split("```\n", 2)[1]
    found: dict[str, set[str]] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        words = line.split("(planned)", 1)[0]
        if indent == 0 and not line.startswith("persistkit/"):
            break  # adapters/: another map
        while stack and stack[-1][0] >= indent:
            stack.pop()
        first = words.split()[0] if words.split() else ""
        if re.fullmatch(r"[a-z_]+/", first):
            path = (stack[-1][1] + "/" if stack else "") + first[:-1]
            stack.append((indent, path))
            found.setdefault(path, set())
            words = words[len(line) - len(line.lstrip()) + len(first):]
        if stack:
            found[stack[-1][1]].update(re.findall(r"\b[A-Za-z_0-9]+\.py\b", words))
    return found


def test_the_folder_map_lists_exactly_the_tree() -> None:
    listed = folder_map((ROOT / "docs" / "design-source-map.md").read_text(encoding="utf-8"))
    tree: dict[str, set[str]] = {}
    for path in sorted((ROOT / "persistkit").rglob("*.py")):
        tree.setdefault(path.parent.relative_to(ROOT).as_posix(), set()).add(path.name)
    problems = [f"{p}/ is not in the map" for p in sorted(tree.keys() - listed.keys())]
    problems += [f"{p}/ is in the map but not in the tree" for p in sorted(listed.keys() - tree.keys())]
    for p in sorted(tree.keys() & listed.keys()):
        problems += [f"{p}/{m} is not in the map" for m in sorted(tree[p] - listed[p])]
        problems += [f"{p}/{m} is in the map but not in the tree" for m in sorted(listed[p] - tree[p])]
    assert not problems, "docs/design-source-map.md's folder map (Layout) is not the tree:\n" + "\n".join(problems)


def test_the_folder_map_reader_nests_and_skips_what_is_planned() -> None:
    text = (
        "intro\n## Layout\n\n```\npersistkit/\n  __init__.py  x\n  a/   y.py z.py\n    b/  c.py (planned) d.py\n"
        "  (planned) e/   f.py\nadapters/x/  g.py\n```\n"
    )
    assert folder_map(text) == {"persistkit": {"__init__.py"}, "persistkit/a": {"y.py", "z.py"}, "persistkit/a/b": {"c.py"}}


# -- the walk itself finds what it must ------------------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, list[Edge]]:
    for rel, text in {"persistkit/__init__.py": "", **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    (tmp_path / "adapters").mkdir(exist_ok=True)
    return graph(tmp_path)


@pytest.mark.parametrize(
    ("back_edge", "where"),
    [
        ("from ._a import A\n", "top level"),
        ("def f():\n    from ._a import A\n", "inside a function"),
        ("class C:\n    async def m(self):\n        from . import _a\n", "inside a function"),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._a import A\n", "under TYPE_CHECKING"),
        ("import persistkit._a\n", "top level"),
    ],
)
def test_a_cycle_through_any_kind_of_import_is_found_and_named(tmp_path: Path, back_edge: str, where: str) -> None:
    g = _package(
        tmp_path,
        {
            "persistkit/_a.py": "from ._b import B\nA = 1\n",
            "persistkit/_b.py": back_edge + "B = 2\n",
            "persistkit/_c.py": "from ._a import A\n",
            "persistkit/sub/__init__.py": "from .._c import *\n",
        },
    )
    found = cycles(g)
    assert found == [["persistkit._a", "persistkit._b", "persistkit._a"]]
    text = describe(found[0], g)
    assert "persistkit._b imports persistkit._a" in text and where in text


def test_parent_packages_and_other_libraries_are_not_edges(tmp_path: Path) -> None:
    g = _package(
        tmp_path,
        {
            "persistkit/__init__.py": "from ._a import A\nfrom . import sub\n",
            "persistkit/_a.py": "import json\nfrom .sub import _x\nA = 1\n",
            "persistkit/sub/__init__.py": "",
            "persistkit/sub/_x.py": "from .._errors import E\nimport persistkit._errors\n",
            "persistkit/_errors.py": "class E(Exception): ...\n",
        },
    )
    assert cycles(g) == []
    assert [e.target for e in g["persistkit._a"]] == ["persistkit.sub._x"]
    assert {e.target for e in g["persistkit.sub._x"]} == {"persistkit._errors"}
    assert {e.target for e in g["persistkit"]} == {"persistkit._a", "persistkit.sub"}


# -- the error tree imports nothing, yet every message is scrubbed ---------------------------


@pytest.mark.parametrize("first", ["persistkit._errors", "persistkit.backends", "persistkit.wrappers._offload"])
def test_error_messages_are_scrubbed_whatever_is_imported_first(first: str) -> None:
    """``_redact`` installs the scrubber into the error tree as ``import persistkit`` starts."""
    import subprocess
    import sys

    token = "sk-Tx9Lq2Wm4Rn6Bv8Cz0Dy1Ex3Fw5Gu7Ht9Ks2Mp"
    script = (
        f"import {first}\n"
        "from persistkit._errors import BackendError\n"
        f"print(BackendError('driver said: password=hunter2-pass key {token}'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "driver said" in out and token not in out and "$CRED{openai" in out
