"""The crash matrix on agents its authors had not seen (issue #34 §1): correct agents it
must pass (steps gathered with asyncio.gather and random latency; a hand-written retry
loop), defects it must name (a file written between steps, a step that changes its own
argument in place, the order of a set), and consequences grouped under their cause."""

from __future__ import annotations

import asyncio
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit.testing import CrashMatrixResult, crash_matrix

MODES = ["inline", "process"]


def matrix(agent: Any, mode: str, tmp_path: Path, other_hash_seed: bool = False) -> CrashMatrixResult:
    """The matrix on SQLite; the look under another hash seed only where a test is about it
    (it starts the test again: about a pytest start-up)."""
    return crash_matrix(
        agent, mode=mode, url="sqlite", directory=str(tmp_path), echo=None, other_hash_seed=other_hash_seed
    )


@pk.checkpointed
async def lookup(what: str) -> str:
    await asyncio.sleep(random.random() * 0.003)  # the three land in any order
    return f"{what}: found"


@pytest.mark.parametrize("mode", MODES)
def test_an_async_agent_that_gathers_steps_passes(mode: str, tmp_path: Path) -> None:
    thread = uid("cm-gather")

    async def agent() -> str:
        async with pk.resume(thread) as run:
            found = await asyncio.gather(lookup("customer"), lookup("order"), lookup("history"))
            run.state["facts"] = list(found)
            return " | ".join(found)

    result = matrix(agent, mode, tmp_path)
    assert result.ok and len(result.points) == 9, str(result)


class RateLimited(Exception):
    pass


ASKED: dict[str, int] = {}  # the fake model's memory: the first call for a prompt fails


@pk.checkpointed
def ask(prompt: str) -> str:
    ASKED[prompt] = ASKED.get(prompt, 0) + 1
    if ASKED[prompt] == 1:
        raise RateLimited(f"slow down on {prompt!r}")
    return f"answer to {prompt}"


@pytest.mark.parametrize("mode", MODES)
def test_a_hand_written_retry_loop_passes(mode: str, tmp_path: Path) -> None:
    """The second uncrashed run gives back the recorded error (it used to run 1 body
    against 2), a resume whose fresh process fails once more calls `ask` one position
    further (it used to say "step `?` at position 2 ran 1 times, 0 allowed")."""
    thread = uid("cm-retry")
    ASKED.clear()

    def agent() -> str:
        with pk.resume(thread) as run:
            for _ in range(3):
                try:
                    run.state["answer"] = ask("refund?")
                    break
                except RateLimited:
                    continue
            return str(run.state["answer"])

    result = matrix(agent, mode, tmp_path)
    assert result.ok, str(result)
    assert len(result.points) == 5  # a failed body has no `inside` point


@pytest.mark.parametrize("mode", MODES)
def test_a_file_written_between_steps_is_an_effect_outside_a_step(mode: str, tmp_path: Path) -> None:
    thread, log = uid("cm-effect"), tmp_path / "audit.log"

    @pk.checkpointed(name="charge")
    def charge(amount: int) -> str:
        return f"charged {amount}"

    def agent() -> str:
        with pk.resume(thread):
            first = charge(10)
            with open(log, "a") as f:  # the defect: runs again on every resume
                f.write(first + "\n")
            return charge(20)

    result = matrix(agent, mode, tmp_path)
    (finding,) = result.findings
    assert finding.kind == "effect", str(result)
    assert finding.message.startswith(
        "an effect outside a step, it will run again on every resume: a file opened for writing"
    )
    assert "audit.log" in finding.message and "test_crash_matrix_trust.py" in finding.message
    assert "after step `charge` at position 0" in finding.message
    with pytest.raises(AssertionError, match="an effect outside a step"):
        result.assert_exactly_once()


@pytest.mark.parametrize("mode", MODES)
def test_a_step_that_changes_its_argument_in_place_is_named(mode: str, tmp_path: Path) -> None:
    thread = uid("cm-mutate")

    @pk.checkpointed(name="tidy")
    def tidy(items: list[str]) -> int:
        items.append("done")  # the defect: a replay does not run it
        return len(items)

    @pk.checkpointed(name="report")
    def report(text: str) -> str:
        return f"report: {text}"

    @pk.checkpointed(name="send")
    def send(text: str) -> str:
        return f"sent {text}"

    def agent() -> str:
        with pk.resume(thread):
            items = ["a"]
            tidy(items)
            return send(report(",".join(items)))

    result = matrix(agent, mode, tmp_path)
    (finding,) = result.findings  # the downstream differences are grouped under it
    assert finding.message.startswith("step `tidy` at position 0 changes its own argument `items` in place")
    assert "follows from it: the arguments of step `report` at position 1 differ on replay" in str(result)
    assert "follows from it: the arguments of step `send` at position 2 differ in turn" in str(result)
    with pytest.raises(AssertionError, match="changes its own argument `items`"):
        result.assert_same_outcome()


def test_state_changed_in_place_by_a_step_is_no_finding(tmp_path: Path) -> None:
    """A step that appends to a list the state holds changes its argument in place too, but
    the state is committed with the step and restored on replay: not a defect."""
    thread = uid("cm-state")

    @pk.checkpointed
    def note(notes: list[str], text: str) -> int:
        notes.append(text)
        return len(notes)

    def agent() -> list[str]:
        with pk.resume(thread) as run:
            run.state.setdefault("notes", [])
            note(run.state["notes"], "a")
            note(run.state["notes"], "b")
            return list(run.state["notes"])

    result = matrix(agent, "inline", tmp_path)
    assert result.ok, str(result)


def test_persistkit_own_writes_are_not_effects(tmp_path: Path) -> None:
    thread, url = uid("cm-own"), f"sqlite:///{tmp_path / 'own.db'}"

    @pk.checkpointed
    def step(x: int) -> int:
        return x + 1

    def agent() -> int:
        with pk.connect(url) as store, pk.resume(thread, store=store):  # the agent opens its store
            return step(step(1))

    result = matrix(agent, "inline", tmp_path)
    assert "effect" not in {f.kind for f in result.findings}, str(result)
    assert os.path.exists(tmp_path / "own.db")


@pk.checkpointed(name="greet")
def greet(name: str) -> str:
    return f"hello {name}"


NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"]


def greet_everyone(thread: str) -> list[str]:
    with pk.resume(thread) as run:
        run.state["said"] = [greet(n) for n in set(NAMES)]  # the defect: a set's order
        return list(run.state["said"])


@pytest.mark.slow  # process mode (the quick tier leaves it out)
def test_iterating_a_set_between_steps_is_named_in_process_mode(tmp_path: Path) -> None:
    """Process mode starts this test again under another PYTHONHASHSEED, where the set of
    ten names iterates in another order (the chance that it does not is below 1e-6)."""
    thread = uid("cm-set")
    result = matrix(lambda: greet_everyone(thread), "process", tmp_path, other_hash_seed=True)
    if os.environ.get("PERSISTKIT_CRASH_MATRIX_PROBE"):
        return  # this is that run: the matrix ran the agent once, uncrashed
    assert [f.kind for f in result.findings] == ["order"], str(result)
    assert result.findings[0].message.startswith(
        "the order of the steps changed in a fresh process with another hash seed"
    )
    # the first name the two orders disagree on: at 0 unless both seeds happen to start alike
    assert re.search(r"step `greet` at position \d was called with other arguments", str(result)), str(result)
    with pytest.raises(AssertionError, match="iterates a set"):
        result.assert_same_outcome()


@pytest.mark.slow  # process mode (the quick tier leaves it out)
def test_a_sorted_set_passes_in_process_mode(tmp_path: Path) -> None:
    thread = uid("cm-sorted")

    @pk.checkpointed(name="wave")
    def wave(name: str) -> str:
        return f"hello {name}"

    def agent() -> list[str]:
        with pk.resume(thread):
            return [wave(n) for n in sorted(set(NAMES[:4]))]

    result = matrix(agent, "process", tmp_path, other_hash_seed=True)
    assert result.ok and not result.notes, str(result)


@pk.checkpointed(name="bow")
def bow(name: str) -> str:
    return f"bows to {name}"


@pytest.mark.slow  # process mode (the quick tier leaves it out)
def test_the_order_of_a_set_is_checked_at_every_call_of_a_test(tmp_path: Path) -> None:
    """The test started again under another PYTHONHASHSEED got an empty result from each
    call, so an assertion on the first call's result stopped it there and the second call,
    whose agent iterates a set, was never compared. Each call there now returns what it
    returned here."""
    first, second = uid("cm-sorted-first"), uid("cm-set-second")

    def sorted_agent() -> list[str]:
        with pk.resume(first):
            return [bow(n) for n in sorted(NAMES[:3])]

    before = matrix(sorted_agent, "process", tmp_path, other_hash_seed=True)
    assert before.ok and len(before.points) == 9 and not before.notes, str(before)
    result = matrix(lambda: greet_everyone(second), "process", tmp_path, other_hash_seed=True)
    assert [f.kind for f in result.findings] == ["order"], str(result)
    assert re.search(r"step `greet` at position \d was called with other arguments", str(result)), str(result)


FIRST_RUN: list[str] = []  # a global: "is this the first run in this process?"


@pk.checkpointed(name="welcome")
def welcome(kind: str) -> str:
    return f"welcome ({kind})"


@pytest.mark.slow  # process mode (the quick tier leaves it out)
def test_process_mode_before_inline_leaves_inline_as_strong(tmp_path: Path) -> None:
    """Process mode's uncrashed runs used to run here and fill the agent's globals, so an
    inline matrix after it saw a second run where it should see a first: the defect below
    (a global decides a step's arguments) went unnoticed. Process mode now runs in a child."""
    thread = uid("cm-first")

    def agent() -> str:
        with pk.resume(thread):
            kind = "first" if not FIRST_RUN else "again"  # the defect: not in the state
            FIRST_RUN.append(kind)
            return welcome(kind)

    FIRST_RUN.clear()
    matrix(agent, "process", tmp_path)
    assert FIRST_RUN == []  # nothing of process mode's runs is left in this process
    inline = matrix(agent, "inline", tmp_path)
    assert "nondeterminism" in {f.kind for f in inline.findings}, str(inline)
    assert "differ between two uncrashed runs" in str(inline)
    assert not inline.notes, str(inline)


def test_a_connection_and_a_process_between_steps_are_effects(tmp_path: Path) -> None:
    import contextlib
    import socket
    import subprocess
    import sys

    thread = uid("cm-net")

    @pk.checkpointed(name="fetch")
    def fetch(x: int) -> int:
        return x + 1

    def agent() -> int:
        with pk.resume(thread):
            a = fetch(1)
            # a webhook posted between steps (nothing listens: the attempt is the effect)
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", 9), timeout=0.2).close()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            return fetch(a)

    result = matrix(agent, "inline", tmp_path)
    text = str(result)
    assert {f.kind for f in result.findings} == {"effect"}, text
    assert "a network connection (('127.0.0.1', 9))" in text
    assert "a process started (subprocess.Popen" in text
    assert text.count("after step `fetch` at position 0") == 2
