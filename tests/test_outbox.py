"""After-commit effects (``run.after_commit``): registration, retries, keys, records, the CLI.

The crash and drain guarantees on every store are in the shipped conformance suite
(``persistkit/testing/outbox_suite.py``, run by ``test_outbox_conformance.py``); the same
with SIGKILL in ``test_outbox_processes.py``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import pickle
import shutil
import uuid
from typing import Any

import pytest

import persistkit as pk
from persistkit._cli import main as cli
from persistkit.coordination import _outbox as ob
from persistkit.state._records import _check_body

CALLS: list[tuple[str, Any]] = []
FAILS: dict[str, int] = {}


@pk.register
def record(tag: str, value: Any = None) -> None:
    """An effect without a key parameter: it reads pk.current_effect()."""
    info = pk.current_effect()
    assert info is not None
    CALLS.append((tag, (value, info.key, info.attempt, pk.current_step())))


@pk.register
def flaky(tag: str) -> None:
    if FAILS.get(tag, 0) > 0:
        FAILS[tag] -= 1
        raise ConnectionError(f"{tag}: try again")
    CALLS.append((tag, pk.current_effect().attempt))  # type: ignore[union-attr]


@pk.checkpointed
def inner(tag: str) -> str:
    return tag


@pk.register
def calls_a_step(tag: str) -> None:
    """An effect is no step: a @checkpointed call inside it is a plain call."""
    CALLS.append((tag, inner(tag)))


@pk.register
async def arecord(tag: str, idempotency_key: str) -> None:
    await asyncio.sleep(0)
    CALLS.append((tag, idempotency_key))


def mine(tag: str) -> list[Any]:
    return [v for t, v in CALLS if t == tag]


def tag() -> str:
    return uuid.uuid4().hex


@pk.checkpointed
def register(fn: Any, *args: Any, **kwargs: Any) -> None:
    pk.after_commit(fn, *args, **kwargs)


# -- registration refusals ---------------------------------------------------------------


def test_a_lambda_a_closure_a_bound_method_and_a_partial_are_refused(local_store: pk.Store) -> None:
    def nested(x: int) -> None: ...

    class Client:
        def post(self) -> None: ...

    with pk.resume(tag(), store=local_store):
        for fn, words in [
            (lambda: None, "is a lambda"),
            (nested, "defined inside another function"),
            (Client().post, "bound method"),
            (functools.partial(record, "x"), "functools.partial cannot be stored"),
            (42, "takes a function"),
            (print, "not a Python function of your code"),  # a builtin: never called by name
            (shutil.rmtree, "standard library"),  # a store writer could call it with any path
            (mine, "not registered"),  # resumed elsewhere, it could not be called: refused now
        ]:
            with pytest.raises(pk.ConfigurationError, match=words):
                register(fn)
    with pytest.raises(pk.ConfigurationError, match="defined inside another function"):
        ob.effect_name(nested)


def test_it_is_refused_outside_a_step_and_outside_a_run(local_store: pk.Store) -> None:
    with pytest.raises(pk.ConfigurationError, match=r"outside a pk\.resume block"):
        pk.after_commit(record, "x")
    with pk.resume(tag(), store=local_store) as run:
        with pytest.raises(pk.ConfigurationError, match="outside any step"):
            run.after_commit(record, "x")
        with pytest.raises(pk.ConfigurationError, match="do not pass one"):
            register(record, "x", idempotency_key="mine")
        with pytest.raises(pk.ConfigurationError, match=r"expected pk\.Retry"):
            register(record, "x", retry=3)
        with pytest.raises(pk.SerializationError):
            register(record, "x", object())  # arguments are stored: refused when registered


def test_an_async_effect_needs_an_async_run(local_store: pk.Store) -> None:
    with pk.resume(tag(), store=local_store), pytest.raises(pk.ConfigurationError, match="needs an async run"):
        register(arecord, "x")


def test_a_replaced_name_is_refused() -> None:
    def impostor() -> None: ...

    impostor.__module__, impostor.__qualname__ = __name__, "record"
    with pytest.raises(pk.ConfigurationError, match="does not name this function"):
        ob.effect_name(impostor)


def test_a_stored_name_resolves_only_to_a_registered_function() -> None:
    codec = pk.connect("memory://").codec
    with pytest.raises(pk.EffectError, match="standard library") as refused:
        ob.resolve("os:system", codec, "here")
    assert "may be forged" in str(refused.value) and "allow_modules" not in str(refused.value)
    with pytest.raises(pk.EffectError, match="may be forged"):
        ob.resolve("os:<lambda>", codec, "here")
    with pytest.raises(pk.ConfigurationError, match="standard library cannot be allowlisted"):
        pk.connect("memory://", allow_modules=["json"])
    assert ob.resolve(f"{__name__}:record", codec, "here") is record
    # defined in this (allowlisted) module, but not registered: a stored record never calls it
    with pytest.raises(pk.EffectError, match=r"put @pk\.register on it"):
        ob.resolve(f"{__name__}:mine", codec, "here")
    with pytest.raises(pk.EffectError, match="no function"):
        ob.resolve(f"{__name__}:nothing_here", codec, "here")


# -- running ------------------------------------------------------------------------------


def test_effects_run_in_order_after_each_step_with_their_context(store: pk.Store) -> None:
    t = tag()
    with pk.resume(t, store=store) as run:
        register(record, t, 1)
        assert len(mine(t)) == 1
        register(record, t, 2)
        register(calls_a_step, t + "-inner")
    values = mine(t)
    assert [v[0] for v in values] == [1, 2]
    assert values[0][1] != values[1][1] and values[0][2] == 1
    assert all(v[3] is None for v in values)  # not inside a step
    assert mine(t + "-inner") == [t + "-inner"]
    assert [s.name for s in run.steps].count("inner") == 0  # the effect's call was not recorded
    assert pk.current_effect() is None


def test_a_nested_steps_effect_runs_when_the_child_commits(local_store: pk.Store) -> None:
    t = tag()

    @pk.checkpointed
    def parent() -> int:
        register(record, t, "child")
        return len(mine(t))

    with pk.resume(t, store=local_store):
        assert parent() == 1


def test_a_failed_attempt_of_a_retried_step_does_not_commit_its_effects(local_store: pk.Store) -> None:
    t = tag()
    attempts: list[int] = []

    @pk.checkpointed(retry=pk.Retry(attempts=3, wait_initial=0, wait_max=0, wait_jitter=0))
    def step() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            pk.after_commit(record, t, "first attempt")
            raise ConnectionError("flaky")
        if len(attempts) == 2:
            pk.after_commit(record, t, "second attempt")

    with pk.resume(t, store=local_store):
        step()
    assert [v[0] for v in mine(t)] == ["second attempt"]
    assert local_store.drain_outbox(thread_id=t, dry_run=True).pending == ()


def test_an_effect_is_retried_under_its_policy(store: pk.Store) -> None:
    t = tag()
    FAILS[t] = 2
    with pk.resume(t, store=store):
        register(flaky, t, retry=pk.Retry(attempts=3, wait_initial=0, wait_max=0, wait_jitter=0))
    assert mine(t) == [3]
    FAILS[t] = 10  # the default policy: 3 attempts
    with pytest.raises(pk.EffectError) as err, pk.resume(t, store=store):
        register(flaky, t)
    assert FAILS[t] == 7 and "after 3 attempt(s)" in str(err.value)
    again = pickle.loads(pickle.dumps(err.value))
    assert (again.key, again.function, again.position, str(again)) == (
        err.value.key, err.value.function, err.value.position, str(err.value))
    assert err.value.function.endswith(":flaky")


def test_async_effects_in_async_runs(store: pk.Store) -> None:
    t = tag()

    @pk.checkpointed
    async def step() -> None:
        pk.after_commit(arecord, t)
        pk.after_commit(record, t, "sync one in an async run")

    async def main() -> None:
        async with pk.resume(t, store=store, run_id="r1"):
            await step()
            assert len(mine(t)) == 2

    asyncio.run(main())
    key = mine(t)[0]
    assert key == ob.effect_key(t, "r1", "0", 0) and mine(t)[1][1] == ob.effect_key(t, "r1", "0", 1)


def test_an_async_effect_from_a_sync_step_in_an_async_run_stays_pending(local_store: pk.Store) -> None:
    t = tag()

    @pk.checkpointed
    def sync_step() -> None:
        pk.after_commit(arecord, t)

    async def main() -> None:
        async with pk.resume(t, store=local_store):
            with pytest.raises(pk.ConfigurationError, match="cannot be awaited"):
                sync_step()

    asyncio.run(main())
    assert mine(t) == []
    assert len(local_store.drain_outbox(thread_id=t).done) == 1  # a sync drain runs it (no loop here)
    assert mine(t) == [ob.effect_key(t, local_store.history(t)[-1].run_id or "", "0", 0)]


# -- records ------------------------------------------------------------------------------


def test_the_record_keys_are_checked() -> None:
    step = {"k": "step", "p": "0", "n": "s", "s": "completed"}
    assert _check_body({**step, "ac": [{"f": "m:f", "a": None}], "ad": ["x.0"]}) is None
    assert _check_body({**step, "ac": [{"f": 1, "a": None}]}) == "field 'ac' is malformed"
    assert _check_body({**step, "ac": {"f": "m:f"}}) == "field 'ac' is malformed"
    assert _check_body({**step, "ad": [1]}) == "field 'ad' is malformed"


def test_the_done_mark_is_written_as_the_effects_ran(local_store: pk.Store) -> None:
    """Right after the step's effects ran (not with the next step: a crash during that step
    would run them again), a copy of the step's record carries their ids (``dm``)."""
    t = tag()
    with pk.resume(t, store=local_store) as run:
        register(record, t, 1)
        inner("next")
    rows = [r for r in local_store.backend.list(t, "")]
    bodies = [local_store.codec.unpack_tree(r.payload, "") for r in reversed(rows)]
    assert [("ac" in b, b.get("ad"), b.get("dm"), b.get("n")) for b in bodies] == [
        (True, None, None, bodies[0]["n"]), (False, [f"{rows[-1].checkpoint_id}.0"], 1, bodies[0]["n"]),
        (False, None, None, bodies[2]["n"]), (False, None, None, None),
    ]
    assert [s.name for s in run.steps] == [bodies[0]["n"], bodies[2]["n"]]  # the mark is no step
    with pk.resume(t, store=local_store, run_id=run.run_id) as again:  # replays as recorded
        register(record, t, 1)
        inner("next")
    assert [s.replayed for s in again.steps] == [True, True]


# -- the CLI ------------------------------------------------------------------------------


class _Crash(BaseException):
    pass


@pk.register
def crash_once(t: str) -> None:
    if FAILS.get(t) == -1:
        FAILS[t] = 0
        raise _Crash
    CALLS.append((t, "posted"))


def test_the_cli_lists_and_drains(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    store = pk.connect(url)
    t = tag()
    FAILS[t] = -1
    with pytest.raises(_Crash), pk.resume(t, store=store):
        register(crash_once, t)
    store.close()
    assert cli(["drain-outbox", "--url", url, "--dry-run", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(e["status"], e["thread"], e["function"].rpartition(":")[2]) for e in listed["effects"]] == [
        ("pending", t, "crash_once")]
    assert cli(["drain-outbox", "--url", url, "--import", __name__]) == 0
    assert "1 effect(s) run" in capsys.readouterr().out and mine(t) == ["posted"]
    assert cli(["drain-outbox", "--url", url, "--thread", t]) == 0
    assert "0 effect(s) run" in capsys.readouterr().out


@pk.register
def broken(tag: str) -> None:
    raise pk.NotFoundError(f"{tag}: the channel is gone")


@pk.register
async def abroken(tag: str) -> None:
    raise RuntimeError(f"{tag}: down")


def test_an_effect_raising_a_persistkit_error_is_an_effect_error_too(local_store: pk.Store) -> None:
    t = tag()
    with pytest.raises(pk.EffectError) as err, pk.resume(t, store=local_store):
        register(broken, t)
    assert isinstance(err.value.__cause__, pk.NotFoundError) and "after 1 attempt(s)" in str(err.value)
    assert len(local_store.drain_outbox(thread_id=t, dry_run=True).pending) == 1


def test_an_async_effect_that_fails_for_good(store: pk.Store) -> None:
    t = tag()

    @pk.checkpointed
    async def step() -> str:
        pk.after_commit(abroken, t, retry=pk.Retry(attempts=2, wait_initial=0, wait_max=0, wait_jitter=0))
        return "committed"

    async def main() -> None:
        with pytest.raises(pk.EffectError) as err:
            async with pk.resume(t, store=store, run_id="r1"):
                await step()
        assert isinstance(err.value.__cause__, RuntimeError) and "after 2 attempt(s)" in str(err.value)
        report = await store.adrain_outbox(thread_id=t)
        assert not report.ok and report.failed[0].key == err.value.key == ob.effect_key(t, "r1", "0", 0)

    asyncio.run(main())
    assert [c.status for c in store.history(t) if c.kind == "step"] == ["completed"]


def test_keys_differ_between_namespaces(local_store: pk.Store) -> None:
    """The same thread and run id in two namespaces (two tenants) never share an idempotency
    key, of a step or of an effect: a receiver that deduplicates by key would drop the second
    tenant's call (found from outside). The default namespace keeps the keys it always had."""
    import hashlib

    t, step_keys = tag(), []
    KEYS_SEEN.clear()
    for ns in ("", "tenant-a", "tenant-b"):
        with pk.resume(t, store=local_store, run_id="same", namespace=ns):
            step_keys.append(_keys_step())
    assert len(set(step_keys)) == 3 and len(set(KEYS_SEEN)) == 3
    assert step_keys[0] == "pk-" + hashlib.blake2b(f"{t}\x00same\x000".encode(), digest_size=16).hexdigest()


KEYS_SEEN: list[str] = []


@pk.register
def _key_effect(*, idempotency_key: str) -> None:
    KEYS_SEEN.append(idempotency_key)


@pk.checkpointed(name="outbox.keys_step")
def _keys_step() -> str:
    step = pk.current_step()
    assert step is not None
    pk.after_commit(_key_effect)
    return step.key
