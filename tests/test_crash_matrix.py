"""The crash matrix (persistkit.testing.crash_matrix) on agents planted with each defect it
must name (alone, and next to a step that is not deterministic, which is no defect and
must not be named as the cause), and on agents without one, in both modes; the pytest
plugin as users see it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

import crash_matrix_agents as agents
import pytest
from conftest import uid
from pydantic import BaseModel

import persistkit as pk
from persistkit.testing import CrashMatrixResult, crash_matrix

pytest_plugins = ["pytester"]

MODES = ["inline", "process"]
# each defect alone, and after a recorded step that is not deterministic (agents.now)
STAMPED = pytest.mark.parametrize("stamped", [False, True], ids=["alone", "stamped"])


def run(agent: Callable[[str], Any], mode: str, tmp_path: Any, **options: Any) -> CrashMatrixResult:
    agents.reset()
    thread = uid("cm")
    # the look under another hash seed starts the test again: tests/test_crash_matrix_trust.py has it
    options.setdefault("other_hash_seed", False)
    return crash_matrix(lambda: agent(thread), mode=mode, directory=str(tmp_path), **options)


def kinds(result: CrashMatrixResult) -> set[str]:
    return {f.kind for f in result.findings}


def blames_no_recorded_step(result: CrashMatrixResult) -> None:
    """No finding blames the recorded step that is not deterministic (``agents.now``) or
    its field (a crash point at that step may be named)."""
    text = "\n".join(f.message for f in result.findings)
    assert "`now`" not in text and "started_at" not in text, str(result)


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_without_a_defect_passes_at_every_crash_point(mode: str, tmp_path: Any) -> None:
    result = run(agents.good, mode, tmp_path)
    assert result.ok, str(result)
    # plan + 4 searches + summarize + send_email, each crashed before, inside and after its body
    assert result.total == 7 * 3 and len(result.points) == 21
    result.assert_exactly_once()
    result.assert_same_outcome()
    assert result.reference.value.startswith("result for refunds part 0")


@pytest.mark.parametrize("mode", MODES)
@STAMPED
def test_clock_read_between_steps_is_named(mode: str, stamped: bool, tmp_path: Any) -> None:
    result = run(lambda t: agents.clock_between_steps(t, stamped), mode, tmp_path)
    assert kinds(result) == {"state"}, str(result)
    (finding,) = result.findings
    assert "state.checked_at differs" in finding.message
    assert "code between steps read the clock" in finding.message
    blames_no_recorded_step(result)
    result.assert_exactly_once()  # the clock changes the outcome, not how often a step ran
    with pytest.raises(AssertionError, match="code between steps read the clock"):
        result.assert_same_outcome()


@pytest.mark.parametrize("mode", MODES)
@STAMPED
def test_side_effect_outside_a_step_is_named(mode: str, stamped: bool, tmp_path: Any) -> None:
    result = run(lambda t: agents.side_effect_outside_a_step(t, stamped), mode, tmp_path)
    assert kinds(result) == {"ran-twice"}, str(result)
    blames_no_recorded_step(result)
    (finding,) = result.findings
    assert finding.message.startswith(
        "step `send_email` ran twice (once in the uncrashed run): it was called where no pk.resume run was current"
    )
    # only a crash after the thread's call repeats it: at the steps that come later
    assert finding.points and all("summarize" in p for p in finding.points)
    with pytest.raises(AssertionError, match="send_email` ran twice"):
        result.assert_exactly_once()


@pytest.mark.parametrize("mode", MODES)
@STAMPED
def test_arguments_from_an_unstored_global_are_named(mode: str, stamped: bool, tmp_path: Any) -> None:
    result = run(lambda t: agents.arguments_from_a_global(t, stamped), mode, tmp_path)
    assert "arguments" in kinds(result), str(result)
    blames_no_recorded_step(result)
    first, at = result.findings[0], 4 + stamped
    assert first.message.startswith(f"the arguments of step `summarize` at position {at}")
    assert (
        f"at position {at} differ on replay: they depend on something that is not in the state"
        in first.message
    )
    # the outcome differences say where they come from
    assert all(
        "follows from the arguments of step" in f.message
        for f in result.findings
        if f.kind in ("state", "value")
    )
    with pytest.raises(AssertionError, match="differ on replay"):
        result.assert_same_outcome()


@pytest.mark.parametrize("mode", MODES)
@STAMPED
def test_an_unstorable_state_field_is_named(mode: str, stamped: bool, tmp_path: Any) -> None:
    result = run(lambda t: agents.unstorable_field(t, stamped), mode, tmp_path)
    assert kinds(result) == {"unstorable"}, str(result)
    blames_no_recorded_step(result)
    assert (
        "state field `client` cannot be stored (it holds a crash_matrix_agents.Client)"
        in result.findings[0].message
    )
    for check in (result.assert_exactly_once, result.assert_same_outcome):
        with pytest.raises(AssertionError, match="state field `client` cannot be stored"):
            check()


def test_arguments_that_differ_between_two_uncrashed_runs_name_the_clock(tmp_path: Any) -> None:
    @pk.checkpointed
    def remind(at: str) -> str:
        return f"reminder at {at}"

    def agent() -> str:
        import datetime as dt

        with pk.resume(thread):
            return remind(
                dt.datetime.now().isoformat()
            )  # the clock, read between steps, into arguments

    thread = uid("cm")
    result = crash_matrix(agent)
    assert {"nondeterminism", "arguments"} <= kinds(result), str(result)
    text = str(result)
    assert "the arguments of step" in text and "differ between two uncrashed runs" in text
    assert "code between steps read the clock" in text


def test_the_agent_may_take_the_store(tmp_path: Any) -> None:
    thread = uid("cm")
    seen: list[pk.Store] = []

    def agent(store: pk.Store) -> str:
        seen.append(store)
        with pk.resume(thread, store=store) as run:
            run.state["n"] = agents.search("q")
            return str(run.state["n"])

    result = crash_matrix(agent, url="sqlite", directory=str(tmp_path))
    assert result.ok, str(result)
    assert len({id(s) for s in seen}) == len(seen) >= 2  # a fresh store for every run


def test_async_agents_run(tmp_path: Any) -> None:
    @pk.checkpointed
    async def fetch(q: str) -> str:
        return q.upper()

    async def agent() -> str:
        async with pk.resume(thread) as run:
            run.state["a"] = await fetch("a")
            run.state["b"] = await fetch("b")
            return str(run.state["a"] + run.state["b"])

    thread = uid("cm")
    result = crash_matrix(agent)
    assert result.ok and len(result.points) == 6, str(result)


def test_positions_sample_with_a_printed_seed_and_repeat(tmp_path: Any) -> None:
    printed: list[str] = []
    first = run(agents.good, "inline", tmp_path, positions=5, echo=printed.append)
    assert len(first.points) == 5 and first.seed is not None
    assert f"seed={first.seed}" in printed[0] and "5 of 21 crash points" in printed[0]
    again = run(agents.good, "inline", tmp_path, positions=5, seed=first.seed, echo=None)
    assert again.points == first.points
    chosen = run(agents.good, "inline", tmp_path, positions=[0, 6], crash=["after"])
    assert [p.split(" `")[0] for p in chosen.points] == [
        "crash after step #0",
        "crash after step #6",
    ]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"mode": "threads"}, "expected 'inline' or 'process'"),
        ({"other_hash_seed": "yes"}, "other_hash_seed='yes'.*True or False"),
        ({"crash": ["during"]}, "pick from"),
        ({"mode": "process", "url": "memory://"}, "crosses processes"),
        ({"positions": 0}, "a positive int"),
        # step indexes the agent does not have (7 step bodies): refused, not a vacuous pass
        ({"positions": [99]}, r"indexes to crash at are 0 to 6; \[99\] is not one of them"),
        ({"positions": [-1]}, r"0 to 6; \[-1\] is not one"),
        ({"positions": []}, "give at least one"),
        ({"positions": "x"}, "a positive int, or the step indexes"),
        ({"positions": 2, "seed": "abc"}, r"seed='abc'\): an int"),
        ({"seed": 7}, "seed= only chooses which crash points positions=N samples"),
        ({"seed": 7, "positions": [0]}, "seed= only chooses"),
        ({"crash": "during"}, r"crash=\('during',\)"),
    ],
)
def test_bad_options_say_what_is_wrong(options: dict[str, Any], match: str) -> None:
    with pytest.raises(pk.ConfigurationError, match=match):
        crash_matrix(lambda: agents.good(uid("cm")), **options)


def test_an_agent_with_two_parameters_is_refused() -> None:
    with pytest.raises(pk.ConfigurationError, match="no argument or the store"):
        crash_matrix(lambda a, b: None)


class Msg(BaseModel):
    role: str
    text: str


class Chat(pk.State):
    messages: Annotated[list[Msg], pk.append] = []
    turns: int = 0


@pk.checkpointed
def reply(text: str) -> Msg:
    return Msg(role="ai", text=text.upper())


@pytest.mark.parametrize("mode", MODES)
def test_a_chat_with_one_run_per_turn_passes(mode: str, tmp_path: Any) -> None:
    # each turn is a run (its own run_id) calling `reply` at position 0: a step per run,
    # not one step that ran three times
    thread = uid("cm-chat")

    def agent(store: pk.Store) -> list[str]:
        for turn in range(3):
            with pk.resume(thread, store=store, state=Chat, run_id=f"turn-{turn}") as run:
                run.state.messages.append(Msg(role="user", text=f"hi {turn}"))
                run.state.messages.append(reply(f"hi {turn}"))
                run.state.turns += 1
        return [m.text for m in run.state.messages]

    result = crash_matrix(agent, mode=mode, url="sqlite", directory=str(tmp_path))
    assert result.ok and len(result.points) == 9, str(result)
    result.assert_exactly_once()
    result.assert_same_outcome()
    assert result.reference.value == ["hi 0", "HI 0", "hi 1", "HI 1", "hi 2", "HI 2"]


@pytest.mark.parametrize("mode", MODES)
def test_a_side_effect_outside_a_step_is_still_found_in_a_chat_of_runs(
    mode: str, tmp_path: Any
) -> None:
    thread = uid("cm-runs")

    def agent(store: pk.Store) -> None:
        for turn in range(2):
            with pk.resume(thread, store=store, run_id=f"turn-{turn}"):
                t = threading.Thread(target=reply, args=(f"hi {turn}",))  # outside any run
                t.start()
                t.join()
                reply(f"hi {turn}")

    result = crash_matrix(agent, mode=mode, url="sqlite", directory=str(tmp_path))
    assert kinds(result) == {"ran-twice"}, str(result)


CACHE: dict[int, str] = {}


@pk.checkpointed
def load(i: int) -> str:
    CACHE[i] = f"v{i}"
    return f"v{i}"


@pk.checkpointed
def lookup(q: str) -> str:
    return "res:" + q


def test_process_mode_resumes_in_a_fresh_process(tmp_path: Any) -> None:
    # a kill -9 takes the global with it: the resume replays `load` (its body does not run)
    # and a fresh process's CACHE is empty, although this process's runs filled it
    thread = uid("cm-glob")

    def agent() -> str:
        with pk.resume(thread, state={"log": []}) as run:
            load(1)
            r = lookup(CACHE.get(1, "missing"))
            run.state["log"].append(r)
            return str(r)

    CACHE.clear()
    result = crash_matrix(agent, mode="process", directory=str(tmp_path))
    assert "arguments" in kinds(result), str(result)
    assert result.findings[0].message.startswith(
        "the arguments of step `lookup` at position 1 differ on replay"
    )
    assert len(result.findings[0].points) == 3
    assert "after the crash 'res:missing'" in str(result)


@pytest.mark.parametrize("mode", MODES)
def test_a_retried_step_in_flight_may_run_all_its_attempts_again(mode: str, tmp_path: Any) -> None:
    thread = uid("cm-retry")
    ran: list[int] = []

    @pk.checkpointed(
        name="flaky",
        retry=pk.Retry(attempts=3, on=(TimeoutError,), wait_initial=0.0, wait_jitter=0.0),
    )
    def flaky(x: int) -> int:
        ran.append(x)
        raise TimeoutError("the model timed out")

    def agent() -> str:
        with pk.resume(thread):
            try:
                flaky(5)
            except TimeoutError:
                return "gave up"
        return "?"

    result = crash_matrix(agent, mode=mode, directory=str(tmp_path))
    # the crash after the last attempt, before its failure is written: the resume runs the
    # three attempts again (6 runs; 3 + 3 allowed)
    assert "crash after step #2 `flaky` (position 0)" in result.points, str(result)
    assert result.ok, str(result)


@pytest.mark.parametrize("mode", MODES)
def test_a_step_that_is_not_deterministic_but_recorded_passes(mode: str, tmp_path: Any) -> None:
    # `now` (the clock) and `draft` (a model) return something else each run, and `plan`'s
    # arguments follow from `draft`'s answer: inside steps, so recorded and replayed. A resume
    # after the crash of a run whose `now` had committed ends with that run's time, not the
    # uncrashed run's, as it should (process mode named that "code between steps read the
    # clock"); one that runs `draft` again goes on with its new answer.
    result = run(agents.recorded_nondeterminism, mode, tmp_path)
    assert result.ok and len(result.points) == 3 * 6, str(result)
    result.assert_exactly_once()
    result.assert_same_outcome()


def test_the_plugin_as_users_see_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_agent="""
        import persistkit as pk
        import threading

        @pk.checkpointed
        def search(q):
            return q.upper()

        @pk.checkpointed
        def notify(text):
            return text

        def test_good(crash_matrix):
            def agent():
                with pk.resume("good") as run:
                    run.state["a"] = search("a")
                    run.state["b"] = search("b")
                    return run.state["a"] + run.state["b"]
            result = crash_matrix(agent)
            result.assert_exactly_once()
            result.assert_same_outcome()

        def test_bad(crash_matrix):
            def agent():
                with pk.resume("bad") as run:
                    run.state["a"] = search("a")
                    t = threading.Thread(target=notify, args=("hi",))
                    t.start(); t.join()
                    run.state["b"] = search("b")
            crash_matrix(agent, mode="process").assert_exactly_once()

        def test_sampled(crash_matrix):
            def agent():
                with pk.resume("sampled") as run:
                    run.state["a"] = search("a")
            assert crash_matrix(agent, positions=1, echo=None).seed == 5
        """
    )
    # the fixture comes from the pytest11 entry point of the installed package, as for users;
    # --crash-matrix-seed goes to the calls that sample (positions=N) only
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--crash-matrix-seed=5")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*step `notify` ran twice (once in the uncrashed run): it was called where no pk.resume run was current*"
        ]
    )


def test_imports_stay_light() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import sys, persistkit; print('_pytest' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False", "import persistkit imported pytest"
    out = subprocess.run(
        [sys.executable, "-c", "import sys, persistkit_pytest; print('persistkit' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False", "the pytest plugin imported persistkit at startup"


def test_an_agent_without_a_step_is_not_a_pass() -> None:
    def agent() -> str:
        with pk.resume(uid("cm")) as run:
            run.state["answer"] = "no step here"
            return str(run.state["answer"])

    result = crash_matrix(agent)
    assert kinds(result) == {"no-steps"} and result.total == 0, str(result)
    assert kinds(crash_matrix(lambda: None)) == {"no-steps"}  # no pk.resume at all
    for check in (result.assert_exactly_once, result.assert_same_outcome):
        with pytest.raises(AssertionError, match="nothing to crash and nothing was proven"):
            check()


def test_a_child_stuck_after_fork_is_killed_and_named(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import concurrent.futures
    import importlib

    # A framework's worker thread, started in this process: os.fork does not copy it.
    pool = concurrent.futures.ThreadPoolExecutor(1)
    pool.submit(lambda: None).result()

    @pk.checkpointed
    def emit(event: str) -> str:
        return pool.submit(str.upper, event).result()  # waits for the thread: forever in a child

    def agent() -> str:
        with pk.resume(thread) as run:
            run.state["a"] = emit("a")
            run.state["b"] = emit("b")
            return str(run.state["a"] + run.state["b"])

    thread = uid("cm")
    monkeypatch.setattr(
        importlib.import_module("persistkit.testing.crash_matrix"), "CHILD_TIMEOUT", 1.0
    )
    try:
        result = crash_matrix(agent, mode="process", directory=str(tmp_path))
        assert crash_matrix(agent, directory=str(tmp_path)).ok  # inline runs it
    finally:
        pool.shutdown()
    (finding,) = result.findings
    # process mode runs in a child of its own, uncrashed runs included (it leaves no global
    # filled here): the uncrashed run waits in the body, and no crash point is tried
    assert finding.kind == "resume-failed" and not result.points, str(result)
    assert "running the agent uncrashed was still running after 1 s, killed" in finding.message
    assert "use mode='inline'" in finding.message


@pytest.mark.parametrize("mode", MODES)
def test_steps_run_side_by_side_each_get_their_after_point(mode: str, tmp_path: Any) -> None:
    @pk.checkpointed
    async def book(city: str) -> str:
        await asyncio.sleep(0)  # the three bodies interleave: each returns before any is written
        return f"booked {city}"

    async def agent() -> str:
        async with pk.resume(thread) as run:
            run.state["bookings"] = list(await asyncio.gather(*(book(c) for c in ("a", "b", "c"))))
            return ", ".join(run.state["bookings"])

    thread = uid("cm")
    result = crash_matrix(agent, mode=mode, directory=str(tmp_path))
    assert result.ok, str(result)
    assert sorted(p.split(" step")[0] for p in result.points) == sorted(
        f"crash {when}" for when in ("before", "inside", "after") for _ in range(3)
    )


@pytest.mark.parametrize("first, second", [("inline", "inline"), ("process", "inline"), ("inline", "process")])
def test_two_matrices_share_a_directory_without_reading_each_others_files(
    first: str, second: str, tmp_path: Any
) -> None:
    """Each call's SQLite files are its own (a second call numbered its files from 1 again and
    read the first's), and none is left in the caller's directory."""
    thread = uid("cm")

    def agent() -> int:
        with pk.resume(thread) as run:
            run.state["a"] = agents.search("1")
            return len(agents.search(str(run.state["a"])))

    for mode in (first, second):
        result = crash_matrix(agent, mode=mode, url="sqlite", directory=str(tmp_path), positions=[0])
        assert result.ok, str(result)
    assert list(tmp_path.iterdir()) == []


class Reply:
    """An SDK-like result: no ``__eq__`` of its own (== is identity), the default repr."""

    def __init__(self, text: str, stamp: float = 0.0) -> None:
        self.text, self.stamp = text, stamp


@pytest.mark.parametrize("mode", MODES)
def test_a_returned_object_without_eq_is_compared_by_what_it_holds(mode: str, tmp_path: Any) -> None:
    """Two runs' equal objects (and locks) print the same but were "the return value
    differs": == compared identity, process mode the reprs with their addresses."""
    thread = uid("cm")

    def agent(stamp: Callable[[], float]) -> Any:
        with pk.resume(thread) as run:
            run.state["a"] = agents.search("q")
            return Reply(str(run.state["a"]), stamp()), threading.Lock()

    assert crash_matrix(lambda: agent(lambda: 0.0), mode=mode, directory=str(tmp_path)).ok
    result = crash_matrix(lambda: agent(time.time), mode=mode, directory=str(tmp_path))
    assert kinds(result) == {"value"}, str(result)  # one that truly differs still is
    assert "read the clock" in str(result)


def test_process_mode_says_when_this_process_ran_the_agent_before(tmp_path: Any) -> None:
    """Its children fork from this process's memory: after an inline matrix filled the
    agent's cache here, process mode can no longer find the cache defect, and says so."""
    cache: dict[int, str] = {}

    @pk.checkpointed
    def fill_cache() -> int:
        cache[1] = "hello"
        return 1

    @pk.checkpointed
    def look_up(q: str) -> str:  # a step no other test ran in this process
        return f"found {q}"

    thread = uid("cm")

    def agent() -> str:
        with pk.resume(thread) as run:
            run.state["r"] = look_up(cache.get(fill_cache(), "missing"))
            return str(run.state["r"])

    echoed: list[str] = []
    first = crash_matrix(agent, mode="process", directory=str(tmp_path), echo=echoed.append)
    assert "arguments" in kinds(first) and not first.notes and not echoed, str(first)
    assert crash_matrix(agent, directory=str(tmp_path), echo=None).ok  # inline fills the cache here
    later = crash_matrix(agent, mode="process", directory=str(tmp_path), echo=echoed.append)
    assert later.ok and len(later.notes) == 1 and "fill_cache" in later.notes[0]
    assert "start with this process's memory" in str(later) and echoed == [f"crash_matrix: {later.notes[0]}"]


@pytest.mark.parametrize("clock", [time.monotonic, time.perf_counter])
def test_a_monotonic_clock_read_between_steps_is_named(clock: Callable[[], float], tmp_path: Any) -> None:
    thread, ticks = uid("cm"), iter(range(100))

    def agent(read: Callable[[], float]) -> str:
        with pk.resume(thread) as run:
            run.state["a"] = agents.search("q")
            run.state["checked"] = read()
            return str(run.state["a"])

    result = crash_matrix(lambda: agent(clock), directory=str(tmp_path))
    assert "code between steps read the clock" in str(result), str(result)
    other = crash_matrix(lambda: agent(lambda: next(ticks) + 0.5), directory=str(tmp_path))
    assert kinds(other) == {"state"} and "read the clock" not in str(other), str(other)


@pytest.mark.parametrize("mode", MODES)
def test_a_transient_failure_of_a_step_under_a_retried_parent_may_strike_again(mode: str, tmp_path: Any) -> None:
    """The child's first call in every process times out, and its parent's retry= runs it
    again: a resume may take more of the parent's attempts than the uncrashed run (it was
    "ran again after its checkpoint had committed" and "the recorded steps differ")."""
    thread, calls = uid("cm"), [0]

    @pk.checkpointed
    def flaky(x: int) -> int:
        calls[0] += 1
        if calls[0] == 1:
            raise TimeoutError("transient")
        return x * 10

    @pk.checkpointed(retry=pk.Retry(attempts=3, on=(TimeoutError,)))
    def parent(x: int) -> int:
        return len(agents.search(str(x))) + flaky(x)

    def agent() -> int:
        calls[0] = 0  # a fresh process: the transient error strikes again
        with pk.resume(thread) as run:
            run.state["v"] = parent(2)
            return int(run.state["v"])

    result = crash_matrix(agent, mode=mode, directory=str(tmp_path))  # conftest: no retry waits
    assert result.ok and len(result.points) == 12, str(result)
