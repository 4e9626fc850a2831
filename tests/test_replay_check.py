"""store.check_replay / acheck_replay and `persistkit replay-check` on every store."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit._cli import main
from persistkit.codec import _functions
from persistkit.testing.patch_suite import store_bytes

BODIES: list[str] = []


class Crash(BaseException):
    """A process that dies: the block writes no end record."""


@dataclasses.dataclass
class Quote:
    amount: int


@pk.checkpointed
def step(name: str) -> str:
    BODIES.append(name)
    return name


@pk.checkpointed
async def astep(name: str) -> str:
    BODIES.append(name)
    await asyncio.sleep(0)
    return name


@pk.checkpointed
def quote(n: int) -> Quote:
    BODIES.append(f"quote{n}")
    return Quote(n)


@pk.checkpointed
def parent(crash: bool, child: str = "c1") -> str:
    step("c0")
    step(child)
    if crash:
        raise Crash
    step("c2")
    return "p"


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    BODIES.clear()
    yield


def _crash(store: pk.Store, thread: str, *names: str) -> None:
    with pytest.raises(Crash), pk.resume(thread, store=store, run_id="r"):
        for n in names:
            step(n)
        raise Crash


def _entry(*names: str, **kw: Any) -> Any:
    def entry(thread_id: str, run_id: str, store: pk.Store) -> None:
        with pk.resume(thread_id, store=store, run_id=run_id, **kw):
            for n in names:
                step(n)

    return entry


def test_only_waiting_runs_are_checked(store: pk.Store) -> None:
    p = uid("rc")
    _crash(store, f"{p}-a", "s0", "s1")
    with pk.resume(f"{p}-done", store=store, run_id="r"):
        step("s0")
    with pytest.raises(ValueError), pk.resume(f"{p}-failed", store=store, run_id="r"):
        step("s0")
        raise ValueError("between steps")
    before = store_bytes(store, p)
    BODIES.clear()
    report = store.check_replay(_entry("s0", "s1", "s2"), prefix=p)
    got = {r.thread_id: (r.status, r.outcome, r.position) for r in report.runs}
    assert got == {f"{p}-a": ("running", "continues", "2"), f"{p}-failed": ("failed", "continues", "1")}
    assert report.ok and BODIES == [] and store_bytes(store, p) == before
    only = store.check_replay(_entry("s0", "s1", "s2"), threads=[f"{p}-a", f"{p}-done", f"{p}-nothing"])
    assert [r.thread_id for r in only.runs] == [f"{p}-a"]


def test_code_after_the_block_never_runs_in_a_check(store: pk.Store) -> None:
    p = uid("rc")
    _crash(store, p, "s0")
    posted: list[str] = []

    def entry(thread_id: str, run_id: str, store: pk.Store) -> None:
        with pk.resume(thread_id, store=store, run_id=run_id):
            step("s0")
            with pk.resume(f"{thread_id}-sub", store=store):  # a nested block ends only itself
                pass
        posted.append("reply")  # e.g. post the reply: a check must not

    (run,) = store.check_replay(entry, threads=[p]).runs
    assert (run.outcome, posted) == ("completes", [])
    entry(p, "r", store)
    assert posted == ["reply"]
    assert store.check_replay(entry, threads=[p]).runs == ()


def test_changed_arguments_and_order(store: pk.Store) -> None:
    p = uid("rc")
    _crash(store, p, "s0", "s1", "s2")
    report = store.check_replay(_entry("s0", "CHANGED", "s2"), threads=[p])
    (run,) = report.runs
    assert (run.outcome, run.position, run.step, run.error_type) == ("stops", "1", "step", "NonDeterminismError")
    assert "different arguments" in (run.error or "")
    report = store.check_replay(_entry("s0", "s1"), threads=[p])  # fewer steps: completes
    assert [(r.outcome, r.ok) for r in report.runs] == [("completes", True)]

    def raises(thread_id: str, run_id: str, store: pk.Store) -> None:
        with pk.resume(thread_id, store=store, run_id=run_id):
            step("s0")
            raise KeyError("the new code's own bug")

    (run,) = store.check_replay(raises, threads=[p]).runs
    assert (run.outcome, run.position, run.step, run.error_type) == ("stops", "0", None, "KeyError")


def test_result_class_that_no_longer_loads(store: pk.Store) -> None:
    p = uid("rc")
    with pytest.raises(Crash), pk.resume(p, store=store, run_id="r"):
        quote(1)
        raise Crash

    def entry(thread_id: str, run_id: str, store: pk.Store) -> None:
        with pk.resume(thread_id, store=store, run_id=run_id):
            quote(1)

    before = store_bytes(store, p)
    fields = Quote.__dataclass_fields__
    saved = dict(fields)
    try:  # the class now has a required field the record does not hold
        fields["currency"] = dataclasses.field()
        fields["currency"].name, fields["currency"].type = "currency", str
        fields["currency"]._field_type = dataclasses._FIELD  # type: ignore[attr-defined]
        report = store.check_replay(entry, threads=[p])
    finally:
        fields.clear()
        fields.update(saved)
    (run,) = report.runs
    assert (run.outcome, run.position, run.error_type) == ("stops", "0", "SchemaVersionError")
    assert store_bytes(store, p) == before


def test_failing_state_migration(store: pk.Store) -> None:
    name = f"rcmig-{uid('x')}"

    class S1(pk.State, version=1, name=name):
        items: list[str] = []

    p = uid("rc")
    with pytest.raises(Crash), pk.resume(p, store=store, state=S1, run_id="r") as run:
        run.state.items.append(step("a"))
        raise Crash

    class S2(pk.State, version=2, name=name):
        entries: list[str] = []

    @pk.migration(S2, from_version=1)
    def broken(data: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("entries")

    report = store.check_replay(_entry("a", state=S2), threads=[p])
    (run,) = report.runs
    assert (run.outcome, run.error_type) == ("stops", "SchemaVersionError")


def test_unfinished_parent_is_re_entered(store: pk.Store) -> None:
    p = uid("rc")
    with pytest.raises(Crash), pk.resume(p, store=store, run_id="r"):
        step("a")
        parent(True)

    def entry(child: str) -> Any:
        def run_it(thread_id: str, run_id: str, store: pk.Store) -> None:
            with pk.resume(thread_id, store=store, run_id=run_id):
                step("a")
                parent(False, child)

        return run_it

    BODIES.clear()
    ok = store.check_replay(entry("c1"), threads=[p])
    assert [(r.outcome, r.position) for r in ok.runs] == [("continues", "1/2")]
    bad = store.check_replay(entry("other"), threads=[p])
    assert [(r.outcome, r.position) for r in bad.runs] == [("stops", "1/1")]
    assert BODIES == []


def test_entry_that_does_not_resume_the_run(store: pk.Store) -> None:
    p = uid("rc")
    _crash(store, p, "s0")

    def wrong(thread_id: str, run_id: str, store: pk.Store) -> None:
        with pk.resume(thread_id, store=store, run_id="another"):
            step("s0")

    (run,) = store.check_replay(wrong, threads=[p]).runs
    assert run.outcome == "stops" and "did not resume run r" in (run.error or "")
    with pytest.raises(pk.ConfigurationError, match="entry"):
        store.check_replay("not callable")  # type: ignore[arg-type]
    with pytest.raises(pk.ConfigurationError, match="threads"):
        store.check_replay(wrong, threads="t")


def test_async_entry_and_acheck_replay(store: pk.Store) -> None:
    p = uid("rc")
    _crash(store, p, "s0", "s1")

    async def entry(thread_id: str, run_id: str, store: pk.Store) -> None:
        async with pk.resume(thread_id, store=store, run_id=run_id):
            step("s0")
            if pk.patched("swap"):
                step("s1-new")
            else:
                step("s1")
            step("s2")

    before = store_bytes(store, p)
    BODIES.clear()
    for report in (asyncio.run(store.acheck_replay(entry, threads=[p])), store.check_replay(entry, threads=[p]),
                   asyncio.run(store.acheck_replay(_entry("s0", "s1", "s2"), threads=[p]))):
        assert [(r.outcome, r.position) for r in report.runs] == [("continues", "2")]
    assert report.runs[0].old_patches == ()
    assert asyncio.run(store.acheck_replay(entry, threads=[p])).runs[0].old_patches == ("swap",)
    assert BODIES == [] and store_bytes(store, p) == before


def test_cli(tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    if store_url.startswith("memory://"):
        pytest.skip("the CLI opens the store by URL: a memory store is another process's")
    p = uid("rc")
    store = pk.connect(store_url)
    _crash(store, p, "s0", "s1")
    mod = f"rc_entry_{p.replace('-', '_')}"
    (tmp_path / f"{mod}.py").write_text(textwrap.dedent("""
        import persistkit as pk
        from test_replay_check import step

        def guarded(thread_id, run_id):
            with pk.resume(thread_id, run_id=run_id):
                step("s0")
                step("s1" if not pk.patched("p2") else "s1-new")

        def unguarded(thread_id, run_id):
            with pk.resume(thread_id, run_id=run_id):
                step("s0")
                step("s1-new")
    """))
    monkeypatch.chdir(tmp_path)
    before = store_bytes(store, p)
    assert main(["replay-check", store_url, f"{mod}:unguarded", "--thread", p]) == 1
    out = capsys.readouterr().out
    assert f"STOPS thread {p} run r (running): step 'step' at position 1: NonDeterminismError" in out
    assert main(["replay-check", store_url, f"{mod}:guarded", "--prefix", p]) == 0
    out = capsys.readouterr().out
    assert f"NEEDS OLD PATH thread {p} run r: pk.patched('p2')" in out and "0 would stop" in out
    assert main(["replay-check", store_url, f"{mod}:guarded", "--thread", p, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["thread"], row["outcome"], row["position"], row["old_patches"]) == (p, "completes", None, ["p2"])
    assert main(["replay-check", "--url", store_url, f"{mod}:guarded", "--prefix", p]) == 0  # as every verb
    assert "0 would stop" in capsys.readouterr().out
    for wrong in ([store_url, f"{mod}:missing"], ["--url", store_url], [store_url, f"{mod}:guarded", "extra"]):
        with pytest.raises(SystemExit) as exc:
            main(["replay-check", *wrong])
        assert exc.value.code == 2, wrong
    assert store_bytes(store, p) == before
    store.close()
    sys.modules.pop(mod, None)


def test_sealed_store_and_deprecated_patch(local_store: pk.Store, tmp_path: Path) -> None:
    """Under encryption and integrity the check reads through the wrappers and writes
    nothing; an old run that meets pk.deprecate_patch would stop (and needs the patch)."""
    import os

    url = local_store.url if local_store.url.startswith("memory") else f"sqlite:///{tmp_path}/sealed.db"
    ring = pk.KeyRing({"k1": os.urandom(32)})
    store = pk.connect(url, encryption=ring, integrity=pk.KeyRing({"i1": os.urandom(32)}, purpose="integrity"))
    p = uid("rc")
    _crash(store, p, "s0", "s1")

    def deprecated(thread_id: str, run_id: str, store: pk.Store) -> None:
        with pk.resume(thread_id, store=store, run_id=run_id):
            step("s0")
            pk.deprecate_patch("swap")
            step("s1-new")

    before = store_bytes(store, p)
    (run,) = store.check_replay(deprecated, threads=[p]).runs
    assert (run.outcome, run.position, run.error_type, run.old_patches) == ("stops", "1", "NonDeterminismError", ("swap",))
    assert "deprecate_patch('swap')" in (run.step or "")
    (run,) = store.check_replay(_entry("s0", "s1", "s2"), threads=[p]).runs
    assert (run.outcome, run.position) == ("continues", "2")
    assert store_bytes(store, p) == before and BODIES == ["s0", "s1"]
    store.close()


def test_concurrent_branches_in_a_check(store: pk.Store) -> None:
    """A gather of steps, one of them died inside: the check re-enters unfinished steps (their
    recorded children replay) and reaches the run's first frontier."""
    p = uid("rc")
    crash = [True]

    @pk.checkpointed(name="branch")
    async def branch(name: str) -> str:
        await asyncio.sleep(0)
        await astep(f"{name}0")
        if crash[0] and name == "y":
            raise Crash
        await astep(f"{name}1")
        return name

    async def block(thread_id: str, run_id: str, store: pk.Store) -> None:
        async with pk.resume(thread_id, store=store, run_id=run_id):
            await asyncio.gather(branch("x"), branch("y"))

    with pytest.raises(Crash):
        asyncio.run(block(p, "r", store))
    crash[0] = False
    BODIES.clear()
    report = asyncio.run(store.acheck_replay(block, threads=[p]))
    # x's own record may or may not have landed before the crash ended the gather: if it
    # did, x replays whole and y's next child is the frontier; else x's completion is
    x_done = any(c.position == "0" for c in store.history(p))
    expected = ("continues", "1/1", "astep") if x_done else ("continues", "0", "branch")
    assert [(r.outcome, r.position, r.step) for r in report.runs] == [expected]
    assert BODIES == []


# -- functions stored by name: a rollback's compensations, pending effects (found from outside) --


class _Die(BaseException):
    pass


@pk.register
def rc_undo(x: str) -> None:
    if x == "die":
        raise _Die


@pk.register
def rc_effect(x: str) -> None:
    raise _Die  # the process dies inside the effect: it stays pending


@pk.checkpointed(name="rc.book")
def rc_book(x: str) -> str:
    pk.compensate(rc_undo, x)
    return x


@pk.checkpointed(name="rc.reply")
def rc_reply(x: str) -> str:
    pk.after_commit(rc_effect, x)
    return x


@pk.checkpointed(name="rc.fail")
def rc_fail() -> None:
    raise ValueError("declined")


def _rc_entry(thread_id: str, run_id: str, *, store: pk.Store) -> None:
    with pk.resume(thread_id, store=store, run_id=run_id):
        rc_book("a")


def test_a_rollback_whose_compensation_is_gone_would_stop(store: pk.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose rollback a crash interrupted never runs its block again, but its remaining
    compensations run by name: a deploy that renamed one must not be called safe."""
    t = uid("rc")
    with pytest.raises(_Die), pk.resume(t, store=store, run_id="r1"):
        rc_book("a")
        rc_book("die")  # undone first (newest first): the process dies in it
        rc_fail()
    assert store.history(t, limit=1)[0].run_status == "compensating"
    ok = store.check_replay(_rc_entry, threads=[t])
    assert [(r.thread_id, r.outcome) for r in ok.runs if r.thread_id == t] == [(t, "continues")]
    monkeypatch.delattr(sys.modules[__name__], "rc_undo")
    monkeypatch.delitem(_functions._FUNCTIONS, f"{__name__}:rc_undo")  # as in the new code's process
    report = store.check_replay(_rc_entry, threads=[t])
    [run] = [r for r in report.runs if r.thread_id == t]
    assert (run.outcome, run.position, run.step) == ("stops", "c/0", "rc.book") and "rc_undo" in (run.error or "")
    assert not report.ok


def test_a_pending_effect_whose_function_is_gone_would_stop(store: pk.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    t = uid("rc")
    with pytest.raises(_Die), pk.resume(t, store=store, run_id="r1"):
        rc_reply("a")
    monkeypatch.delattr(sys.modules[__name__], "rc_effect")
    monkeypatch.delitem(_functions._FUNCTIONS, f"{__name__}:rc_effect")  # as in the new code's process
    report = store.check_replay(_rc_entry, threads=[t])
    [run] = [r for r in report.runs if r.thread_id == t]
    assert (run.outcome, run.position, run.step) == ("stops", "0", "rc.reply") and "rc_effect" in (run.error or "")


@pk.register
def rc_undo_ask(x: str) -> None:
    pk.suspend({"release?": x})


@pk.checkpointed(name="rc.hold")
def rc_hold(x: str) -> str:
    pk.compensate(rc_undo_ask, x)
    return x


def test_a_rollback_waiting_on_a_question_continues(store: pk.Store) -> None:
    """A compensation that asks (pk.suspend) leaves the run suspended mid-rollback: the check
    looks at its compensations, never replays its block (found from outside: it said 'stops')."""
    t = uid("rc")
    with pk.resume(t, store=store, run_id="r1") as run:
        rc_hold("a")
        rc_fail()
    assert run.status == "suspended"
    report = store.check_replay(_rc_entry, threads=[t])
    [found] = [r for r in report.runs if r.thread_id == t]
    assert (found.outcome, found.position) == ("continues", "c") and report.ok
