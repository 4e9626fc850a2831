"""Every name a bench script imports from persistkit (or an adapter) exists.

The scripts under bench/ run only with ``python3 dev.py bench`` (their peers' packages are
not in the test environment), so a name moved inside persistkit would break one unseen.
This reads each script's ``from persistkit... import name`` lines, at any depth, and checks
them against the package as it is."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
OURS = ("persistkit", "persistkit_")


def _imports(script: Path) -> list[tuple[str, str]]:
    tree = ast.parse(script.read_text(), str(script))
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(OURS) and not node.level
        for alias in node.names
    ]


@pytest.mark.parametrize("script", sorted(BENCH.glob("bench_*.py")), ids=lambda p: p.name)
def test_a_bench_script_imports_only_names_that_exist(script: Path) -> None:
    missing = []
    for module, name in _imports(script):
        try:
            found = importlib.import_module(module)
        except ImportError as exc:
            if exc.name and not exc.name.startswith(OURS):  # an adapter whose framework is absent
                continue
            missing.append(f"{module} ({exc})")
            continue
        if name != "*" and not hasattr(found, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{script.name} imports what persistkit no longer has: {missing}"
