"""The instruction-count gate (#37): the step path stays within 3% of its committed budget.

``bench/instruction_budget.py`` counts user-space instructions under valgrind (cachegrind)
for a step on ``memory://``, a step on SQLite and one turn on SQLite, each the difference
of two child runs so start-up cancels (PYTHONHASHSEED=0, no randomness in the workload,
this same interpreter). It fails when a figure exceeds ``bench/instruction_budget.json``
by more than 3%. A change that costs more updates the budget in the same commit
(``.venv/bin/python bench/instruction_budget.py --update``) and says why in its message;
docs/performance.md ("The instruction budget") has the figures and how to read them.

valgrind missing: skipped with the reason, unless ``PERSISTKIT_REQUIRE`` names
``valgrind`` (``.ci/run`` does; ``python3 dev.py test`` installs it as root). About 30 s
of CPU (four runs under valgrind); not in the quick tier.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REQUIRED

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "instruction_budget.py"


def _budget_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("instruction_budget", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_step_path_stays_within_its_instruction_budget(valgrind: str) -> None:
    budget = _budget_module()
    recorded = json.loads(budget.BUDGET.read_text())
    if budget.interpreter() not in recorded:
        why = (f"bench/instruction_budget.json has no budget for {budget.interpreter()} (it has "
               f"{sorted(recorded)}): record one on this interpreter with `{sys.executable} "
               f"{SCRIPT.relative_to(SCRIPT.parent.parent)} --update` and commit it")
        if "valgrind" in REQUIRED:
            pytest.fail(why)
        pytest.skip(why)
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, f"instruction budget exceeded (or not measured):\n{out.stdout}\n{out.stderr[-3000:]}"


def test_the_gate_fails_a_figure_over_budget_and_passes_one_within() -> None:
    budget = _budget_module()
    allowed = {"counts": {"memory_step": 1000, "sqlite_step": 2000, "sqlite_turn": 10000}}
    within = {"memory_step": 1029, "sqlite_step": 1500, "sqlite_turn": 10000}
    assert budget.check(within, allowed) == []
    over = budget.check({**within, "sqlite_step": 2100}, allowed)
    assert len(over) == 1 and over[0].startswith("sqlite_step: 2,100 instructions, budget 2,000 (+5.0%")
