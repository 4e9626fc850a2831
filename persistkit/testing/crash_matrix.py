"""Prove that your own agent survives a crash at every step: ``crash_matrix(agent)``.

The durability equivalent of a property test. The matrix runs ``agent`` (a callable taking
no argument, or the store as its one argument) once, uncrashed, on a fresh store, then,
for every step position k and each crash point of that step — ``before`` its body,
``inside`` it (the body ran, its result never reached the engine) and ``after`` it returned
but before its checkpoint landed — it resumes the agent from what a process dying there
leaves in the store, and compares the resumed outcome with the uncrashed one: the return
value, each thread's final state, the recorded step sequence and how often each step body
ran (every committed step once; the step in flight at the crash at most once more per
attempt its ``retry=`` allows). A step is counted per run: one that each run of a thread
calls at the same position (a chat turn per ``run_id``) is a step per run.

Two modes:

* ``mode="inline"`` (default, fast): the crash points are passed during one watched run;
  at each, the store a death there leaves is the run's chains cut after their last landed
  checkpoint (nothing after the crash point is written). The three points of one step leave
  the same store, so they share one resume (their counts differ: a crash inside or after
  the body ran it once already). A point's "crash" is thus exact on the store's side;
  what the dead process held in memory is the one thing inline cannot take away (globals
  keep their values), which is what ``mode="process"`` is for.
* ``mode="process"``: a child process runs the agent on a fresh store and is killed at
  the point by a real ``SIGKILL``; another child resumes it. Both are forked from a
  process forked before the matrix's own runs (``_crash_fork``; warmed with what those
  runs imported), so they start with this process's memory as the matrix found it: a
  global the killed run filled is empty in the resume, unless this process ran the agent
  before (a note says so: ``RAN_HERE``). On SQLite one crash run serves every point
  (``_crash_chain``: before each kill it forks the process that goes on, which copies the
  store the death left), and the resumes run side by side; a server URL, or a point
  reached in a thread a fork does not copy, gets a crash run per point. Needs a store that
  crosses processes (SQLite, the default here, or a server URL) and ``os.fork``.

Nondeterminism between steps is found by running the agent uncrashed twice and comparing
the step names and argument digests recorded at each position; the findings name the
likely cause (see ``_crash_report``). ``positions=`` samples crash points (an int: that
many, drawn with ``seed``, which is printed so the sample can be repeated; or the step
indexes to crash at). Use the ``crash_matrix`` pytest fixture (the ``persistkit_pytest``
plugin) or call :func:`crash_matrix` from any runner; docs/testing.md.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import pickle
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._errors import ConfigurationError
from ..engine import _context
from ..engine import _store as _stores
from ..engine._store import Store, connect
from ._crash_chain import Kills, read_report
from ._crash_effects import WATCHED, install
from ._crash_fork import (
    RAN_HERE,
    Zygote,
    apart,
    carried_outcome,
    load,
    memory_note,
    read_events,
    save,
    save_given,
)
from ._crash_judge import Judge
from ._crash_report import (
    EXACTLY_ONCE,
    SAME_OUTCOME,
    Finding,
    Outcome,
    began,
    same,
)
from ._crash_seed import (
    call_index,
    hand,
    handed,
    normalized,
    order_changed,
    probe,
    probing,
    save_calls,
)
from ._crash_stores import Stores, takes_store
from ._crash_watch import (
    FAILED,
    UNCARRIED,
    WHENS,
    Key,
    Landed,
    Point,
    Raised,
    RecordingStore,
    Series,
    Snapshot,
    StepCall,
    Watch,
    kill_self,
)

__all__ = ["CrashMatrixResult", "crash_matrix"]

Chain = tuple[str, str]  # thread, namespace

MODES = ("inline", "process")
#: Process mode: what a resume of an unfinished run imports that an uncrashed run does not
#: (the warm process imports them once for every child: ``Zygote.warm``).
RESUME_IMPORTS = ("persistkit.coordination._rollback",)
#: Process mode on SQLite: an uncrashed run shorter than this (seconds) gets one crash run
#: for every point (``_crash_chain``); a longer one a crash run per point.
CHAIN_UNDER = 2.0
#: Process mode: seconds a child may take to reach its crash point (at least; 20x the
#: uncrashed run if that is longer) before it counts as stuck and is killed.
CHILD_TIMEOUT = 60.0


@dataclass
class CrashMatrixResult:
    """What :func:`crash_matrix` found. ``findings`` is empty when the agent kept the
    replay contract at every crash point tried; ``points`` names those points."""

    mode: str
    seed: int | None
    total: int  # crash points the agent has
    points: list[str]
    findings: list[Finding]
    reference: Outcome = field(repr=False)
    notes: list[str] = field(default_factory=list)  # what limits what the matrix could see

    @property
    def ok(self) -> bool:
        return not self.findings

    def assert_exactly_once(self) -> None:
        """Fail unless every committed step body ran exactly once (the one in flight at a
        crash at most twice) and no step ran where no run records it."""
        self._assert(EXACTLY_ONCE, "a step ran more often than the replay contract allows")

    def assert_same_outcome(self) -> None:
        """Fail unless every resumed run ended with the uncrashed run's return value, final
        state and recorded step sequence."""
        self._assert(SAME_OUTCOME, "a resumed run ended differently from the uncrashed run")

    def _assert(self, kinds: Sequence[str], what: str) -> None:
        found = [f for f in self.findings if f.kind in kinds]
        if found:
            raise AssertionError(f"crash matrix ({self.mode}): {what}\n" + self._lines(found))

    def _lines(self, findings: Iterable[Finding]) -> str:
        out = [f"  - {f}" for f in findings]
        out.append(
            f"  ({len(self.points)} of {self.total} crash points tried"
            + (f", seed={self.seed})" if self.seed is not None else ")")
        )
        return "\n".join(out)

    def __str__(self) -> str:
        notes = "".join(f"\n  {n}" for n in self.notes)
        if self.ok:
            return f"crash matrix ({self.mode}): {len(self.points)} crash points, no finding{notes}"
        return f"crash matrix ({self.mode}): {len(self.findings)} finding(s)\n" + self._lines(
            self.findings
        ) + notes


def crash_matrix(
    agent: Callable[..., Any],
    *,
    url: str | None = None,
    mode: str = "inline",
    positions: int | Iterable[int] | None = None,
    crash: Iterable[str] = WHENS,
    seed: int | None = None,
    directory: str | None = None,
    echo: Callable[[str], None] | None = print,
    other_hash_seed: bool = True,
) -> CrashMatrixResult:
    """Crash ``agent`` at every step (see the module docstring) and report what differs.

    ``url``: ``"memory://"`` (inline's default), ``"sqlite"`` (a fresh file per store in a
    directory of this call's own, made in ``directory`` (default the system's temporary one)
    and removed at the end; process mode's default) or a server URL (its
    threads the agent uses are deleted before each store is used, and at the end).
    ``crash``: which points of each step (``"before"``, ``"inside"``, ``"after"``).
    ``other_hash_seed``: process mode also runs this pytest test again in a fresh interpreter
    under another ``PYTHONHASHSEED`` and names a set's order between steps (``_crash_seed``;
    about one pytest start-up, beside the matrix); ``False`` leaves that out.
    """
    if mode not in MODES:
        raise ConfigurationError(f"crash_matrix(mode={mode!r}): expected 'inline' or 'process'")
    whens = (crash,) if isinstance(crash, str) else tuple(crash)
    if not whens or any(w not in WHENS for w in whens):
        raise ConfigurationError(f"crash_matrix(crash={whens!r}): pick from {WHENS}")
    if not callable(agent):
        raise ConfigurationError(f"crash_matrix needs the agent as a callable, got {agent!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ConfigurationError(
            f"crash_matrix(seed={seed!r}): an int (the seed a sampled run printed)"
        )
    if seed is not None and (not isinstance(positions, int) or isinstance(positions, bool)):
        raise ConfigurationError(
            f"crash_matrix(seed={seed}, positions={positions!r}): seed= only chooses which crash points "
            "positions=N samples; give positions=N with it, or leave seed= out"
        )
    if not isinstance(other_hash_seed, bool):
        raise ConfigurationError(f"crash_matrix(other_hash_seed={other_hash_seed!r}): True or False")
    if isinstance(positions, str | bytes):
        raise ConfigurationError(
            f"crash_matrix(positions={positions!r}): a positive int, or the step indexes to crash at"
        )
    url = url or ("memory://" if mode == "inline" else "sqlite")
    if mode == "process":
        if url.startswith("memory:"):
            raise ConfigurationError(
                "crash_matrix(mode='process') needs a store that crosses processes: url='sqlite' or a server URL"
            )
        if not hasattr(os, "fork"):
            raise ConfigurationError(
                "crash_matrix(mode='process') needs os.fork (Linux or macOS); use mode='inline'"
            )
    passes_store = takes_store(agent)
    began()  # a monotonic clock read from now on is this matrix's (its findings name it)
    index = call_index()
    args = (agent, passes_store, url, mode, whens, positions, seed, directory, echo, index, other_hash_seed)
    if probing():  # the look under another hash seed: one run, then what this call returned there
        return handed(index, _matrix(*args))  # type: ignore[no-any-return]
    try:
        result = _matrix(*args)
    except BaseException as exc:
        hand(index, "raised", exc)
        raise
    # the probe gives it back from the same call, so that its test reaches the next call
    hand(index, "ok", replace(result, reference=carried_outcome(result.reference)))
    return result


def _matrix(
    agent: Callable[..., Any],
    passes_store: bool,
    url: str,
    mode: str,
    whens: tuple[str, ...],
    positions: int | Iterable[int] | None,
    seed: int | None,
    directory: str | None,
    echo: Callable[[str], None] | None,
    index: int,
    other_hash_seed: bool,
) -> CrashMatrixResult:

    def work(say: Callable[[str], None] | None, ready: Callable[[], None]) -> tuple[CrashMatrixResult, list[Any]]:
        pool = Stores(url, directory)
        try:
            if probing():  # this process is process mode's look under another hash seed: one run
                watch = Watch()
                ref = call_agent(agent, passes_store, pool.fresh(), watch)
                save_calls(index, watch.calls)
                return CrashMatrixResult(mode, None, 0, [], [], ref, ["a probe under another hash seed"]), []
            matrix = _Matrix(agent, passes_store, pool, mode, whens, positions, seed, say)
            matrix.ready = ready
            result = matrix.run()
            return result, matrix.calls
        finally:
            pool.close()

    if mode == "inline" or probing():
        return work(echo, lambda: None)[0]
    # process mode runs in a child of its own: its uncrashed runs fill no global of this process
    looked = probe(index) if other_hash_seed else None  # beside the matrix: under another hash seed
    how, value, said = apart(lambda say, ready: _carried_result(work(say, ready)), CHILD_TIMEOUT)
    for line in said:
        if echo is not None:
            echo(line)
    if how == "raised":
        raise value
    if how == "stuck":
        stuck = Finding("resume-failed", _stuck_text("running the agent uncrashed", CHILD_TIMEOUT))
        return CrashMatrixResult(mode, None, 0, [], [stuck], Outcome())
    result: CrashMatrixResult = value[0]
    calls: list[Any] = value[1]
    if looked is not None:
        theirs = looked.calls(max(120.0, CHILD_TIMEOUT))
        if theirs is None:  # each call there returns what it returned here: every call is reached
            result.notes.append(f"the order of sets between steps (another PYTHONHASHSEED): {looked.why_not}")
        elif (found := order_changed(calls, theirs, looked.seed)) is not None:
            result.findings.append(Finding("order", found))
    return result


def _carried_result(done: tuple[CrashMatrixResult, list[Any]]) -> tuple[CrashMatrixResult, list[Any]]:
    result, calls = done
    result.reference = carried_outcome(result.reference)
    return result, calls


def _stuck_text(doing: str, seconds: float) -> str:
    return (
        f"the child process {doing} was still running after {seconds:.0f} s, killed: "
        "it waits for something os.fork did not copy (a thread the agent's framework started "
        "before the matrix began), so process mode cannot run this agent; use mode='inline' "
        "(the remaining points were not tried)"
    )


def call_agent(
    agent: Callable[..., Any],
    takes_store: bool,
    store: Store,
    watch: Watch,
    before: Mapping[Chain, list[Landed]] | None = None,
) -> Outcome:
    """One agent call on ``store`` under ``watch``; a planned :class:`Crash` propagates.

    ``before``: the step checkpoints (position, name) each chain already had in ``store``;
    the outcome's step sequence is those and the ones the call wrote (as they landed)."""
    rec = RecordingStore(store)
    rec.watch = watch
    saved = _context.MATRIX, _stores._default
    _context.MATRIX, _stores._default = watch, rec
    out = Outcome()
    if watch.checks:
        install()
    token = WATCHED.set(watch.effects if watch.checks else None)
    try:
        value = agent(rec) if takes_store else agent()
        if inspect.iscoroutine(value):
            value = asyncio.run(value)
        out.value = value
    except Exception as exc:
        out.error = exc
    finally:
        WATCHED.reset(token)
        _context.MATRIX, _stores._default = saved
        RAN_HERE.update(c.step for c in watch.calls)
        RAN_HERE.update(watch.plain_counts)
    _read(store, watch, out, before or {})
    return out


def _read(
    store: Store, watch: Watch, out: Outcome, before: Mapping[Chain, list[Landed]]
) -> None:
    for chain in watch.runs:
        thread, ns = chain
        mem = watch.end_states.get(chain)
        typed = type(mem) if hasattr(mem, "model_dump") else None
        try:
            state = (
                store.get_state(thread, namespace=ns, state=typed)
                if typed
                else store.get_state(thread, namespace=ns)
            )
            out.states[chain] = state.model_dump(mode="json") if typed else state
        except Exception as exc:  # the finding says what
            out.states[chain] = f"<the state does not load: {type(exc).__name__}: {exc}>"
        out.sequences[chain] = [*before.get(chain, ()), *watch.steps(chain)]
    out.counts, out.plain = dict(watch.counts), dict(watch.plain_counts)
    out.results = {c.key: c.result for c in watch.calls if c.returned}
    out.digests = {c.key: c.digest for c in watch.calls}
    out.names = {c.key: c.step for c in watch.calls}


class _Matrix(Judge):
    def __init__(
        self,
        agent: Callable[..., Any],
        takes_store: bool,
        pool: Stores,
        mode: str,
        whens: tuple[str, ...],
        positions: int | Iterable[int] | None,
        seed: int | None,
        echo: Callable[[str], None] | None,
    ) -> None:
        self.agent, self.takes_store, self.pool, self.mode = agent, takes_store, pool, mode
        self.whens, self.positions, self.seed, self.echo = whens, positions, seed, echo
        self.child_timeout = CHILD_TIMEOUT
        self.found: dict[tuple[str, str], list[str]] = {}
        self.texts: dict[tuple[str, str], str] = {}
        self.names: dict[Key, str] = {}
        self.shaky: dict[
            Key, str
        ] = {}  # keys whose arguments two uncrashed runs disagree on: the cause
        self.attempts: dict[Key, int] = {}  # the attempts each step's retry= allows
        self.zygote: Zygote | None = None
        self.took = 0.0  # seconds the uncrashed run took
        self.stuck_at = -1  # process mode: the step index a child got stuck at
        self.imported: set[str] = set()  # process mode: the modules the zygote was forked with
        self.ran_before: set[str] = set()  # process mode: steps this process ran before the zygote
        self.last: tuple[Outcome | None, tuple[Outcome, dict[Key, Any]]] = (None, (Outcome(), {}))
        self.under: dict[tuple[str, str], list[str]] = {}  # finding -> what follows from it
        self.order: dict[Key, int] = {}  # step key -> its first call's index in the uncrashed run
        self.mutated: dict[Key, str] = {}  # step key -> the arguments its body changed in place
        self.notes: list[str] = []
        self.ready: Callable[[], None] = lambda: None  # the uncrashed runs are done (process mode: ``apart``)
        self.calls: list[Any] = []  # the uncrashed run's steps, as the probe compares them

    def run(self) -> CrashMatrixResult:
        self.ran_before = set(RAN_HERE)  # what this process ran before: its globals are not fresh
        if self.mode == "process":  # forked before any run fills a global (_crash_fork)
            self.zygote = Zygote(self._child)
            self.imported = set(sys.modules)
        try:
            return self._run()
        finally:
            if self.zygote is not None:
                self.zygote.close()

    def _run(self) -> CrashMatrixResult:
        points: list[Point] = []
        store_a = self.pool.fresh()
        watch_a = Watch(points.append)
        watch_a.checks = True
        began = time.monotonic()
        ref = call_agent(self.agent, self.takes_store, store_a, watch_a)
        # process mode: how long a child may take to reach its crash point before it counts as stuck
        self.took = time.monotonic() - began
        self.child_timeout = max(CHILD_TIMEOUT, 20 * self.took)
        self.pool.threads |= {t for t, _ in watch_a.runs}
        self.names = {c.key: c.step for c in watch_a.calls}
        self.attempts = dict(watch_a.attempts)
        chosen = [p for p in points if p.when in self.whens]
        total = len(chosen)
        if ref.error is not None:
            self._reference_failed(ref.error)
            return self._result(ref, total, [])
        if not points:
            self.note(
                "no-steps",
                "the agent ran no persistkit step inside a pk.resume block, so there was nothing to crash and "
                "nothing was proven: call its model and tools as @pk.checkpointed functions inside "
                "`with pk.resume(thread_id):` (a LangGraph graph whose only durability is PersistkitSaver "
                "or durable_invoke has no persistkit steps: docs/testing.md)",
            )
            return self._result(ref, total, [])
        self._unstorable(store_a, watch_a)
        self._between(watch_a)
        chosen = self._sample(chosen)
        snapshot = Snapshot(store_a, set(watch_a.runs)) if self.mode == "inline" else None
        # its steps return what the first run's did: arguments that still differ come from code between steps
        watch_b = Watch(forced=self._given(_outcomes(watch_a.calls)))
        second = call_agent(self.agent, self.takes_store, self.pool.fresh(), watch_b)
        self._compare_uncrashed(watch_a.calls, watch_b.calls, second)
        self.calls = normalized(watch_a.calls)
        self.ready()
        if self.zygote is not None and not self.zygote.warm(
            [m for m in sys.modules if m not in self.imported] + list(RESUME_IMPORTS)
        ):
            self.notes.append(
                "note: importing what the uncrashed run imported started a thread, so each crash run and resume "
                "imported it afresh (slower, the same findings)"
            )
        if self.mode == "inline":
            assert snapshot is not None
            self._inline(chosen, snapshot, watch_a, ref, second)
        else:
            groups: dict[frozenset[tuple[tuple[str, str], str]], list[Point]] = {}
            for p in chosen:  # the points that leave one store share a crash run and a resume
                groups.setdefault(frozenset(p.cuts.items()), []).append(p)
            left: list[list[Point]] | None = list(groups.values())
            # SQLite: one crash run dies at every point (_crash_chain), for a run short enough
            # that no lease renewal is due while it forks (a renewal in flight would hold what
            # the continuation needs: a block renews every lease_ttl / 3, 10 s by default)
            if self.pool.own_dir and left and self.took < CHAIN_UNDER:
                left = self._chain(left, ref)
            if left and not self._process(left, ref):
                left = None  # a child stuck at one point is stuck at every one
            if left is None:
                chosen = [p for p in chosen if p.index <= self.stuck_at]
        return self._result(ref, total, [p.label() for p in chosen])

    def _result(self, ref: Outcome, total: int, tried: list[str]) -> CrashMatrixResult:
        findings = [
            Finding(key[0], self.texts[key], tuple(pts), tuple(self.under.get(key, ())))
            for key, pts in self.found.items()
        ]
        sampled = (
            self.seed if self.positions is not None and not _explicit(self.positions) else None
        )
        notes = list(self.notes)
        if ran := sorted(set(self.names.values()) & self.ran_before):
            notes.append(memory_note(ran, self.mode))
            if self.echo is not None:
                self.echo(f"crash_matrix: {notes[-1]}")
        return CrashMatrixResult(self.mode, sampled, total, tried, findings, ref, notes)

    def _sample(self, chosen: list[Point]) -> list[Point]:
        if self.positions is None:
            return chosen
        if _explicit(self.positions):
            wanted = list(self.positions)  # type: ignore[arg-type]
            steps = 1 + max((p.index for p in chosen), default=-1)
            bad = [
                i
                for i in wanted
                if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < steps
            ]
            if bad or not wanted:
                raise ConfigurationError(
                    f"crash_matrix(positions={self.positions!r}): the agent runs {steps} step bodies, so the step "
                    f"indexes to crash at are 0 to {steps - 1}"
                    + (f"; {bad!r} is not one of them" if bad else "; give at least one")
                )
            return [p for p in chosen if p.index in set(wanted)]
        count = self.positions
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ConfigurationError(
                f"crash_matrix(positions={count!r}): a positive int, or the step indexes to crash at"
            )
        if self.seed is None:
            self.seed = random.SystemRandom().randrange(2**32)
        picked = sorted(
            random.Random(self.seed).sample(range(len(chosen)), min(count, len(chosen)))
        )
        if self.echo is not None:
            self.echo(
                f"crash_matrix: {len(picked)} of {len(chosen)} crash points sampled with seed={self.seed} "
                f"(pass seed={self.seed} to try the same ones)"
            )
        return [chosen[i] for i in picked]

    # -- crashes ----------------------------------------------------------------------------

    def _inline(
        self, chosen: list[Point], snapshot: Snapshot, watch: Watch, ref: Outcome, second: Outcome
    ) -> None:
        groups: dict[frozenset[tuple[tuple[str, str], str]], list[Point]] = {}
        for p in chosen:
            groups.setdefault(frozenset(p.cuts.items()), []).append(p)
        for cuts, group in groups.items():
            if not cuts:
                resumed = second  # nothing had landed: the resume is a run on an empty store, which the second run was
            else:
                store = self.pool.fresh()
                snapshot.materialize(store, dict(cuts))
                landed = {chain: watch.steps(chain, cut) for chain, cut in cuts}
                seeded = Watch().seed(store, [chain for chain, _ in cuts])
                resumed = call_agent(self.agent, self.takes_store, store, seeded, landed)
                self.pool.release(store)
            for p in group:
                self._judge(p, ref, resumed)

    def _process(self, groups: list[list[Point]], ref: Outcome) -> bool:
        """Crash a child at the last point of each group (points that leave the same store:
        the crash points of one step) and judge the resume at each; False if a child got
        stuck. What the killed run had done at an earlier point of a group is what it had
        done at the last less what the uncrashed run did between the two (its bodies' runs).
        On SQLite (a store per run) the crash runs, then the resumes, run side by side."""
        assert self.zygote is not None
        side = self._side() if self.pool.own_dir else 1
        for at in range(0, len(groups), side):
            batch = groups[at : at + side]
            runs = []
            for group in batch:
                p = group[-1]
                base = os.path.join(self.pool.dir or tempfile.gettempdir(), f"events-{os.getpid()}-{p.index}-{p.when}")
                runs.append((self.pool.fresh_url(), base + ".log", base + ".pickle"))
            crashes = [["crash", g[-1].index, g[-1].when, url, ev] for g, (url, ev, _) in zip(batch, runs, strict=True)]
            statuses = self.zygote.batch(crashes, self.child_timeout, side)
            killed, resumes, stuck = [], [], False
            for group, (url, events, outcome), status in zip(batch, runs, statuses, strict=True):
                done = read_events(events)
                os.unlink(events)
                if status < 0:  # the groups after it are not judged: a child stuck here is stuck there
                    self._stuck("running the agent to this crash point", group[-1])
                    stuck = True
                    break
                if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                    how = "ended" if os.WIFEXITED(status) else f"died by signal {os.WTERMSIG(status)}"
                    for q in group:
                        self.note(
                            "resume-failed",
                            f"the run to crash at this point {how} before it got there: it took another path than the uncrashed run (the code between steps is not deterministic)",
                            q.label(),
                        )
                    continue
                killed.append((group, done, outcome))
                resumes.append(["resume", url, outcome, [list(c) for c in ref.states]])
            statuses = self.zygote.batch(resumes, self.child_timeout, side)
            for (group, done, outcome), status in zip(killed, statuses, strict=True):
                if not self._resumed(group, ref, status, done, outcome):
                    return False
            if stuck:
                return False
        return True

    def _side(self) -> int:
        """How many children run side by side (each with a store of its own): one per core."""
        return max(1, min(os.cpu_count() or 1, 4))

    def _chain(self, groups: list[list[Point]], ref: Outcome) -> list[list[Point]] | None:
        """One crash run that dies at the last point of every group (``_crash_chain``), then
        a resume per group from the store each death left; the groups it could not reach
        (the run took another path, or another thread ran at a point) are returned for a
        crash run each; None if a process of it got stuck."""
        assert self.zygote is not None
        url = self.pool.fresh_url()
        base = os.path.join(self.pool.dir or tempfile.gettempdir(), f"chain-{os.getpid()}")
        cuts = [[g[-1].index, g[-1].when] for g in groups]
        status = self.zygote.call(["chain", cuts, url, base + ".log", base, base + ".report"], self.child_timeout)
        left = {(g[-1].index, g[-1].when): g for g in groups}
        done, commands = [], []
        for kind, index, when, size, copy in read_report(base + ".report"):
            outcome = f"{base}-{index}-{when}.pickle"
            done.append((left.pop((index, when)), read_events(base + ".log", size), outcome))
            store = f"sqlite:///{copy}" if kind == "cut" else url
            commands.append(["resume", store, outcome, [list(c) for c in ref.states]])
        # each resume has a store of its own: they run side by side, one per core
        statuses = self.zygote.batch(commands, self.child_timeout, self._side())
        for (group, killed, outcome), status in zip(done, statuses, strict=True):
            if not self._resumed(group, ref, status, killed, outcome):
                return None
        os.unlink(base + ".log")
        os.unlink(base + ".report")
        if status < 0:
            first = min(left.values(), key=lambda g: g[-1].index, default=groups[-1])
            self._stuck("running the agent to this crash point", first[-1])
            return None
        return [g for g in groups if (g[-1].index, g[-1].when) in left]

    def _resumed(
        self, group: list[Point], ref: Outcome, status: int,
        killed: tuple[dict[Key, int], dict[str, int], dict[Key, tuple[str, Any]]], outcome: str,
    ) -> bool:
        """Judge each point of ``group`` by the resume (in a fresh child, ended with wait
        ``status``, its outcome in the file ``outcome``) of the run killed at its last point
        (``killed``: what that run's watch logged); False if the resume got stuck."""
        p = group[-1]
        counts, plain, results = killed
        if status < 0:
            self._stuck("resuming the run", p)
            return False
        if not os.path.exists(outcome):
            for q in group:
                self.note(
                    "resume-failed",
                    f"the process that resumed the run died (wait status {status})",
                    q.label(),
                )
            return True
        resumed = load(outcome)
        committed = {tuple(k) for k in load(outcome + ".committed")}  # what the killed run left
        os.unlink(outcome)
        os.unlink(outcome + ".committed")
        # what the resume replays: the results the killed run's steps committed, with their arguments
        kept = {k: results[k] for k in committed if k in results}
        for q in group:
            at = Point(
                q.index, q.when, q.key, q.step, {}, _less(counts, p.counts, q.counts),
                _less(plain, p.plain, q.plain), frozenset(committed), kept,
            )
            self._judge(at, ref, resumed)
        return True

    def _stuck(self, doing: str, p: Point) -> None:
        self.stuck_at = p.index
        self.note("resume-failed", _stuck_text(doing, self.child_timeout), p.label())

    def _child(self, command: list[Any]) -> None:
        """Process mode, in a fresh child of the zygote: ``crash`` runs the agent on a fresh
        store and dies at the point; ``resume`` resumes it and leaves its outcome in a file;
        ``given`` runs it uncrashed, its steps returning the results in a file (``_expected``)."""
        if command[0] == "given":
            _, url, path, given = command
            store = connect(url)
            save(call_agent(self.agent, self.takes_store, store, Watch(forced=load(given))), path)
            store.close()
            return
        if command[0] == "chain":
            _, cuts, url, events, copies, _, report = command
            fd = os.open(events, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
            chain = Kills(cuts, url.removeprefix("sqlite:///"), copies, fd, report)
            out = call_agent(self.agent, self.takes_store, connect(url), Watch(chain.at, fd))
            chain.ended(4 if out.error is not None else 3)
            os._exit(4 if out.error is not None else 3)
        if command[0] == "crash":
            _, index, when, url, events = command
            fd = os.open(events, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)

            def die(q: Point) -> None:
                if (q.index, q.when) == (index, when):
                    kill_self(q)

            out = call_agent(self.agent, self.takes_store, connect(url), Watch(die, fd))
            os._exit(4 if out.error is not None else 3)
        _, url, path, chains = command
        store = connect(url)
        chains = [tuple(c) for c in chains]
        watch, landed = Watch(), {}  # per chain: the step checkpoints the killed run left, oldest first
        for thread, ns in chains:
            records = list(reversed(store.history(thread, namespace=ns)))  # one read: Watch.seed's and these
            for cp in records:
                watch.ordinal(thread, ns, cp.run_id or "")
            landed[(thread, ns)] = [
                (str(cp.position), str(cp.step) + (FAILED if cp.status == "failed" else ""), watch.ordinal(thread, ns, cp.run_id or ""))
                for cp in records
                if cp.kind == "step"
            ]
        committed = [(*chain, pos, run) for chain, steps in landed.items() for pos, _, run in steps]
        with open(path + ".committed", "wb") as f:
            pickle.dump(committed, f)
        save(call_agent(self.agent, self.takes_store, store, watch, landed), path)
        # no store.close(): the child ends now (os._exit), and closing SQLite's last connection
        # checkpoints its WAL into the file, which cost more than the resume itself

    # -- judging one resume -------------------------------------------------------------------

    def _expected(self, p: Point, ref: Outcome, got: Outcome) -> tuple[Outcome, dict[Key, Any]]:
        """The outcome the resume ``got`` should have ended with, and the step results it
        rests on that differ from the uncrashed run's (empty when accounted for).

        A step that is not deterministic (the clock or a model inside it) is no defect: its
        result is recorded and replayed. A resume rests on the results the killed run recorded
        (process mode: its own; inline: the uncrashed run's, which it is) and on those of the
        steps it ran again; when one differs from the uncrashed run's for the same arguments
        (process mode used to blame that on code between steps), the resume is compared
        with an uncrashed run whose step bodies return the results the resume rests on — any
        difference left has another cause."""
        results = ref.results
        if not any(k in results and not same(results[k], r) for k, r in got.results.items()) and not any(
            k in results and not same(results[k], r) for k, (_, r) in p.results.items()
        ):
            return ref, {}  # the common case: every step returned what it did uncrashed
        if self.last[0] is got:  # the points of one step share a resume (and what it rests on)
            return self.last[1]
        self.last = (got, self._rebased(p, ref, got))
        return self.last[1]

    def _rebased(self, p: Point, ref: Outcome, got: Outcome) -> tuple[Outcome, dict[Key, Any]]:
        digests, moved = ref.digests, set()
        basis = {}
        for k, (d, r) in [*((k, (got.digests.get(k), r)) for k, r in got.results.items()), *p.results.items()]:
            if d == digests.get(k):
                basis[k] = r
            else:  # called with other arguments: what it returns for them is not this case
                moved.add(k)
        changed = {
            k: r for k, r in basis.items() if k in ref.results and not same(ref.results[k], r)
        }
        if not changed or any(r is UNCARRIED for r in changed.values()):
            return ref, changed
        # the steps return what the resume rests on; those whose arguments moved run
        given = self._given({**{k: r for k, r in ref.results.items() if k not in moved}, **basis})
        if self.mode == "inline":
            store = self.pool.fresh()
            expected = call_agent(self.agent, self.takes_store, store, Watch(forced=given))
            self.pool.release(store)
        else:
            assert self.zygote is not None
            path = os.path.join(self.pool.dir or tempfile.gettempdir(), f"given-{os.getpid()}-{p.index}-{p.when}")
            try:
                save_given(given, path + ".in")
            except Exception:  # a result pickle cannot carry to the child
                return ref, changed
            status = self.zygote.call(["given", self.pool.fresh_url(), path + ".out", path + ".in"], self.child_timeout)
            os.unlink(path + ".in")
            if status < 0 or not os.path.exists(path + ".out"):
                return ref, changed
            expected = load(path + ".out")
            os.unlink(path + ".out")
        return (ref, changed) if expected.error is not None else (expected, {})

    def _given(self, results: Mapping[Key, Any]) -> dict[Key, tuple[str, Any]]:
        return {k: (self.names[k], r) for k, r in results.items() if k in self.names}

def _less(got: Mapping[Any, int], at_last: Mapping[Any, int], at: Mapping[Any, int]) -> dict[Any, int]:
    """Counts the killed run had at an earlier point: at the last, less what the uncrashed run
    counted between the two."""
    out = {k: n - (at_last.get(k, 0) - at.get(k, 0)) for k, n in got.items()}
    return {k: n for k, n in out.items() if n > 0}


def _explicit(positions: int | Iterable[int] | None) -> bool:
    return positions is not None and not isinstance(positions, int)


def _outcomes(calls: Sequence[StepCall]) -> dict[Key, Any]:
    """What each step key's body gave back in an uncrashed run (a result, or the error it
    raised), to force on another run: a replay gives back recorded errors too."""
    per: dict[Key, list[Any]] = {}
    for c in calls:
        if c.returned or c.error is not None:
            per.setdefault(c.key, []).append(c.result if c.returned else Raised(c.error))  # type: ignore[arg-type]
    return {k: v[0] if len(v) == 1 else Series(tuple(v)) for k, v in per.items()}
