"""A recorded step failure that the caller handled replays its error after a crash, even when
the crash came before anything else was recorded; a failure that ended an attempt still
runs again (a failed run retried, a retried step or parent interrupted by a crash, a
``pk.RetryableError`` that left the run unfinished).

The agent (tests/handled_agent.py): ``may_fail(1)`` raises ValueError, the caller catches
it, and the process dies right after (in the caller, or in the next step's body) —
in-process by a BaseException stand-in on memory and SQLite, and by a real SIGKILL of a
child process on SQLite and PostgreSQL; each crossed with ``retry=`` on the failing step
and on its parent. Every step body run is counted in a file persistkit does not know of.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import handled_agent as h
import pytest
from conftest import make_url, uid

import persistkit as pk
from persistkit.testing import crash_matrix

#: (shape, retry): where the failing step is, and which step retries.
SHAPES = [
    ("toplevel", "none"),
    ("toplevel", "step"),
    ("nested", "none"),
    ("nested", "step"),
    ("nested", "parent"),
]
AGENT = Path(h.__file__)


def expected_runs(shape: str, retry: str, crash: str) -> Counter[str]:
    """Body runs over the crashed process and the resume: as uncrashed, plus the step in
    flight at the crash (at-least-once) and the re-entered parent (it had not committed)."""
    runs = Counter({"may_fail 0": 1, "may_fail 1": 2 if retry == "step" else 1, "may_fail 2": 1})
    if crash == "inside":
        runs["may_fail 2"] += 1
    if shape == "nested":
        runs["parent 3"] = 1 if crash == "none" else 2
    return runs


def expected_records(shape: str) -> list[tuple[str, str]]:
    at = "0/" if shape == "nested" else ""
    steps = [(f"{at}0", "completed"), (f"{at}1", "failed"), (f"{at}2", "completed")]
    return [*steps, ("0", "completed")] if shape == "nested" else steps


def body_runs(log: Path) -> Counter[str]:
    return Counter(log.read_text().splitlines()) if log.exists() else Counter()


@pytest.mark.parametrize("crash", ["between", "inside"])
@pytest.mark.parametrize(("shape", "retry"), SHAPES)
def test_a_handled_failure_replays_after_a_crash_right_after_it(
    local_store: pk.Store, tmp_path: Path, shape: str, retry: str, crash: str
) -> None:
    tid, log = uid("handled"), tmp_path / "runs.log"
    with pytest.raises(h.Died):
        h.agent(local_store, tid, str(log), shape, retry, crash)
    at = "0/" if shape == "nested" else ""
    # the failure's checkpoint committed, and nothing after it: it is the run's newest record
    newest = local_store.history(tid)[0]
    assert (newest.kind, str(newest.position), newest.status) == ("step", f"{at}1", "failed")
    assert newest.error == "ValueError: bad input"

    assert h.agent(local_store, tid, str(log), shape, retry) == [0, -1, 2]
    assert body_runs(log) == expected_runs(shape, retry, crash)  # may_fail(1) did not run again
    assert h.recorded(local_store, tid) == expected_records(
        shape
    )  # no second 1: nothing recorded twice
    # and the finished run replays whole (its run_id again), its handled error included
    run_id = local_store.history(tid)[0].run_id
    assert h.agent(local_store, tid, str(log), shape, retry, run_id=run_id) == [0, -1, 2]
    assert body_runs(log) == expected_runs(shape, retry, crash)


@pytest.mark.slow
@pytest.mark.parametrize("crash", ["between", "inside"])
@pytest.mark.parametrize(("shape", "retry"), SHAPES)
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_handled_failure_replays_after_a_sigkill_right_after_it(
    kind: str,
    shape: str,
    retry: str,
    crash: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    url = (
        f"sqlite:///{tmp_path}/handled.db"
        if kind == "sqlite"
        else make_url(kind, request, tmp_path_factory)
    )
    tid, log = uid("handled-kill"), tmp_path / "runs.log"

    def process(crash: str) -> subprocess.CompletedProcess[str]:
        args = [sys.executable, str(AGENT), url, tid, str(log), shape, retry, crash]
        return subprocess.run(args, capture_output=True, text=True, timeout=120)

    first = process(crash)
    assert first.returncode == -signal.SIGKILL, first.stderr
    second = process("none")
    assert second.returncode == 0, second.stderr
    out = json.loads(second.stdout)
    assert out["result"] == [0, -1, 2]
    assert [tuple(r) for r in out["recorded"]] == expected_records(shape)
    assert body_runs(log) == expected_runs(shape, retry, crash)


def test_async_steps_replay_a_handled_failure_after_a_crash(local_store: pk.Store) -> None:
    ran: list[int] = []
    crash = [True]

    @pk.checkpointed(name="handled.async_may_fail")
    async def may_fail(i: int) -> int:
        ran.append(i)
        if i == 1:
            raise ValueError("bad input")
        if i == 2 and crash[0]:
            crash[0] = False
            raise h.Died()
        return i

    @pk.checkpointed(name="handled.async_parent")
    async def parent() -> list[int]:
        out = []
        for i in range(3):
            try:
                out.append(await may_fail(i))
            except ValueError:
                out.append(-1)
        return out

    async def agent(tid: str) -> list[int]:
        async with pk.resume(tid, store=local_store):
            return await parent()

    tid = uid("handled-async")
    with pytest.raises(h.Died):
        asyncio.run(agent(tid))
    assert asyncio.run(agent(tid)) == [0, -1, 2]
    assert ran == [0, 1, 2, 2]


# -- failures that ended an attempt run again ------------------------------------------------


def _flaky(fails: int, calls: list[int], died: list[int] | None = None) -> Any:
    """A step body that raises ValueError on its first ``fails`` calls (and dies on the calls
    numbered in ``died``), then returns the number of calls so far."""

    def body(i: int) -> int:
        calls.append(i)
        if died is not None and len(calls) in died:
            raise h.Died()
        if len(calls) <= fails:
            raise ValueError(f"call {len(calls)} fails")
        return len(calls)

    return body


@pytest.mark.parametrize("nested", [False, True])
def test_a_failure_that_failed_the_run_runs_again_when_the_run_is_retried(
    local_store: pk.Store, nested: bool
) -> None:
    calls: list[int] = []
    step = pk.checkpointed(name="handled.flaky")(_flaky(1, calls))
    outer = pk.checkpointed(name="handled.outer")(lambda: step(0))
    tid, run_id = uid("handled-redeliver"), "delivery-1"

    def agent() -> int:
        with pk.resume(tid, store=local_store, run_id=run_id):
            return int(outer() if nested else step(0))

    with pytest.raises(ValueError, match="call 1 fails"):
        agent()
    end = local_store.history(tid)[0]
    assert end.kind == "end" and end.run_status == "failed"
    assert agent() == 2  # the redelivery retries the failed step (and its parent)
    assert calls == [0, 0]
    assert agent() == 2 and calls == [0, 0]  # then the completed run replays


def test_a_retried_step_that_a_crash_interrupted_runs_again(local_store: pk.Store) -> None:
    calls: list[int] = []
    step = pk.checkpointed(name="handled.retried", retry=pk.Retry(attempts=3))(
        _flaky(1, calls, died=[2])
    )
    tid = uid("handled-step-retry")

    def agent() -> int:
        with pk.resume(tid, store=local_store):
            return int(step(0))

    with pytest.raises(h.Died):
        agent()  # attempt 1 failed, the process died in attempt 2: nothing is recorded
    assert local_store.history(tid) == []
    assert agent() == 3 and calls == [0, 0, 0]
    assert h.recorded(local_store, tid) == [("0", "completed")]


@pytest.mark.parametrize("crash", ["inside", "before"])
def test_a_retried_parent_that_a_crash_interrupted_runs_its_failed_child_again(
    local_store: pk.Store, crash: str
) -> None:
    """The child's failure escaped the parent's first attempt (its checkpoint committed) and
    the process died in the second attempt, in the child's body again or before it was
    called. On resume the child's recorded error escapes the parent's first attempt again
    (replayed, the body does not run), and the parent's next attempt runs the child."""
    calls: list[int] = []
    child = pk.checkpointed(name="handled.child")(
        _flaky(1, calls, died=[2] if crash == "inside" else None)
    )
    attempts: list[int] = []

    @pk.checkpointed(name="handled.retried_parent", retry=pk.Retry(attempts=3))
    def parent() -> int:
        step = pk.current_step()
        assert step is not None
        attempts.append(step.attempt)
        if crash == "before" and len(attempts) == 2:
            raise h.Died()
        return int(child(0))

    tid = uid("handled-parent-retry")

    def agent() -> int:
        with pk.resume(tid, store=local_store):
            return int(parent())

    with pytest.raises(h.Died):
        agent()
    assert h.recorded(local_store, tid) == [("0/0", "failed")]
    result = agent()
    assert attempts == [1, 2, 1, 2]  # the resumed parent: its first attempt replays the failure
    assert calls == (
        [0, 0, 0] if crash == "inside" else [0, 0]
    )  # once, the in-flight run, once more
    assert result == len(calls)
    assert h.recorded(local_store, tid) == [
        ("0/0", "failed"),
        ("0/0", "completed"),
        ("0", "completed"),
    ]


def test_a_retryable_error_that_left_the_run_unfinished_runs_again(local_store: pk.Store) -> None:
    """A block that ends with a pk.RetryableError writes no end record (the run stays
    unfinished, and the retry of its run_id continues it): the step that raised it runs
    again, though no end record lists its failure; one the caller handled, with a later
    step recorded, replays."""
    calls: list[int] = []

    @pk.checkpointed(name="handled.busy")
    def busy(i: int) -> int:
        calls.append(i)
        if len(calls) == 1:
            raise pk.ThreadBusyError("the other thread is busy, try again later")
        return i

    @pk.checkpointed(name="handled.after")
    def after(i: int) -> int:
        return i

    tid = uid("handled-retryable")

    def agent(handle: bool) -> list[int]:
        with pk.resume(tid, store=local_store, run_id="r1"):
            try:
                first = busy(0)
            except pk.ThreadBusyError:
                if not handle:
                    raise
                first = -1
            return [first, after(1)]

    with pytest.raises(pk.ThreadBusyError):
        agent(handle=False)
    assert [c.kind for c in local_store.history(tid)] == ["step"]  # no end record
    assert agent(handle=False) == [0, 1] and calls == [0, 0]

    calls.clear()
    tid = uid("handled-retryable")
    with pytest.raises(h.Died), pk.resume(tid, store=local_store, run_id="r1"):
        try:
            busy(0)
        except pk.ThreadBusyError:
            after(1)
        raise h.Died()
    assert agent(handle=True) == [-1, 1] and calls == [0]  # handled, a later step recorded: replays


def test_a_failure_that_escaped_before_the_end_record_replays_then_runs_on_the_next_retry(
    local_store: pk.Store,
) -> None:
    """A process that died between a step's failure and the end record of the run it failed
    leaves what a crash right after a handled failure leaves. The resume replays the error
    (the step does not run: its checkpoint committed), it escapes, and the end record lists
    it: the retry after that runs the step again."""
    calls: list[int] = []
    step = pk.checkpointed(name="handled.escapes")(_flaky(1, calls))
    tid = uid("handled-no-end")
    with pytest.raises(h.Died), pk.resume(tid, store=local_store):
        try:
            step(0)
        except ValueError:
            raise h.Died() from None  # the death on the failure's way out of the block
    with pytest.raises(ValueError, match="call 1 fails"), pk.resume(tid, store=local_store):
        step(0)
    assert calls == [0]
    assert [c.kind for c in local_store.history(tid)] == ["end", "step"]
    with pk.resume(tid, store=local_store):
        assert step(0) == 2
    assert calls == [0, 0]


# -- the crash matrix agrees -----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["inline", "process"])
@pytest.mark.parametrize(("shape", "retry"), SHAPES)
def test_the_crash_matrix_finds_nothing_in_an_agent_with_a_handled_failure(
    tmp_path: Path, mode: str, shape: str, retry: str
) -> None:
    log = str(tmp_path / "runs.log")
    tid = uid("handled-cm")
    result = crash_matrix(
        lambda store: h.agent(store, tid, log, shape, retry),
        mode=mode,
        directory=str(tmp_path),
    )
    assert result.ok, str(result)
    assert result.reference.value == [0, -1, 2]
    # the crash right after the handled failure was tried
    assert any(
        "`handled.may_fail` (position " + ("0/" if shape == "nested" else "") + "2)" in p
        for p in result.points
    )
