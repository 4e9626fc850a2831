"""The step path's instruction budget: counted under valgrind, checked in CI against a committed budget.

    .venv/bin/python bench/instruction_budget.py            measure and compare (exit 1 over budget)
    .venv/bin/python bench/instruction_budget.py --update   measure and write the budget file

Wall-clock time on a shared machine drifts by tens of percent; user-space instructions
(``valgrind --tool=cachegrind``) repeat to a fraction of a percent for the same code,
Python and libraries. Three figures, each the difference of two runs of one child
process (``BASE`` rounds and ``BASE + EXTRA`` rounds of every workload, each workload's
extra rounds in a run of its own), so start-up, imports and first-use costs cancel:

* ``memory_step``: a step on ``memory://``, the codec and engine alone;
* ``sqlite_step``: the same step on SQLite (WAL, ``synchronous=NORMAL``);
* ``sqlite_turn``: one turn on SQLite (``pk.resume`` with its lease, loading the state,
  one step that rewrites the plan, the end record) on a thread that already has a head and
  a one-item list: a turn's fixed cost plus one step. The list does not grow from turn to
  turn, so each turn costs the same (a growing list's cost per turn is #37's next figure).

The step is an agent's: it appends a ~1 KB chat message to ``run.state.messages``
(a list channel), and the state also holds a plan (a dict of ~300 bytes of JSON, a
non-list channel) that changes every 10th step, and a scalar that does not.

The budget (``instruction_budget.json``, beside this script) holds each figure for one
interpreter (``cpython-3.11-x86_64``: the key); a measurement more than ``TOLERANCE``
above it fails ``tests/test_instruction_budget.py``. A change that costs more
instructions updates the budget in the same commit (``--update``) and says why in
its message; one that saves some updates it too, so the saving is kept
(docs/performance.md, "The instruction budget").
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

HERE = Path(__file__).resolve().parent
BUDGET = HERE / "instruction_budget.json"
#: A measurement above budget * (1 + TOLERANCE) fails.
TOLERANCE = 0.03
STEPS = 40  # steps per round of memory_step and sqlite_step
TURNS = 10  # turns per round of sqlite_turn
BASE, EXTRA = 1, 2  # rounds of every workload in the base run; extra rounds in the measured runs
WORKLOADS = ("memory_step", "sqlite_step", "sqlite_turn")
PER_ROUND = {"memory_step": STEPS, "sqlite_step": STEPS, "sqlite_turn": TURNS}


def interpreter() -> str:
    """The budget's key: instruction counts hold for one interpreter build and machine."""
    impl = sys.implementation.name
    return f"{impl}-{sys.version_info[0]}.{sys.version_info[1]}-{platform.machine()}"


def versions() -> dict[str, str]:
    """What else the counts depend on, recorded beside them (a change here explains a drift)."""
    import sqlite3
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for dist in ("orjson", "zstandard"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "missing"
    return out


# -- the workloads (run in the child process) -----------------------------------------------

def _message(i: int) -> dict[str, str]:
    """The i-th ~1 KB chat message: English-like words, no randomness."""
    words = ["agent", "tool", "model", "call", "result", "search", "plan", "answer", "durable", "state",
             "the", "a", "of", "to", "and", "in", "is", "for", "with", "on", "that", "this"]
    text = " ".join(words[(i * 7 + j * 13) % len(words)] for j in range(200))[:1000]
    return {"role": "assistant" if i % 2 else "user", "content": text}


def _plan(done: int) -> dict[str, Any]:
    """The agent's plan: ~300 bytes of JSON state, rewritten every 10th step."""
    return {"goal": "book a flight to Zurich under 400 EUR", "done": done,
            "todo": [f"search fares on day {d}" for d in range(done, done + 6)],
            "budget": {"tokens": 12000 - done * 100, "calls": 40 - done}}


def child(counts: dict[str, int]) -> None:
    import gc

    import persistkit as pk

    # No cyclic collections while counting: when one runs depends on every allocation
    # anywhere, so an unrelated change could move one into or out of the counted rounds
    # (a memory:// step moved by ~2-4% that way).
    gc.disable()

    class Agent(pk.State, name="bench.budget.Agent"):
        messages: Annotated[list[dict[str, str]], pk.append] = []
        plan: dict[str, Any] = {}
        model: str = "gpt-4o-mini"

    @pk.checkpointed(name="think")
    def think(i: int) -> None:
        run = pk.current_run()
        assert run is not None
        run.state.messages.append(_message(i))
        if i % 10 == 0:
            run.state.plan = _plan(i // 10)

    @pk.checkpointed(name="decide")
    def decide(i: int) -> None:  # a turn's step: the thread's list stays as it is, so every turn costs the same
        run = pk.current_run()
        assert run is not None
        run.state.plan = _plan(i)

    d = Path(tempfile.mkdtemp())
    try:
        for r in range(counts["memory_step"]):
            store = pk.connect("memory://")
            with pk.resume(f"steps-{r}", store=store, state=Agent):
                for i in range(STEPS):
                    think(i)
            store.close()
        for r in range(counts["sqlite_step"]):
            store = pk.connect(f"sqlite:///{d}/steps-{r}.db")
            with pk.resume("steps", store=store, state=Agent):
                for i in range(STEPS):
                    think(i)
            store.close()
        store = pk.connect(f"sqlite:///{d}/turns.db")
        with pk.resume("turns", store=store, state=Agent):  # the thread has a head (and a list) before the rounds
            think(0)
        for r in range(counts["sqlite_turn"]):
            for t in range(TURNS):
                with pk.resume("turns", store=store, state=Agent):
                    decide(r * TURNS + t)
        store.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


# -- counting --------------------------------------------------------------------------------

def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached by the first run, read by the others
    return env


def instructions(counts: dict[str, int]) -> int:
    """User-space instructions of one child process running ``counts`` rounds of each workload."""
    out = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, __file__, "--child", json.dumps(counts)],
        capture_output=True, text=True, env=_env(), check=False,
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode or found is None:
        raise RuntimeError(f"the child under valgrind failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return int(found.group(1).replace(",", ""))


def measure() -> dict[str, int]:
    """Instructions per step (per turn for ``sqlite_turn``) of each workload."""
    base = dict.fromkeys(WORKLOADS, BASE)
    # Once outside valgrind first: every module it imports has its bytecode cached before counting
    # (compiling one in a counted run costs ~10^9 instructions).
    subprocess.run([sys.executable, __file__, "--child", json.dumps(base)], env=_env(), check=True)
    floor = instructions(base)
    out = {}
    for name in WORKLOADS:
        more = instructions({**base, name: BASE + EXTRA})
        out[name] = round((more - floor) / (EXTRA * PER_ROUND[name]))
    return out


def check(measured: dict[str, int], budget: dict[str, Any]) -> list[str]:
    """The figures over budget, each as a line saying by how much."""
    over = []
    for name in WORKLOADS:
        allowed = budget["counts"][name]
        if measured[name] > allowed * (1 + TOLERANCE):
            over.append(f"{name}: {measured[name]:,} instructions, budget {allowed:,} "
                        f"(+{measured[name] / allowed - 1:.1%}, more than {TOLERANCE:.0%})")
    return over


def main(argv: list[str]) -> int:
    if shutil.which("valgrind") is None:
        print("instruction_budget.py: valgrind is not installed (apt-get install valgrind)")
        return 2
    budgets: dict[str, Any] = json.loads(BUDGET.read_text()) if BUDGET.exists() else {}
    key = interpreter()
    measured = measure()
    mine = budgets.get(key)
    print(f"instructions per step (per turn: sqlite_turn), {key}, PYTHONHASHSEED=0, valgrind cachegrind")
    print(f"{'':<14}{'measured':>12}{'budget':>12}{'ratio':>8}")
    for name in WORKLOADS:
        allowed = mine["counts"][name] if mine else None
        print(f"{name:<14}{measured[name]:>12,}" + (f"{allowed:>12,}{measured[name] / allowed:>8.3f}" if allowed else ""))
    if "--update" in argv:
        budgets[key] = {"counts": measured, "versions": versions()}
        BUDGET.write_text(json.dumps(budgets, indent=2, sort_keys=True) + "\n")
        print(f"wrote {BUDGET.name} for {key}: commit it with the change, saying why the figures moved")
        return 0
    if mine is None:
        print(f"no budget for {key} in {BUDGET.name}: record one with --update (on that interpreter)")
        return 3
    over = check(measured, mine)
    if mine.get("versions") != versions():
        print(f"measured with {versions()}; the budget was recorded with {mine.get('versions')}")
    for line in over:
        print("OVER BUDGET " + line)
    if over:
        print(f"If the extra cost is wanted, run `{Path(sys.executable).name} bench/{Path(__file__).name} --update` "
              "and commit the new budget with the change, saying why in its message (docs/performance.md).")
    return 1 if over else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
