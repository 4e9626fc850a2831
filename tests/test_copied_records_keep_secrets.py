"""Records written by copying stored ones keep their secrets as handles.

An answer (``store.answer``), an abandon, a drain's done mark and retention's rooted lists
copy state refs or list items from stored records, where a secret is already a handle.
Redacting them again would escape the handle into plain text: the next step would get
``"$CRED{name}"`` instead of the key, for good (found from outside: an answered run's
state lost its registered secret). Each case: the step after it is handed the live key.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import persistkit as pk

SECRET = "sk-proj-CopyQ81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7jKq"
HANDED: list[bool] = []


class _Crash(BaseException):
    """A process that dies."""


@pytest.fixture(autouse=True)
def _secret() -> None:
    pk.secrets.register("copied_key", SECRET)
    HANDED.clear()


@pytest.fixture(params=["memory", "sqlite", "sqlite+keys"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> pk.Store:
    if request.param == "memory":
        return pk.connect(f"memory://copied-{uuid.uuid4().hex[:8]}")
    keys = {"encryption": {"e": bytes(range(32))}, "integrity": {"m": bytes(range(40, 72))}} if "keys" in request.param else {}
    return pk.connect(f"sqlite:///{tmp_path}/c.db", **keys)


@pk.checkpointed
def use(token: str) -> bool:
    HANDED.append(token == SECRET)
    return token == SECRET


@pk.checkpointed
def crash_here() -> None:
    raise _Crash


def _later_turn(store: pk.Store, t: str) -> None:
    with pk.resume(t, store=store, state={}) as run:
        assert run.state["token"] == SECRET
        use(run.state["token"])
    assert HANDED[-1] is True


def test_an_answered_run_hands_the_live_key_on(store: pk.Store) -> None:
    t = f"ans-{uuid.uuid4().hex[:8]}"

    def agent() -> object:
        with pk.resume(t, store=store, state={"token": SECRET}) as run:
            answer = pk.suspend("approve?")
            use(run.state["token"])
            return answer

    assert agent() is None
    store.answer(t, "yes")
    assert agent() == "yes"
    assert HANDED == [True]
    _later_turn(store, t)


def test_an_abandoned_run_leaves_the_live_key(store: pk.Store) -> None:
    t = f"ab-{uuid.uuid4().hex[:8]}"
    with pytest.raises(_Crash), pk.resume(t, store=store, state={"token": SECRET}, run_id="dead") as run:
        use(run.state["token"])
        crash_here()
    store.abandon(t, "dead")
    _later_turn(store, t)


def test_a_drained_effect_leaves_the_live_key(store: pk.Store) -> None:
    t = f"dr-{uuid.uuid4().hex[:8]}"
    DIE_IN_EFFECT.append(True)  # the process dies after the step's commit, before its effect ran
    with pytest.raises(_Crash), pk.resume(t, store=store, state={"token": SECRET}):
        effect_step()
    assert len(store.drain_outbox(thread_id=t, dry_run=True).pending) == 1
    assert store.drain_outbox(thread_id=t).ok
    assert len(store.drain_outbox(thread_id=t, dry_run=True).pending) == 0
    with pk.resume(t, store=store, state={"token": SECRET}) as run:  # the crashed run ends: replayed
        effect_step()
        use(run.state["token"])
    assert HANDED == [True]
    _later_turn(store, t)


DIE_IN_EFFECT: list[bool] = []


@pk.register
def posted(x: int) -> None:
    """The effect: the first call dies (a kill between the commit and the effect)."""
    if DIE_IN_EFFECT:
        DIE_IN_EFFECT.clear()
        raise _Crash


@pk.checkpointed
def effect_step() -> int:
    pk.after_commit(posted, 1)
    return 1


def test_a_rooted_list_keeps_its_items_keys(store: pk.Store) -> None:
    t = f"root-{uuid.uuid4().hex[:8]}"
    for turn in range(3):
        with pk.resume(t, store=store, state={"log": [], "token": SECRET}) as run:
            for i in range(2):
                run.state["log"].append(f"call {turn}.{i} with {SECRET}")
                use(run.state["token"])
    assert store.prune(pk.Retention(keep_last=1), thread_id=t).lists_rooted >= 1
    log = store.get_state(t)["log"]  # read outside a run: handles, not escaped text
    assert len(log) == 6 and all(line.endswith(" with $CRED{copied_key}") for line in log), log
    with pk.resume(t, store=store, state={}) as run:  # inside a run: the live key
        assert all(line.endswith(f" with {SECRET}") for line in run.state["log"])
    _later_turn(store, t)


def test_an_effect_run_by_the_next_resume_leaves_the_live_key(store: pk.Store) -> None:
    """The resume runs the pending effect and marks it done: a copy of the head it read back."""
    t = f"rs-{uuid.uuid4().hex[:8]}"
    DIE_IN_EFFECT.append(True)
    with pytest.raises(_Crash), pk.resume(t, store=store, state={"token": SECRET}):
        effect_step()
    with pk.resume(t, store=store, state={"token": SECRET}) as run:
        effect_step()
        use(run.state["token"])
    assert len(store.drain_outbox(thread_id=t, dry_run=True).pending) == 0
    assert HANDED == [True]
    _later_turn(store, t)
