"""What the README and the demo print is what a reader can follow; a one-call block takes store=."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import persistkit as pk

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PERSISTKIT_URL"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_readme_quickstart_prints_no_unexplained_none(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Quickstart\s+```python\n(.*?)```", readme, re.S)
    assert code is not None
    out = subprocess.run([sys.executable, "-c", code.group(1)], cwd=tmp_path, capture_output=True, text=True,
                         env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "None" not in out.stdout
    lines = out.stdout.splitlines()
    assert lines[1:] == ["step 0/0 call_llm", "step 0/1 call_llm", "step 0 agent", "end  completed"]


def test_demo_step_numbers_agree_with_history_positions(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py")], cwd=tmp_path,
                         capture_output=True, text=True, env=_env(), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    shown = re.findall(r"step\s+(\d+) \(pos\s+(\d+)\)", out.stdout)
    assert len(shown) == 21  # the step that died in run 1, then the 20 steps of run 2
    assert all(int(pos) == int(n) - 1 for n, pos in shown)
    history = out.stdout.split("History of thread", 1)[1]
    positions = {int(p) for p in re.findall(r"\bstep\s+(\d+)\s+\w+\s+completed", history)}
    assert positions == set(range(20)) and "pos counts from 0" in history


@pk.checkpointed
def add_one(x: int) -> int:
    return x + 1


@pk.checkpointed
async def add_two(x: int) -> int:
    return x + 2


@pk.checkpointed
def takes_store(x: int, store: str) -> str:
    return f"{x}:{store}"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_one_call_block_runs_in_the_store_given(local_store: pk.Store, kind: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERSISTKIT_URL", f"sqlite:///{tmp_path}/default.db")
    tid = f"one-call-{kind}"
    if kind == "sync":
        assert add_one(1, thread_id=tid, store=local_store) == 2
    else:
        assert asyncio.run(add_two(1, thread_id=tid, store=local_store)) == 3
    steps = [cp.step for cp in local_store.history(tid) if cp.kind == "step"]
    assert steps == [("add_one" if kind == "sync" else "add_two")]
    assert not (tmp_path / "default.db").exists()  # the default store was not used


def test_a_step_with_its_own_store_parameter_receives_it(local_store: pk.Store) -> None:
    with pk.resume("own-store", store=local_store):
        assert takes_store(1, store="mine") == "1:mine"
    assert takes_store(2, store="x") == "2:x"  # outside a block: a plain call


# -- every ```python block of README.md and docs/*.md -----------------------------------------
#
# A block runs as written (in a fresh directory, in a new process), or its first line is
#     # fragment: see examples/<file>.py        (or a test file under tests/)
# naming a complete file that covers it: the file must use every persistkit name the block
# uses (names imported from persistkit*, pk.<attr> chains, keyword arguments of those calls).
# An example named by a fragment is run by test_an_example_covering_a_fragment_runs; a test
# file is run by the suite itself, and so is a pytest example (examples/testing/test_*.py,
# by tests/test_crash_matrix_examples.py: run as a script it would test nothing).

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Also an indented fence (a block inside a list item): its code is dedented.
FENCE = re.compile(r"^([ \t]*)```[ \t]*(python3?|py)[ \t]*\n(.*?)^\1```[ \t]*$", re.S | re.M)
FRAGMENT = re.compile(r"#\s*fragment:\s*see\s+(\S+)")
HOW_TO_FIX = ("Make it run as written (imports, definitions, a local store), or make its first line "
              "'# fragment: see examples/<file>.py' naming a complete file that does what it shows")


class Block:
    def __init__(self, doc: Path, line: int, code: str) -> None:
        self.doc, self.line, self.code = doc, line, code
        first = code.lstrip("\n").splitlines()[0] if code.strip() else ""
        marker = FRAGMENT.match(first.strip())
        self.covered_by = marker.group(1) if marker else None
        self.where = f"{doc.relative_to(ROOT)}:{line} (the ```python block starting '{first.strip()[:60]}')"


def python_blocks() -> list[Block]:
    blocks = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            blocks.append(Block(doc, text[: m.start()].count("\n") + 1, textwrap.dedent(m.group(3))))
    return blocks


BLOCKS = python_blocks()


def _parse(block: Block) -> ast.Module:
    try:
        tree = compile(block.code, block.where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as exc:
        pytest.fail(f"{block.where} is not valid Python (line {exc.lineno} of the block: {exc.msg}). {HOW_TO_FIX}",
                    pytrace=False)
    assert isinstance(tree, ast.Module)
    return tree


def persistkit_names(tree: ast.Module) -> set[str]:
    """What a block shows: names imported from persistkit, ``pk.…`` attributes and the keywords
    of those calls, and the methods it calls on any object (``store.verify()``)."""
    names: set[str] = set()
    ours: set[str] = {"pk"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0].startswith("persistkit"):
            for alias in node.names:
                names.add(alias.name)
                ours.add(alias.asname or alias.name)

    def rooted(node: ast.expr) -> list[str] | None:
        chain: list[str] = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        return chain if isinstance(node, ast.Name) and node.id in ours else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (chain := rooted(node)) is not None:
            names.update(chain)
        if isinstance(node, ast.Call) and rooted(node.func) is not None:
            names.update(k.arg for k in node.keywords if k.arg)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            names.add(node.func.attr)
    return names


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where.split(" ")[0] for b in BLOCKS])
def test_every_python_block_runs_or_is_a_covered_fragment(block: Block, tmp_path: Path) -> None:
    tree = _parse(block)
    if block.covered_by is not None:
        target = ROOT / block.covered_by
        if not (target.is_file() and target.suffix == ".py"):
            pytest.fail(f"{block.where} says it is covered by {block.covered_by}, which is not a file of the "
                        f"repository. {HOW_TO_FIX}", pytrace=False)
        rel = target.relative_to(ROOT).parts
        if not (rel[0] == "examples" or (rel[0] == "tests" and target.name.startswith("test_"))):
            pytest.fail(f"{block.where}: a fragment is covered by an example (examples/*.py, run by this test) "
                        f"or a test module (tests/**/test_*.py, run by the suite), not by {block.covered_by}",
                        pytrace=False)
        text = target.read_text()
        missing = sorted(n for n in persistkit_names(tree) if not re.search(rf"\b{re.escape(n)}\b", text))
        if missing:
            pytest.fail(f"{block.where} is a fragment covered by {block.covered_by}, which never uses {missing}: "
                        "cover them there, or point the fragment at a file that does", pytrace=False)
        return
    out = subprocess.run([sys.executable, "-c", block.code], cwd=tmp_path, capture_output=True, text=True,
                         env=_env(), timeout=300)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        pytest.fail(f"{block.where} does not run as written: exit {out.returncode}, {last}. {HOW_TO_FIX}\n"
                    f"--- stderr ---\n{out.stderr[-3000:]}", pytrace=False)


PYTEST_EXAMPLES = "examples/testing/"
COVERING_EXAMPLES = sorted({b.covered_by for b in BLOCKS if b.covered_by and b.covered_by.startswith("examples/")
                            and not b.covered_by.startswith(PYTEST_EXAMPLES)})


@pytest.mark.slow
@pytest.mark.parametrize("example", COVERING_EXAMPLES)
def test_an_example_covering_a_fragment_runs(example: str, tmp_path: Path) -> None:
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "adapters")])
    out = subprocess.run([sys.executable, str(ROOT / example)], cwd=tmp_path, capture_output=True, text=True,
                         env=env, timeout=600)
    users = [b.where.split(" ")[0] for b in BLOCKS if b.covered_by == example]
    assert out.returncode == 0, (
        f"{example}, which covers the doc fragments {users}, fails: exit {out.returncode}\n"
        f"--- stdout ---\n{out.stdout[-2000:]}\n--- stderr ---\n{out.stderr[-3000:]}")


def test_the_fragment_convention_is_what_the_docs_use() -> None:
    # A block that looks like a fragment marker but does not match it would silently run as code.
    for block in BLOCKS:
        first = block.code.lstrip("\n").splitlines()[0] if block.code.strip() else ""
        if "fragment" in first.lower():
            assert block.covered_by is not None, (
                f"{block.where}: its first line mentions a fragment but is not '# fragment: see <file>'")
