"""Real process death at every step position: committed steps run exactly once.

A subprocess runs a 20-step agent and SIGKILLs itself at step k, either
inside the step (after its side effect, before its checkpoint) or right
after it. A second process resumes. Side effects are counted in a file
outside persistkit: every committed step ran exactly once, the step in
flight at the kill ran twice (at-least-once), and the final state and
result are exactly those of an uninterrupted run.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import make_url

AGENT = Path(__file__).with_name("crash_agent.py")
EXPECTED = {"squares": [i * i for i in range(20)], "items": list(range(20)), "total": sum(range(20))}


def crash_and_resume(url: str, tmp: Path, k: int, when: str) -> tuple[int, Counter[int], dict[str, object]]:
    thread = f"crash-{when}-{k}"
    counter = tmp / f"{thread}.log"
    first = subprocess.run(
        [sys.executable, str(AGENT), url, thread, str(counter), str(k), when], capture_output=True, text=True
    )
    second = subprocess.run(
        [sys.executable, str(AGENT), url, thread, str(counter), "-1", "none"], capture_output=True, text=True
    )
    assert second.returncode == 0, second.stderr
    counts = Counter(int(line) for line in counter.read_text().split())
    return first.returncode, counts, json.loads(second.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["in", "after"])
@pytest.mark.parametrize("kind", ["sqlite", "dynamodb"])
def test_kill_at_every_step(
    tmp_path: Path, when: str, kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # DynamoDB (moto's server): the one-transaction-per-step store, killed between its requests too
    url = f"sqlite:///{tmp_path}/crash.db" if kind == "sqlite" else make_url(kind, request, tmp_path_factory)
    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(lambda k: crash_and_resume(url, tmp_path, k, when), range(20)))
    for k, (code, counts, result) in enumerate(outcomes):
        assert code == -signal.SIGKILL, f"kill at {k}: exit code {code}"
        expected = {i: 1 for i in range(20)}
        if when == "in":
            expected[k] = 2  # in flight at the kill: at-least-once
        assert dict(counts) == expected, f"kill {when} step {k}: side effects {dict(counts)}"
        assert result == EXPECTED, f"kill {when} step {k}: {result}"
