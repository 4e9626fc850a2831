"""Values that cannot be stored (issue 13, item 3).

What can be checked before a step's body runs is checked there (the state as
it is at the step's entry): the body does not run. What can only fail after
the body ran (it returned, or put into the state, something that cannot be
stored) is recorded as a failure of the step that replays as the same error
on every resume, so the body's side effects never happen twice. Either way
the run is recorded as failed, not left ``running``, and no message suggests
registering a builtin class or enabling pickle.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Annotated, Any

import pytest
from conftest import uid

import persistkit as pk


class Box(pk.State, name="tests.unstorable.Box"):
    log: Annotated[list[Any], pk.append] = []
    x: Any = None
    n: int = 0


def _message_is_fair(err: BaseException) -> str:
    text = str(err)
    assert "allow_pickle" not in text and "register(builtins" not in text and "register(_thread" not in text
    return text


def _runs(store: pk.Store, tid: str) -> list[tuple[str, str | None, str | None]]:
    return [(cp.kind, cp.status, cp.run_status) for cp in store.history(tid)]


@pytest.mark.parametrize("what", ["result", "state-value", "state-item"])
def test_unstorable_outcome_of_a_step_that_ran_is_recorded_and_not_run_again(store: pk.Store, what: str) -> None:
    tid = uid("unstorable")
    effects: list[str] = []

    @pk.checkpointed(name="ok")
    def ok(i: int) -> int:
        effects.append(f"ok{i}")
        return i

    @pk.checkpointed(name="charge")
    def charge() -> Any:
        effects.append("charged")
        run = pk.current_run()
        assert run is not None
        run.state.n = 7
        if what == "result":
            return lambda: "receipt"
        if what == "state-value":
            run.state.x = threading.Lock()
        else:
            run.state.log.append(threading.Lock())
        return "receipt"

    for attempt in range(3):
        with pytest.raises(pk.SerializationError) as err, pk.resume(tid, store=store, state=Box):
            ok(0)
            charge()
            ok(1)
        text = _message_is_fair(err.value)
        assert "'charge'" in text and repr(tid) in text and "does not run the step" in text, text
        assert "run_id=" in text  # how to go on: a new run
        assert effects == ["ok0", "charged"], f"attempt {attempt}: {effects}"
        history = _runs(store, tid)
        assert history[0] == ("end", None, "failed"), history  # not left running
        assert ("step", "failed", "running") in history
    # A new run starts from the last stored state and goes on.
    with pk.resume(tid, store=store, state=Box, run_id=uid("next")) as run:
        assert run.state.n == 7 and run.state.x is None and run.state.log == []
        ok(2)
    assert effects == ["ok0", "charged", "ok2"]
    assert store.get_state(tid, state=Box).n == 7


def test_unstorable_state_at_step_entry_is_found_before_the_body_runs(store: pk.Store) -> None:
    tid = uid("entry")
    effects: list[int] = []

    @pk.checkpointed(name="send")
    def send(i: int) -> int:
        effects.append(i)
        return i

    with pytest.raises(pk.SerializationError) as err, pk.resume(tid, store=store, state=Box) as run:
        send(0)
        run.state.log.append("fine")
        run.state.log.append(lambda: "not data")
        send(1)
    text = _message_is_fair(err.value)
    assert "'send'" in text and "was not run" in text and "state.log[1]" in text, text
    assert effects == [0]
    assert _runs(store, tid)[0] == ("end", None, "failed")
    # Fixed code continues the run: step 0 replays, step 1 runs once.
    with pk.resume(tid, store=store, state=Box) as run:
        send(0)
        run.state.log.append("fine")
        send(1)
    assert effects == [0, 1]
    assert store.get_state(tid, state=Box).log == ["fine"]

    tid = uid("entry-value")
    with pytest.raises(pk.SerializationError, match=r"was not run.*state\.x"), pk.resume(tid, store=store, state=Box) as run:
        run.state.x = {"lock": threading.Lock()}
        send(2)
    assert effects == [0, 1] and _runs(store, tid)[0] == ("end", None, "failed")


def test_unstorable_state_at_the_end_of_a_run_records_the_failure(store: pk.Store) -> None:
    tid = uid("end")

    @pk.checkpointed(name="work")
    def work() -> int:
        run = pk.current_run()
        assert run is not None
        run.state.n += 1
        return 1

    with pytest.raises(pk.SerializationError) as err, pk.resume(tid, store=store, state=Box) as run:
        work()
        run.state.x = lambda: 3
    text = _message_is_fair(err.value)
    assert "end of the run" in text and "recorded as failed" in text and "state.x" in text, text
    assert f"pk.resume({tid!r}, run_id={run.run_id!r}) replays" in text, text
    assert _runs(store, tid)[0] == ("end", None, "failed")
    assert store.get_state(tid, state=Box).model_dump() == {"log": [], "x": None, "n": 1}
    with pk.resume(tid, store=store, state=Box, run_id=run.run_id) as again:  # the advice: work replays
        work()
        assert [s.replayed for s in again.steps] == [True]
    assert store.get_state(tid, state=Box).n == 1 and _runs(store, tid)[0] == ("end", None, "completed")


def test_unstorable_result_of_an_async_step_is_recorded(store: pk.Store) -> None:
    tid = uid("async")
    effects: list[int] = []

    @pk.checkpointed(name="acall")
    async def acall() -> Any:
        effects.append(1)
        return threading.Lock()

    async def main() -> None:
        async with pk.resume(tid, store=store, state=Box):
            await acall()

    for _ in range(2):
        with pytest.raises(pk.SerializationError, match="does not run the step") as err:
            asyncio.run(main())
        _message_is_fair(err.value)
        assert effects == [1] and _runs(store, tid)[0] == ("end", None, "failed")


def test_messages_for_objects_that_cannot_be_stored() -> None:
    class Mine:
        pass

    codec = pk.connect("memory://").codec
    for value in (lambda: 1, threading.Lock(), iter([]), Mine()):
        with pytest.raises(pk.SerializationError) as err:
            codec.encode(value, "state.x")
        text = _message_is_fair(err.value)
        assert "pydantic models, dataclasses" in text, text


# -- retry_failed: re-run a recorded unstorable step after the fix (issue 18) --------------------


@pytest.mark.parametrize("what", ["result", "state-value"])
def test_retry_failed_reruns_only_the_failed_step_after_the_fix(store: pk.Store, what: str) -> None:
    tid = uid("retry")
    effects: list[str] = []
    fixed = False

    @pk.checkpointed(name="ok")
    def ok(i: int) -> int:
        effects.append(f"ok{i}")
        return i

    @pk.checkpointed(name="charge")
    def charge() -> Any:
        effects.append("charged")
        run = pk.current_run()
        assert run is not None
        run.state.n += 1
        if fixed:
            return "receipt"
        if what == "result":
            return lambda: "receipt"
        run.state.x = threading.Lock()
        return "receipt"

    def agent() -> list[Any]:
        return [ok(0), charge(), ok(1)]

    with pytest.raises(pk.SerializationError) as err, pk.resume(tid, store=store, state=Box) as first:
        agent()
    run_id = first.run_id
    text = str(err.value)
    advice = f"pk.resume({tid!r}, run_id={run_id!r}, retry_failed=True)"
    assert advice in text, text
    # Without retry_failed the recorded failure replays: nothing runs again, even with the fix.
    fixed = True
    with pytest.raises(pk.SerializationError), pk.resume(tid, store=store, state=Box):
        agent()
    assert effects == ["ok0", "charged"]
    # Following the advice: the committed step replays, only the failed step runs again.
    with pk.resume(tid, store=store, state=Box, run_id=run_id, retry_failed=True) as run:
        assert agent() == [0, "receipt", 1]
        assert [(s.name, s.replayed) for s in run.steps] == [("ok", True), ("charge", False), ("ok", False)]
        assert run.state.n == 1 and run.state.x is None
    assert effects == ["ok0", "charged", "charged", "ok1"]
    assert run.status == "completed"
    # The same advice followed twice replays the completed run: nothing runs again.
    with pk.resume(tid, store=store, state=Box, run_id=run_id, retry_failed=True):
        assert agent() == [0, "receipt", 1]
    assert effects == ["ok0", "charged", "charged", "ok1"]
    assert store.get_state(tid, state=Box).n == 1


def test_retry_failed_keeps_a_failure_the_run_went_past(local_store: pk.Store) -> None:
    # A recorded failure the code caught and went on from is part of the run's path:
    # retry_failed does not re-run it (that would change what came after it).
    tid = uid("caught")
    effects: list[str] = []

    @pk.checkpointed(name="bad")
    def bad() -> Any:
        effects.append("bad")
        return lambda: None

    @pk.checkpointed(name="after")
    def after() -> int:
        effects.append("after")
        raise RuntimeError("stop here")

    def agent() -> None:
        try:
            bad()
        except pk.SerializationError:
            effects.append("caught")
        after()

    with pytest.raises(RuntimeError), pk.resume(tid, store=local_store, state=Box) as first:
        agent()
    with pytest.raises(RuntimeError), pk.resume(tid, store=local_store, state=Box, run_id=first.run_id, retry_failed=True):
        agent()
    assert effects == ["bad", "caught", "after", "caught", "after"]


def test_retry_failed_must_be_a_bool() -> None:
    with pytest.raises(pk.ConfigurationError, match="retry_failed must be True or False"):
        pk.resume("t", retry_failed="yes")  # type: ignore[arg-type]


def test_retry_failed_async(local_store: pk.Store) -> None:
    tid = uid("aretry")
    effects: list[str] = []
    fixed = False

    @pk.checkpointed(name="ok")
    async def ok() -> int:
        effects.append("ok")
        return 1

    @pk.checkpointed(name="charge")
    async def charge() -> Any:
        effects.append("charged")
        return "receipt" if fixed else (lambda: None)

    async def first() -> None:
        async with pk.resume(tid, store=local_store, state=Box):
            await ok()
            await charge()

    async def retry(run_id: str) -> None:
        async with pk.resume(tid, store=local_store, state=Box, run_id=run_id, retry_failed=True):
            assert await ok() == 1 and await charge() == "receipt"

    run_ids: list[str] = []

    async def capture() -> None:
        try:
            await first()
        except pk.SerializationError as exc:
            run_ids.append(str(exc).split("run_id=")[1].split(",")[0].strip("'"))  # from the advice
            return
        raise AssertionError("the unstorable result was stored")

    asyncio.run(capture())
    fixed = True
    asyncio.run(retry(run_ids[0]))
    assert effects == ["ok", "charged", "charged"]


RETRY_AGENT = """
import os, sys, threading
import persistkit as pk

url, log, mode = sys.argv[1], sys.argv[2], sys.argv[3]

def effect(what):
    with open(log, "a") as f:
        f.write(what + "\\n")

@pk.checkpointed(name="fetch")
def fetch():
    effect("fetch")
    return "data"

@pk.checkpointed(name="send")
def send(data):
    effect("send")
    return threading.Lock() if mode == "broken" else f"sent {data}"

store = pk.connect(url)
kwargs = {"run_id": sys.argv[4], "retry_failed": True} if mode == "retry" else {}
try:
    with pk.resume("ticket-7", store=store, **kwargs) as run:
        print(run.run_id, send(fetch()))
except pk.SerializationError as exc:
    print(str(exc), file=sys.stderr)
    sys.exit(3)
"""


def test_fix_then_retry_across_processes(tmp_path: Any) -> None:
    """The user's path: the broken code fails in one process; after the fix, a plain resume
    still replays the error, and the advice of the error re-runs only the failed step."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    script, log = tmp_path / "agent.py", tmp_path / "effects.log"
    script.write_text(RETRY_AGENT)
    url = f"sqlite:///{tmp_path}/agent.db"
    env = {**os.environ, "PYTHONPATH": str(root)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(script), url, str(log), *args], capture_output=True,
                              text=True, env=env, timeout=120)

    broken = run("broken")
    assert broken.returncode == 3, broken
    advice = re.search(r"pk\.resume\('ticket-7', run_id='([0-9a-f]+)', retry_failed=True\)", broken.stderr)
    assert advice is not None, broken.stderr
    plain = run("fixed")  # fixed code, plain resume: the recorded failure replays
    assert plain.returncode == 3, plain
    assert log.read_text().split() == ["fetch", "send"]
    retried = run("retry", advice.group(1))
    assert retried.returncode == 0 and retried.stdout.split()[1:] == ["sent", "data"], retried
    assert log.read_text().split() == ["fetch", "send", "send"]  # fetch (committed) ran once
