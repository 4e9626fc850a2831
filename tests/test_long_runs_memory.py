"""Long runs with bounded memory (issue 23): what a run and a load keep is O(what a replay
still needs), not O(the thread's length).

Structural, not timed: the run's row cache and replay index are counted after many steps;
a resume of a long thread replays correctly with them bounded; tracemalloc's peak of a long
run stays within twice the state it builds. ``bench/bench_long_run.py`` measures RSS and time.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit.state import _channels
from persistkit.state._channels import Loader
from persistkit.state._spec import StateSpec

STEPS = 600  # more than two pages of a chain walk (256 rows a page)


@pk.checkpointed(name="tests.long.say")
def say(text: str) -> int:
    run = pk.current_run()
    assert run is not None
    run.state.setdefault("messages", []).append(text)
    return len(run.state["messages"])


@pk.checkpointed(name="tests.long.reply")
def reply(i: int) -> dict[str, Any]:
    return {"role": "assistant", "content": f"reply {i} " + "x" * 120}  # over the reference threshold


def _text(i: int) -> str:
    return f"{i:06d}" + "m" * 90


def _bodies(run: Any) -> int:
    return len(run._loader.rows)


def test_a_live_run_keeps_o1_bodies_and_records(local_store: pk.Store) -> None:
    t = uid()
    sizes = []
    with pk.resume(t, store=local_store) as run:
        for i in range(STEPS):
            say(_text(i))
            if i in (10, STEPS - 1):
                sizes.append((_bodies(run), len(run._index), len(run._loader.raw)))
        assert run.state["messages"] == [_text(i) for i in range(STEPS)]
        # the cached chain holds the committed items once, and every segment's end
        chains = [c for (name, _, plain), c in run._loader.chains.items() if name == "messages" and not plain]
        assert len(chains) == 1 and chains[0][0] == run.state["messages"]
        assert len(chains[0][1]) == STEPS
    assert sizes[0] == sizes[1]  # nothing grew with the number of steps
    assert sizes[1][0] <= 1 and sizes[1][1] <= 1 and sizes[1][2] == 0
    assert len(run.steps) == STEPS  # the public step list is still complete
    assert local_store.get_state(t)["messages"] == [_text(i) for i in range(STEPS)]


def test_nested_steps_are_forgotten_once_their_parent_completed(local_store: pk.Store) -> None:
    @pk.checkpointed(name="tests.long.turn")
    def turn(i: int) -> int:
        say(_text(i))
        say(_text(i) + "!")
        return i

    with pk.resume(uid(), store=local_store) as run:
        for i in range(50):
            turn(i)
            assert len(run._index) <= 1 and _bodies(run) <= 1
        assert len(run.state["messages"]) == 100


def test_resume_of_a_long_thread_loads_without_keeping_bodies(local_store: pk.Store) -> None:
    t = uid()
    with pk.resume(t, store=local_store):
        for i in range(STEPS):
            say(_text(i))
    with pk.resume(t, store=local_store) as run:  # a new run from the head's state
        assert _bodies(run) <= 2  # the head (and base) only, not one per row walked
        assert run.state["messages"] == [_text(i) for i in range(STEPS)]
        say("one more")
    assert local_store.get_state(t)["messages"][-2:] == [_text(STEPS - 1), "one more"]
    # get_state walks the same chain: its loader keeps segments, not bodies
    rec = local_store.run_sync(local_store.read_record(t, "", None))
    loader = Loader(local_store.codec, t)
    state = local_store.run_sync(local_store.load_state(rec, StateSpec(None), loader))
    assert len(state["messages"]) == STEPS + 1
    assert len(loader.rows) == 1  # the record it was asked for


def test_a_crashed_long_run_replays_every_step_with_bounded_caches(store: pk.Store) -> None:
    t, rid, n = uid(), uid("r"), 300

    class Crash(Exception):
        pass

    with pytest.raises(Crash), pk.resume(t, store=store, run_id=rid):
        for i in range(n):
            say(_text(i))
        raise Crash
    seen: list[int] = []
    with pk.resume(t, store=store, run_id=rid, retry_failed=True) as run:
        for i in range(n):
            assert say(_text(i)) == i + 1  # replayed: the recorded result
            assert run.state["messages"] == [_text(k) for k in range(i + 1)]  # the state at that step
            seen.append(i)
        assert all(s.replayed for s in run.steps)
        say("live")
        assert not run.steps[-1].replayed
    assert store.get_state(t)["messages"][-1] == "live"


@pytest.mark.parametrize("page", [7, 64, 1024])
def test_results_appended_as_references_across_pages(
    local_store: pk.Store, page: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent loop (a step's result appended by the caller) stores references to the
    result (``_dedupe``): a chain walk that drops bodies resolves them as each parent row
    is read, and keeps a body only where a page ends between a row and its parent."""
    monkeypatch.setattr(_channels, "_ROW_PAGE", page)
    t = uid()
    with pk.resume(t, store=local_store) as run:
        for i in range(STEPS):
            run.state.setdefault("messages", []).append(reply(i))
    want = [reply.__wrapped__(i) for i in range(STEPS)]  # type: ignore[attr-defined]
    assert local_store.get_state(t)["messages"] == want
    with pk.resume(t, store=local_store) as run:
        assert run.state["messages"] == want
        assert _bodies(run) <= 2 * (STEPS // page + 2)


def test_a_retried_parent_replays_children_as_committed(local_store: pk.Store) -> None:
    """A retried parent calls its children again: they replay the state committed with them
    (the newest item as stored, even if it was edited in place after its commit), also
    after the run went another way than a replayed state (a segment off the cached chain)."""
    attempts = {"n": 0}

    @pk.checkpointed(name="tests.long.add")
    def add(item: dict[str, Any]) -> int:
        run = pk.current_run()
        assert run is not None
        run.state["messages"].append(item)
        return len(run.state["messages"])

    @pk.checkpointed(name="tests.long.edit")
    def edit() -> None:
        run = pk.current_run()
        assert run is not None
        run.state["messages"][-1]["edited"] = True  # in place, after its commit
        raise ValueError("edit failed")

    @pk.checkpointed(name="tests.long.parent", retry=pk.Retry(attempts=3, wait_initial=0, wait_max=0, wait_jitter=0))
    def parent() -> list[Any]:
        attempts["n"] += 1
        run = pk.current_run()
        assert run is not None
        add({"v": 0})
        seen = [m if isinstance(m, str) else dict(m) for m in run.state["messages"]]
        if attempts["n"] == 1:
            edit()
        return seen

    with pk.resume(uid(), store=local_store) as run:
        run.state["messages"] = []
        say("before")
        got = parent()
        assert attempts["n"] == 2
        assert got == ["before", {"v": 0}]  # the second attempt replayed add: the item as committed
        assert run.state["messages"] == ["before", {"v": 0}]
        say("after")
        assert run.state["messages"] == ["before", {"v": 0}, "after"]


def test_tracemalloc_peak_of_a_long_run_is_within_twice_the_state(tmp_path: Any) -> None:
    store = pk.connect(f"sqlite:///{tmp_path}/long.db")
    steps, size = 1500, 1024
    state_bytes = steps * 2 * (size + 49)  # two 1 KB str objects a step (49 bytes of header each)
    try:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        with pk.resume(uid(), store=store) as run:
            for i in range(steps):
                text = f"{i:08d}".ljust(size, "a")
                say(text)
                run.state["messages"].append(text[::-1])
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
        store.close()
    assert len(run.state["messages"]) == steps * 2
    assert peak < 2 * state_bytes, f"peak {peak / 1e6:.1f} MB for {state_bytes / 1e6:.1f} MB of state"
