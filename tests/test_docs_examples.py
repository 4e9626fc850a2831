"""What the README and the demo print is what a reader can follow; a one-call block takes store=."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
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
