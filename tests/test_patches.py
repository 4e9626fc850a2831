"""pk.patched / pk.deprecate_patch on every store: recorded, never guessed (docs/long-runs.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import uid

import persistkit as pk

BODIES: list[str] = []


class Crash(BaseException):
    """A process that dies: the block writes no end record."""


@pk.checkpointed
def step(name: str) -> str:
    BODIES.append(name)
    return name


@pk.checkpointed
def other(name: str) -> str:
    BODIES.append(name)
    return name


@pk.checkpointed
async def astep(name: str) -> str:
    BODIES.append(name)
    await asyncio.sleep(0)
    return name


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    BODIES.clear()
    yield


def _pt(store: pk.Store, thread: str, run_id: str) -> list[list[str]]:
    """The ``pt`` keys of a run's records, oldest first (read through the protocol)."""
    from persistkit.state._records import Record

    rows = store.backend.list(thread, "", run_id=run_id)
    return [Record.decode(store.codec, r).body.get("pt") for r in reversed(rows)]


def test_outside_a_run_and_bad_ids() -> None:
    assert pk.patched("anything") is True
    assert pk.deprecate_patch("anything") is None
    for bad in ("", None, 3, "x" * 201):
        with pytest.raises(pk.ConfigurationError, match="patch id"):
            pk.patched(bad)  # type: ignore[arg-type]
        with pytest.raises(pk.ConfigurationError, match="patch id"):
            pk.deprecate_patch(bad)  # type: ignore[arg-type]


def test_live_answer_rides_on_the_next_checkpoint(store: pk.Store) -> None:
    t = uid("pt")
    with pk.resume(t, store=store, run_id="r"):
        step("a")
        assert pk.patched("p1") and pk.patched("p2") and pk.patched("p1")
        step("b")
        step("c")
    assert _pt(store, t, "r") == [None, ["p1", "p2"], None, None]  # a, b (+ids), c, end


def test_id_reached_before_the_end_rides_on_the_end_record(store: pk.Store) -> None:
    t = uid("pt")
    with pk.resume(t, store=store, run_id="r"):
        step("a")
        assert pk.patched("last")
    assert _pt(store, t, "r") == [None, ["last"]]
    with pk.resume(t, store=store, run_id="r"):  # read-only replay of the completed run
        step("a")
        assert pk.patched("last")


def test_old_run_in_a_loop_keeps_one_answer(store: pk.Store) -> None:
    t = uid("pt")

    def block(new: bool, crash_at: int | None) -> list[str]:
        out = []
        with pk.resume(t, store=store, run_id="r"):
            for i in range(4):
                out.append(step(f"new{i}") if new and pk.patched("loop") else step(f"old{i}"))
                if i == crash_at:
                    raise Crash
        return out

    with pytest.raises(Crash):
        block(False, 1)
    BODIES.clear()
    assert block(True, None) == ["old0", "old1", "old2", "old3"]  # False at i=0, and for the whole block
    assert BODIES == ["old2", "old3"]
    assert all(p is None for p in _pt(store, t, "r"))


def test_completed_old_run_replayed_read_only_takes_the_old_path(store: pk.Store) -> None:
    t = uid("pt")
    with pk.resume(t, store=store, run_id="r"):
        step("a")
    with pk.resume(t, store=store, run_id="r") as run:  # a redelivery, after the deploy
        step("a")
        assert not pk.patched("p")
        with pytest.raises(pk.NonDeterminismError, match=r"pk\.deprecate_patch"):
            pk.deprecate_patch("p")
    assert run.replay_only and BODIES == ["a"]


def test_crash_before_the_id_landed_decides_again_live(store: pk.Store) -> None:
    t = uid("pt")
    with pytest.raises(Crash), pk.resume(t, store=store, run_id="r"):
        step("a")
        assert pk.patched("p")
        raise Crash  # the id never reached the store
    assert _pt(store, t, "r") == [None]
    with pk.resume(t, store=store, run_id="r"):
        step("a")
        assert pk.patched("p")  # nothing recorded past this point: live, True again
        step("b")
    assert ["p"] in _pt(store, t, "r")


def test_recorded_failure_past_the_point_is_old(store: pk.Store) -> None:
    """A step whose failure ended the attempt was reached by old code: the retry is old."""
    t = uid("pt")

    @pk.checkpointed
    def boom() -> None:
        raise ValueError("down")

    with pytest.raises(ValueError), pk.resume(t, store=store, run_id="r"):
        step("a")
        boom()
    with pk.resume(t, store=store, run_id="r"):
        step("a")
        assert not pk.patched("p")


def test_deprecate_patch(store: pk.Store) -> None:
    t_new, t_old = uid("dp"), uid("dp")
    with pk.resume(t_new, store=store, run_id="r"):  # started under code with pk.patched
        step("a")
        assert pk.patched("p")
        step("b")
    with pytest.raises(Crash), pk.resume(t_old, store=store, run_id="r"):  # before the patch
        step("a")
        step("old")
        raise Crash
    with pk.resume(t_new, store=store, run_id="r"):  # replays: the id is recorded
        step("a")
        pk.deprecate_patch("p")
        step("b")
    with pytest.raises(pk.NonDeterminismError) as err, pk.resume(t_old, store=store, run_id="r"):
        step("a")
        pk.deprecate_patch("p")
    assert err.value.position == "1" and "replay-check" in str(err.value)
    t_live = uid("dp")
    with pk.resume(t_live, store=store, run_id="r"):
        pk.deprecate_patch("p")  # live: recorded like patched, so a rollback still takes the new path
        step("n")
    assert _pt(store, t_live, "r")[0] == ["p"]


def test_concurrent_async_branches(store: pk.Store) -> None:
    """Branches of a gather (each a step: its children number in its own scope)."""
    t_old, t_new = uid("pa"), uid("pa")

    async def block(thread: str, new: bool, crash: bool) -> list[str]:
        x_done = asyncio.Event()

        @pk.checkpointed(name="branch")
        async def branch(name: str) -> list[str]:
            out = [await astep(f"{name}0")]
            if new and pk.patched("fan"):
                out.append(await astep(f"{name}-new"))
            else:
                out.append(await astep(f"{name}-old"))
            if name == "x":
                x_done.set()
            elif crash:
                await x_done.wait()
                raise Crash  # y dies after its second step, x has completed
            return out

        async with pk.resume(thread, store=store, run_id="r"):
            got = await asyncio.gather(branch("x"), branch("y"))
            return [*got[0], *got[1]]

    with pytest.raises(Crash):
        asyncio.run(block(t_old, False, True))
    BODIES.clear()
    assert asyncio.run(block(t_old, True, False)) == ["x0", "x-old", "y0", "y-old"]
    assert BODIES == []  # x replayed whole, y re-entered and replayed its children
    assert asyncio.run(block(t_new, True, False)) == ["x0", "x-new", "y0", "y-new"]
    BODIES.clear()
    assert asyncio.run(block(t_new, True, False)) == ["x0", "x-new", "y0", "y-new"]
    assert BODIES == []


def test_nested_step_and_ancestors(store: pk.Store) -> None:
    """Inside a re-entered step, its replayed children and its ancestors are reached."""
    t = uid("pn")
    seen: list[bool] = []

    @pk.checkpointed
    def parent(crash: bool) -> None:
        step("c0")
        seen.append(pk.patched("inner"))
        step("c1")
        if crash:
            raise Crash

    with pytest.raises(Crash), pk.resume(t, store=store, run_id="r"):
        step("a")
        parent(True)
    with pk.resume(t, store=store, run_id="r"):
        step("a")
        parent(False)
    assert seen == [True, True]


class V1(pk.State, version=1, name="patchmig"):
    items: list[str] = []


class V2(pk.State, version=2, name="patchmig"):
    entries: list[str] = []


@pk.migration(V2, from_version=1)
def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    return {"entries": data.pop("items", [])}


def test_run_opened_after_a_state_migration(store: pk.Store) -> None:
    t_old = uid("pm")
    with pytest.raises(Crash), pk.resume(t_old, store=store, state=V1, run_id="r") as run:
        run.state.items.append(step("a"))
        run.state.items.append(step("old"))
        raise Crash

    def v2(thread: str) -> list[str]:
        with pk.resume(thread, store=store, state=V2, run_id="r") as run:
            run.state.entries.append(step("a"))
            run.state.entries.append(step("new") if pk.patched("mig") else step("old"))
            return list(run.state.entries)

    BODIES.clear()
    assert v2(t_old) == ["a", "old"] and BODIES == []
    assert v2(uid("pm")) == ["a", "new"]


def test_nondeterminism_error_names_step_position_and_remedies(store: pk.Store) -> None:
    t = uid("nd")
    with pytest.raises(Crash), pk.resume(t, store=store, run_id="r"):
        step("a")
        step("b")
        raise Crash
    with pytest.raises(pk.NonDeterminismError) as err, pk.resume(t, store=store, run_id="r"):
        step("a")
        other("b")
    msg = str(err.value)
    assert (err.value.position, err.value.step) == ("1", "other")
    for remedy in ("at step position 1", "finish this run with the code that started it", "pk.patched(",
                   "replay-check", "new run_id", "store.fork("):
        assert remedy in msg, remedy


@pytest.mark.skipif(not hasattr(pk, "suspend"), reason="pk.suspend is another part of issue 21, not merged here yet")
def test_suspended_run_across_a_deploy(store: pk.Store) -> None:
    """An old run suspended before the deploy finishes on the old path after its answer;
    the replay check says it waits (then, answered, continues) and needs the old path."""
    suspend: Any = getattr(pk, "suspend")  # noqa: B009 (typed once pk.suspend is merged)
    t_old, t_new = uid("ps"), uid("ps")

    def v1(thread_id: str, run_id: str, store: pk.Store) -> str:
        with pk.resume(thread_id, store=store, run_id=run_id) as run:
            step("a")
            step("old")
            step(f"after-{suspend('ok?')}")
        return str(run.status)

    def v2(thread_id: str, run_id: str, store: pk.Store, guarded: bool = True) -> str:
        with pk.resume(thread_id, store=store, run_id=run_id) as run:
            step("a")
            step("new" if not guarded or pk.patched("p") else "old")
            step(f"after-{suspend('ok?')}")
        return str(run.status)

    def unguarded(thread_id: str, run_id: str, store: pk.Store) -> str:
        return v2(thread_id, run_id, store, guarded=False)

    assert v1(t_old, "r", store) == "suspended"
    before = store_bytes_of(store, t_old)
    (run,) = store.check_replay(v2, threads=[t_old]).runs
    assert (run.status, run.outcome, run.old_patches) == ("suspended", "waits", ("p",))
    (run,) = store.check_replay(unguarded, threads=[t_old]).runs
    assert (run.outcome, run.position, run.error_type) == ("stops", "1", "NonDeterminismError")
    assert store_bytes_of(store, t_old) == before
    store.answer(t_old, "yes")
    (run,) = store.check_replay(v2, threads=[t_old]).runs
    assert (run.outcome, run.position, run.old_patches) == ("continues", "3", ("p",))
    BODIES.clear()
    assert v2(t_old, "r", store) == "completed" and BODIES == ["after-yes"]
    assert v2(t_new, "r", store) == "suspended"
    store.answer(t_new, "sure")
    BODIES.clear()
    assert v2(t_new, "r", store) == "completed" and BODIES == ["after-sure"]
    assert ["p"] in _pt(store, t_new, "r")


def store_bytes_of(store: pk.Store, thread: str) -> Any:
    from persistkit.testing.patch_suite import store_bytes

    return store_bytes(store, thread)
