"""A run that crashed under one schema version, resumed by code of the next (issue 13, item 1).

A version-1 run of ``tests/migrate_agent.py`` crashes at every step position,
inside the step (in flight) or right after it (committed); version-2 code
resumes it. For each kind of migration (rename, add, type change) the result
must be what migrating a *finished* version-1 run gives: the same final state,
each committed step run once, a head that reads that state, every checkpoint
of the now mixed-version chain loadable, and later resumes working. A crash
is a ``BaseException`` in process on every store, and a real SIGKILL of a
separate process on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import make_url, uid
from migrate_agent import CLASSES, KINDS, STEPS, run_agent

import persistkit as pk

AGENT = Path(__file__).with_name("migrate_agent.py")


class Crash(BaseException):
    """A process death in miniature: not an Exception, so nothing is recorded for the step in flight."""


def finished_v1_migrated(store: pk.Store, kind: str) -> dict[str, Any]:
    """What version-2 code loads from a version-1 run that finished: the reference."""
    tid = uid(f"ref-{kind}")
    out = run_agent(store, tid, kind, 1, effect=lambda i: None)
    return {"squares": out["squares"], "state": store.get_state(tid, state=CLASSES[(kind, 2)]).model_dump(mode="json")}


def check_thread(store: pk.Store, tid: str, kind: str, final: dict[str, Any], crashed_at: int) -> None:
    """The head, every checkpoint and later resumes of a thread resumed across the migration."""
    v2 = CLASSES[(kind, 2)]
    assert store.get_state(tid, state=v2).model_dump(mode="json") == final["state"]
    history = store.history(tid)
    assert all(cp.run_status != "failed" for cp in history), [(cp.kind, cp.run_status) for cp in history]
    steps = sorted((cp for cp in history if cp.kind == "step"), key=lambda cp: cp.checkpoint_id)
    assert [cp.position for cp in steps] == [str(i) for i in range(STEPS)]
    # Steps committed by version 1 keep its stamp; everything the resumed run wrote is version 2.
    assert [cp.schema[1] for cp in steps] == [1] * crashed_at + [2] * (STEPS - crashed_at)  # type: ignore[index]
    assert history[0].kind == "end" and history[0].schema[1] == 2  # type: ignore[index]
    for cp in history:  # every checkpoint of the mixed chain loads, typed and as a dict
        store.get_state(tid, cp.checkpoint_id, state=v2)
        assert isinstance(store.get_state(tid, cp.checkpoint_id), dict)
    # Replaying the run (same run_id) runs nothing; a new run continues from the head.
    ran: list[int] = []
    again = run_agent(store, tid, kind, 2, effect=ran.append, run_id=final["run_id"])
    assert ran == [] and again["squares"] == final["squares"] and again["state"] == final["state"]
    more = run_agent(store, tid, kind, 2, effect=ran.append, steps=1)
    assert ran == [0]
    counter = "turn_count" if kind == "rename" else "turns"
    assert int(more["state"][counter]) == STEPS + 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("when", ["in", "after"])
def test_crashed_v1_run_resumed_by_v2_code_equals_migrating_a_finished_run(
    store: pk.Store, kind: str, when: str
) -> None:
    reference = finished_v1_migrated(store, kind)
    fresh = run_agent(store, uid("fresh"), kind, 2, effect=lambda i: None)  # version 1 stored nothing
    for k in range(STEPS):
        tid = uid(f"mig-{kind}-{when}-{k}")
        effects: Counter[int] = Counter()

        def effect(i: int, effects: Counter[int] = effects) -> None:
            effects[i] += 1

        def crash(i: int, k: int = k) -> None:
            if i == k:
                raise Crash

        hook = {"crash": crash} if when == "in" else {"crash_after": crash}
        with pytest.raises(Crash):
            run_agent(store, tid, kind, 1, effect=effect, **hook)  # type: ignore[arg-type]
        final = run_agent(store, tid, kind, 2, effect=effect)
        expected_state = reference if k or when == "after" else {"squares": fresh["squares"], "state": fresh["state"]}
        assert {"squares": final["squares"], "state": final["state"]} == expected_state, f"crash {when} step {k}"
        expected = {i: 1 for i in range(STEPS)}
        if when == "in":
            expected[k] = 2  # in flight at the crash: at-least-once
        assert dict(effects) == expected, f"crash {when} step {k}: side effects {dict(effects)}"
        check_thread(store, tid, kind, final, k if when == "in" else k + 1)


@pytest.mark.parametrize("kind", ["rename", "type"])
def test_a_second_crash_under_v2_then_a_resume_reads_both_versions(store: pk.Store, kind: str) -> None:
    """v1 commits steps 0-1, v2 commits 2-3 and crashes, v2 finishes: replay crosses the versions."""
    reference = finished_v1_migrated(store, kind)
    tid = uid(f"mig2-{kind}")

    def crash_at(k: int) -> Any:
        def crash(i: int) -> None:
            if i == k:
                raise Crash

        return crash

    with pytest.raises(Crash):
        run_agent(store, tid, kind, 1, effect=lambda i: None, crash=crash_at(2))
    with pytest.raises(Crash):
        run_agent(store, tid, kind, 2, effect=lambda i: None, crash=crash_at(4))
    ran: list[int] = []
    final = run_agent(store, tid, kind, 2, effect=ran.append)
    assert ran == [4]
    assert {"squares": final["squares"], "state": final["state"]} == reference
    check_thread(store, tid, kind, final, 2)


# -- a real process death ------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def process_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory)


def _kill_and_resume(url: str, tmp: Path, kind: str, k: int) -> tuple[int, Counter[int], dict[str, Any], str]:
    thread = uid(f"kill-{kind}-{k}")
    counter = tmp / f"{thread}.log"
    # Imported, not run as __main__: its classes have the names the test process reads them by.
    code = f"import sys; sys.path.insert(0, {str(AGENT.parent)!r}); import migrate_agent; migrate_agent.main()"
    args = [sys.executable, "-c", code, url, thread, kind]
    first = subprocess.run([*args, "1", str(k), str(counter)], capture_output=True, text=True)
    second = subprocess.run([*args, "2", "-1", str(counter)], capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    counts = Counter(int(line) for line in counter.read_text().split())
    return first.returncode, counts, json.loads(second.stdout), thread


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_sigkilled_v1_process_resumed_by_v2_process(process_url: str, tmp_path: Path, kind: str) -> None:
    with pk.connect(process_url) as store:
        reference = finished_v1_migrated(store, kind)
        fresh = run_agent(store, uid("fresh"), kind, 2, effect=lambda i: None)  # a kill in step 0
        with ThreadPoolExecutor(max_workers=3) as pool:
            outcomes = list(pool.map(lambda k: _kill_and_resume(process_url, tmp_path, kind, k), range(STEPS)))
        for k, (code, counts, final, thread) in enumerate(outcomes):
            assert code == -signal.SIGKILL, f"kill at {k}: exit code {code}"
            expected = reference if k else {"squares": fresh["squares"], "state": fresh["state"]}
            assert {"squares": final["squares"], "state": final["state"]} == expected, f"kill at {k}"
            assert dict(counts) == {i: 2 if i == k else 1 for i in range(STEPS)}, f"kill at {k}: {dict(counts)}"
            check_thread(store, thread, kind, final, k)


# -- a migration that fails writes nothing ----------------------------------------------------------


def _snapshot(store: pk.Store, tid: str) -> tuple[str | None, int, Any]:
    history = store.history(tid)
    return history[0].checkpoint_id, len(history), store.get_state(tid)


@pytest.mark.parametrize(
    ("bug", "message"),
    [
        ("raises", r"KeyError: 'turnz'"),
        ("returns None", r"returned NoneType, not the dict"),
        ("keeps the old field", r"field\(s\) \['turns'\].*data\.pop\('turns'\)|del data\['turns'\]"),
        ("wrong type", r"field\(s\) \['turn_count'\]"),
    ],
)
@pytest.mark.parametrize("crashed", [True, False], ids=["crashed-run", "finished-run"])
def test_failed_migration_is_a_clear_error_and_writes_nothing(
    local_store: pk.Store, bug: str, message: str, crashed: bool
) -> None:
    store = local_store
    tid = uid("badmig")
    kwargs: dict[str, Any] = {"crash_after": _crash_at(2)} if crashed else {}
    with pytest.raises(Crash) if crashed else _nothing():
        run_agent(store, tid, "rename", 1, effect=lambda i: None, **kwargs)

    class Broken(pk.State, name="tests.migrate_agent.rename", version=2):
        turn_count: int = 0
        log: list[str] = []

    @pk.migration(Broken, from_version=1)
    def buggy_upgrade(data: dict[str, Any]) -> Any:
        if bug == "raises":
            data["turn_count"] = data.pop("turnz")
        elif bug == "returns None":
            data["turn_count"] = data.pop("turns")
            return None
        elif bug == "keeps the old field":
            data["turn_count"] = data["turns"]
        else:
            data["turn_count"] = [data.pop("turns")]
        return data

    before = _snapshot(store, tid)
    ran: list[int] = []

    @pk.checkpointed(name="turn")
    def turn(i: int) -> int:
        ran.append(i)
        return i * i

    for _ in range(2):  # and again: the thread is not damaged by the first attempt
        with pytest.raises(pk.SchemaVersionError, match=message) as err, pk.resume(tid, store=store, state=Broken):
            for i in range(STEPS):
                turn(i)
        text = str(err.value)
        assert isinstance(err.value, pk.PersistkitError)
        assert "buggy_upgrade" in text and "from_version=1" in text and repr(tid) in text
        assert "checkpoint " in text and "Nothing was written" in text
        assert _snapshot(store, tid) == before and ran == []
        with pytest.raises(pk.SchemaVersionError, match="buggy_upgrade"):
            store.get_state(tid, state=Broken)
    if crashed:  # the error comes from a replayed step: caught there, it does not let the run go on
        with pk.resume(tid, store=store, state=Broken):
            with pytest.raises(pk.SchemaVersionError):
                turn(0)
            with pytest.raises(pk.SchemaVersionError, match="cannot go on"):
                turn(1)
        assert _snapshot(store, tid) == before and ran == []
    # The fixed code resumes the thread as if nothing had happened.
    final = run_agent(store, tid, "rename", 2, effect=ran.append)
    assert final["state"]["turn_count"] == (STEPS if crashed else 2 * STEPS)


def _crash_at(k: int) -> Any:
    def crash(i: int) -> None:
        if i == k:
            raise Crash

    return crash


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
