"""The combination matrix: every feature that touches stored bytes, in combination,
crashed at every step position and resumed in a new process (no pytest here).

What broke from outside broke in combination (a secret inside an offloaded value,
a migration under encryption, a lease left by a killed writer), so features are
tested together through one parametrized scenario instead of a test per pair.

**The scenario.** One agent of ``steps`` top-level steps (``run_agent``). Each
step appends a line to the case's ``effects.log`` (a side effect persistkit
does not know about, fsynced), then lets each enabled :class:`Feature` do its
part: change the state, return a value that the step records and that the next
step is handed as an argument. Version 1 of the code writes; version 2 resumes
(a feature that changes a schema registers both versions and the migration).

**A case** is a combination of features x a crash position (``steps`` positions,
each ``"in"`` flight: inside the step after its side effect, or ``"after"``: its
checkpoint committed, before the next step) on a fresh thread, plus one
crash-free reference thread per combination. Three phases, each job in its own
process (``_combination_agent`` forks one child per job from a driver that has
imported everything once, so a job costs a fork, not an interpreter start):

1. ``write``: version-1 code runs the agent and dies by SIGKILL at the position;
2. ``resume``: version-2 code resumes the thread to the end, in a new process;
3. ``check``: a third process reads and checks the thread (see ``check_case``),
   replays the finished run by its ``run_id`` (nothing may run) and starts a
   later run (one step, which must run once).

A store that cannot cross processes (``memory://``) runs the same jobs inline
in one process, the crash being a ``BaseException`` raised at the position.

**The replay contract checked for each case** (by the suite, from the files the
jobs leave): every committed step ran exactly once and the one in flight twice
(counted in ``effects.log``, not in any process's memory); the final state
(read by version 2) and the run's outputs equal the reference's; no secret value
in any stored byte, raw or opened; every checkpoint of the mixed-version
history loads, no run failed; each feature's own checks (verify clean, offloaded
objects present, ciphertext only, lease released, ...); replay and a later run
work.

**The design (which combinations).** With k features, the full power set is
2^k combinations (64 for today's six, 1024 with the ones in progress) x 2*steps
crash cases each: far beyond a CI budget on 2 cores. Every failure found from
outside so far needed two features together, so the matrix covers *every pair
of features in all four on/off settings* (a covering array of strength 2), plus
*everything on*. The covering array is built, not searched: row 0 has every
feature off (the baseline); with m rows more, feature j is on in the rows of
its own (m//2+1)-subset of those m rows. Two distinct subsets of that size
intersect (both on), neither contains the other (one on, the other off, both
ways), and row 0 has both off. For 5-10 features m = 5 (7 combinations with
all on), for 11-15 m = 6 (8): today's 11 (nine built in, the LangGraph and
CrewAI adapter states) make 8 combinations, each crashed at 2*steps positions
on each store, against 2048 for the power set. ``design()`` checks the pair
coverage it promises.

**Adding a feature** is one :class:`Feature` entry, registered with
:func:`register_feature` in a module the agent imports (``modules=`` of the
plan; the suite's ``combination_modules``); see ``combination_features`` for
the built-in ones.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import traceback
import types
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import persistkit as pk
from persistkit._errors import ConfigurationError

__all__ = [
    "Case",
    "Crash",
    "Feature",
    "Stored",
    "design",
    "design_per_level",
    "full_design",
    "register_feature",
    "registered_features",
    "run_agent",
    "run_job",
]

#: Written by every step into the state: plaintext that encryption must hide.
MARKER = "pk-matrix-plain-marker-5e1c"


class Crash(BaseException):
    """A process death in miniature (inline mode): not an Exception, so nothing is recorded for the step."""


@dataclass(frozen=True)
class Case:
    """One thread of the matrix, as every process that touches it sees it."""

    id: str  # "<combo>-<when>-<position>", or "<combo>-ref" for the crash-free reference
    combo: str  # the combination's id ("c0", ...)
    features: tuple[str, ...]
    thread: str
    dir: str  # this case's evidence files (effects.log, the jobs' JSON results)
    url: str
    blob_url: str
    steps: int
    crash_at: int | None = None  # step index of the crash; None: the reference
    when: str | None = None  # "in" (in flight) or "after" (committed)
    inline: bool = False  # crash by raising Crash instead of SIGKILL
    reference: str | None = None  # the reference case's id (for crash cases)

    def path(self, name: str) -> Path:
        return Path(self.dir) / name

    @property
    def committed(self) -> int:
        """How many steps the version-1 process committed before it died."""
        if self.crash_at is None:
            return self.steps
        return self.crash_at + (1 if self.when == "after" else 0)

    def feature_objects(self) -> list[Feature]:
        return [registered_features()[name] for name in self.features]

    @staticmethod
    def from_json(data: dict[str, Any]) -> Case:
        return Case(**{**data, "features": tuple(data["features"])})


@dataclass(frozen=True)
class Stored:
    """What a thread left in the store, for feature checks.

    ``raw``: every row payload and blob exactly as the backend (and the blob
    store) holds them. ``opened``: the same records through the store's own
    wrapper stack (decrypted, pointers followed) and out of their codec
    envelope: the serialized plaintext persistkit wrote, where a secret would be.
    """

    raw: list[bytes]
    primary: list[bytes]  # the primary store's part of ``raw`` (no blob store)
    offloaded: dict[str, bytes]  # the blob store's objects for this thread
    opened: list[bytes]

    def contains(self, needle: str | bytes) -> list[str]:
        """Where ``needle`` occurs: "raw" and/or "opened"."""
        b = needle.encode() if isinstance(needle, str) else needle
        return [
            name
            for name, parts in (("raw", self.raw), ("opened", self.opened))
            if any(b in p for p in parts)
        ]


def _none(*_: Any) -> None:
    return None


def _no_options(_: Case) -> dict[str, Any]:
    return {}


def _no_fields(_: int) -> dict[str, tuple[Any, Any]]:
    return {}


def _no_problems(_: Case, __: pk.Store, ___: Stored, ____: dict[str, Any]) -> list[str]:
    return []


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Feature:
    """One feature of the matrix: how the agent uses it and how to check it.

    Every hook is optional. ``version`` is the code version: 1 writes (and
    crashes), 2 resumes and checks.

    * ``setup(case, version)``: process-wide setup before the store opens
      (register classes, secrets, migrations; set environment variables). Called
      once per process and version; in inline mode for both versions in one
      process, so it must tolerate that (version 2 after version 1).
    * ``connect(case)``: ``pk.connect`` keyword options (encryption=, blobs=, ...).
    * ``resume(case)``: ``pk.resume`` keyword options (busy=, lease_ttl=).
    * ``around(case)``: a context manager each run of the agent runs in (a process-wide
      setting that must not outlive the run: inline mode shares the test process).
    * ``fields(version)``: state fields this feature adds, ``{name: (annotation, default)}``.
    * ``bumps_state``: the state schema changes between the versions; then
      ``migrate(data)`` turns this feature's fields of a version-1 state dict
      into version 2's, in place.
    * ``step(case, version, i, state, handed)``: its part of step ``i``; returns a
      value recorded with the step (replayed on resume) and handed back to the
      next step as ``handed`` (None at step 0).
    * ``summary(value)``: a JSON view of one step's value, equal for what
      version 1 returned and what version 2 replays or returns.
    * ``check(case, store, stored, final)``: problems (strings) found in the
      finished thread, read by version-2 code in a new process; ``final`` is the
      state's JSON after the later run.
    """

    name: str
    doc: str
    setup: Callable[[Case, int], None] = _none
    connect: Callable[[Case], dict[str, Any]] = _no_options
    resume: Callable[[Case], dict[str, Any]] = _no_options
    around: Callable[[Case], AbstractContextManager[Any]] = lambda _: nullcontext()
    fields: Callable[[int], dict[str, tuple[Any, Any]]] = _no_fields
    bumps_state: bool = False
    migrate: Callable[[dict[str, Any]], None] | None = None
    step: Callable[[Case, int, int, Any, Any], Any] | None = None
    summary: Callable[[Any], Any] = _same
    check: Callable[[Case, pk.Store, Stored, dict[str, Any]], list[str]] = _no_problems
    requires: tuple[str, ...] = field(default=())  # importable modules it needs (a framework)
    #: Stored values of one thread differ in schema across the versions (a class or state
    #: migration): every checkpoint of the mixed chain is loaded by version 2.
    changes_schema: bool = False

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").isalnum():
            raise ConfigurationError(
                f"Feature name must be letters, digits and '_', got {self.name!r}"
            )
        if self.bumps_state and self.migrate is None:
            raise ConfigurationError(
                f"Feature {self.name!r} bumps the state schema: give it migrate="
            )


_FEATURES: dict[str, Feature] = {}


def register_feature(feature: Feature) -> Feature:
    """Add ``feature`` to the matrix (by name; registering the same name again replaces it)."""
    if not isinstance(feature, Feature):
        raise ConfigurationError(
            f"register_feature takes a persistkit.testing.combination.Feature, got {feature!r}"
        )
    _FEATURES[feature.name] = feature
    return feature


def registered_features() -> dict[str, Feature]:
    """Every feature registered so far: the built-in ones first (``persistkit.testing``
    imports ``combination_features`` before anything else can register one), so the
    design's order is the same in every process."""
    return dict(_FEATURES)


# -- the design --------------------------------------------------------------------------


def design(names: Sequence[str]) -> list[tuple[str, ...]]:
    """Combinations covering every pair of ``names`` in all four on/off settings, plus all on.

    See the module docstring for the construction. Deterministic: the same
    names give the same combinations in every process.
    """
    names = list(dict.fromkeys(names))
    k = len(names)
    rows: list[set[str]] = [set()]
    if k:
        m = 2
        while len(list(itertools.combinations(range(m), m // 2 + 1))) < k:
            m += 1
        subsets = list(itertools.combinations(range(m), m // 2 + 1))[:k]
        for r in range(m):
            rows.append({n for n, s in zip(names, subsets, strict=True) if r in s})
        rows.append(set(names))
    combos: list[tuple[str, ...]] = []
    for row in rows:
        combo = tuple(n for n in names if n in row)
        if combo not in combos:
            combos.append(combo)
    for a, b in itertools.combinations(names, 2):
        for want in itertools.product((False, True), repeat=2):
            if not any(
                ((a in c), (b in c)) == want for c in combos
            ):  # pragma: no cover - the construction's promise
                raise AssertionError(f"design() does not cover {a}={want[0]}, {b}={want[1]}")
    return combos


def full_design(names: Sequence[str]) -> list[tuple[str, ...]]:
    """Every combination of ``names`` (the power set: 2**k), for a run that can afford it."""
    names = list(dict.fromkeys(names))
    return [tuple(n for n, on in zip(names, bits, strict=True) if on)
            for bits in itertools.product((False, True), repeat=len(names))]


def design_per_level(names: Sequence[str], levels: Sequence[str]) -> dict[str, list[tuple[str, ...]]]:
    """``design(names)`` spread over the levels of one more factor (the stores): a covering
    array of strength 2 over the features and that factor together.

    Every combination of ``design(names)`` runs on at least one level (so every pair of
    features in all four on/off settings is covered somewhere), and each level gets the
    combinations that put every feature both on and off there (every (feature, level) pair),
    chosen greedily from ``design(names)``. Deterministic, like ``design``. What it does not
    cover: a pair of features together on one *given* level (a strength-3 interaction).
    """
    combos = design(names)
    names = list(dict.fromkeys(names))
    levels = list(dict.fromkeys(levels))
    if not levels:
        return {}
    chosen: dict[str, list[tuple[str, ...]]] = {lv: [] for lv in levels}
    for i, combo in enumerate(combos):
        chosen[levels[i % len(levels)]].append(combo)
    for level in levels:
        def missing(rows: list[tuple[str, ...]]) -> set[tuple[str, bool]]:
            return {(n, v) for n in names for v in (False, True) if not any((n in r) == v for r in rows)}

        while gap := missing(chosen[level]):
            best = max(combos, key=lambda c: sum((n in c) == v for n, v in gap))
            chosen[level].append(best)
        chosen[level].sort(key=combos.index)
    for a, b in itertools.combinations(names, 2):
        for want in itertools.product((False, True), repeat=2):
            if not any(((a in c), (b in c)) == want for rows in chosen.values() for c in rows):  # pragma: no cover
                raise AssertionError(f"design_per_level() does not cover {a}={want[0]}, {b}={want[1]}")
    return chosen


# -- the scenario ------------------------------------------------------------------------


@cache
def state_class(features: tuple[str, ...], version: int) -> type[pk.State]:
    """The state class of a combination in code ``version`` (with its migration from 1)."""
    objs = [registered_features()[n] for n in features]
    bump = any(f.bumps_state for f in objs)
    annotations: dict[str, Any] = {
        "done": Annotated[list[int], pk.append],
        "notes": Annotated[list[str], pk.append],
        "total": Annotated[int, pk.add],
    }
    defaults: dict[str, Any] = {"done": [], "notes": [], "total": 0}
    for f in objs:
        for key, (annotation, default) in f.fields(version).items():
            annotations[key], defaults[key] = annotation, default

    def body(ns: dict[str, Any]) -> None:
        ns["__annotations__"] = annotations
        ns["__module__"] = __name__
        ns.update(defaults)

    name = "persistkit.testing.matrix." + ("+".join(features) or "base")
    kwds = {"name": name, "version": version if bump else 1}
    cls: type[pk.State] = types.new_class(f"MatrixState{version}", (pk.State,), kwds, body)
    if bump and version == 2:

        @pk.migration(cls, from_version=1)
        def migrate(data: dict[str, Any]) -> dict[str, Any]:
            for f in objs:
                if f.migrate is not None:
                    f.migrate(data)
            return data

    return cls


def _effect(case: Case, i: int) -> None:
    with open(case.path("effects.log"), "a") as f:
        f.write(f"{i}\n")
        f.flush()
        os.fsync(f.fileno())


def _die(case: Case) -> None:
    if case.inline:
        raise Crash(case.id)
    os.kill(os.getpid(), signal.SIGKILL)


def open_store(case: Case, **extra: Any) -> pk.Store:
    options: dict[str, Any] = {}
    for f in case.feature_objects():
        options.update(f.connect(case))
    options.update(extra)
    return pk.connect(case.url, **options)


def resume_options(case: Case) -> dict[str, Any]:
    options: dict[str, Any] = {"busy": None}  # no lease unless the leases feature asks for one
    for f in case.feature_objects():
        options.update(f.resume(case))
    return options


def run_agent(
    case: Case,
    store: pk.Store,
    version: int,
    *,
    crash: bool = False,
    indices: Iterable[int] | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """Run the agent on ``case.thread``; with ``crash``, die at the case's position."""
    features = case.feature_objects()
    stepped = [f for f in features if f.step is not None]

    @pk.checkpointed(name="matrix.step")
    def step(i: int, handed: dict[str, Any]) -> dict[str, Any]:
        _effect(case, i)
        if crash and case.crash_at == i and case.when == "in":
            _die(case)
        run = pk.current_run()
        assert run is not None
        run.state.done.append(i)
        run.state.notes.append(f"{MARKER} step {i}")
        run.update(total=i)
        out: dict[str, Any] = {"square": i * i}
        for f in stepped:
            out[f.name] = f.step(case, version, i, run.state, handed.get(f.name))  # type: ignore[misc]
        return out

    outputs: list[dict[str, Any]] = []
    cls = state_class(case.features, version)
    with ExitStack() as around:
        for f in features:
            around.enter_context(f.around(case))
        run = around.enter_context(
            pk.resume(case.thread, store=store, state=cls, run_id=run_id, **resume_options(case))
        )
        handed: dict[str, Any] = {}
        for i in range(case.steps) if indices is None else indices:
            handed = step(i, handed)
            outputs.append(
                {
                    "square": handed["square"],
                    **{f.name: f.summary(handed.get(f.name)) for f in stepped},
                }
            )
            if crash and case.crash_at == i and case.when == "after":
                _die(case)
    return {"run_id": run.run_id, "outputs": outputs}


# -- the jobs ----------------------------------------------------------------------------


def _setup(case: Case, version: int) -> None:
    for f in case.feature_objects():
        f.setup(case, version)


def stored(case: Case, store: pk.Store) -> Stored:
    """Every byte ``case.thread`` left in the store (see :class:`Stored`)."""
    from persistkit.backends import open_backend

    raw_primary: list[bytes] = []
    offloaded: dict[str, bytes] = {}
    direct = open_backend(case.url)
    try:
        raw_primary += [row.payload for row in direct.list(case.thread, "")]
        raw_primary += list(direct.scan_blobs(case.thread, "", "\x7f").values())
    finally:
        direct.close()
    if any(f.connect(case).get("blobs") for f in case.feature_objects()):
        blobs = open_backend(case.blob_url)
        try:
            offloaded = blobs.scan_blobs(case.thread, "", "\x7f")
        finally:
            blobs.close()
    opened: list[bytes] = []
    if store.backend is direct or type(store.backend).__module__.startswith("persistkit.backends"):
        records = raw_primary  # no wrapper: the stored bytes are the records
    else:  # through the wrappers: decrypted, offloaded values fetched
        records = [row.payload for row in store.backend.list(case.thread, "")]
        records += list(store.backend.scan_blobs(case.thread, "", "\x7f").values())
    for rec in records:
        try:
            opened.append(store.codec.open(rec))
        except pk.PersistkitError:
            opened.append(rec)  # not an envelope (a wrapper's own record): scanned as it is
    return Stored(raw_primary + list(offloaded.values()), raw_primary, offloaded, opened)


def _write(case: Case) -> dict[str, Any]:
    _setup(case, 1)
    with open_store(case) as store:
        return run_agent(case, store, 1, crash=case.crash_at is not None)


def _resume(case: Case) -> dict[str, Any]:
    _setup(case, 2)
    v2 = state_class(case.features, 2)
    with open_store(case) as store:
        if case.crash_at is None:  # the reference: read by version 2, as the cases will be
            return {"state": store.get_state(case.thread, state=v2).model_dump(mode="json")}
        out = run_agent(case, store, 2)
        out["state"] = store.get_state(case.thread, state=v2).model_dump(mode="json")
        return out


def check_case(case: Case, store: pk.Store, resumed: dict[str, Any]) -> list[str]:
    """The thread's history, a replay by ``run_id`` and a later run; then each feature's checks."""
    problems: list[str] = []
    v2 = state_class(case.features, 2)
    history = store.history(case.thread)
    failed = [(cp.checkpoint_id, cp.kind) for cp in history if cp.run_status == "failed"]
    if failed:
        problems.append(f"history holds checkpoints of failed runs: {failed}")
    steps = sorted((cp for cp in history if cp.kind == "step"), key=lambda cp: cp.checkpoint_id)
    if [cp.position for cp in steps] != [str(i) for i in range(case.steps)]:
        problems.append(
            f"step checkpoints at positions {[cp.position for cp in steps]}, expected 0..{case.steps - 1}"
        )
    if any(f.bumps_state for f in case.feature_objects()):
        stamps = [cp.schema[1] if cp.schema else None for cp in steps]
        want = [1] * case.committed + [2] * (case.steps - case.committed)
        if stamps != want:
            problems.append(f"schema versions of the step checkpoints {stamps}, expected {want}")
    # Every checkpoint of a mixed-version chain loads by version-2 code (without a
    # feature that changes a schema, the head's load below is the same path).
    mixed = any(f.changes_schema or f.bumps_state for f in case.feature_objects())
    for cp in history if mixed else ():
        try:
            store.get_state(case.thread, cp.checkpoint_id, state=v2)
        except pk.PersistkitError as exc:
            problems.append(
                f"checkpoint {cp.checkpoint_id} ({cp.kind}) does not load: {type(exc).__name__}: {exc}"
            )
    before = _effects(case)
    again = run_agent(case, store, 2, run_id=resumed["run_id"])
    if _effects(case) != before:
        problems.append("replaying the finished run by its run_id ran a step again")
    if again["outputs"] != resumed["outputs"]:
        problems.append(
            f"replaying the finished run returned {again['outputs']}, the run returned {resumed['outputs']}"
        )
    run_agent(case, store, 2, indices=[case.steps])
    if _effects(case) != [*before, case.steps]:
        problems.append(
            f"a later run should have run step {case.steps} once; effects {_effects(case)}"
        )
    final = store.get_state(case.thread, state=v2).model_dump(mode="json")
    if store.get_state(case.thread)["done"] != final["done"]:  # read as a plain dict too
        problems.append("the head read without a state class differs from the typed read")
    if final["done"] != [*range(case.steps), case.steps]:
        problems.append(f"after a later run the state's steps are {final['done']}")
    data = stored(case, store)
    for f in case.feature_objects():
        problems += [f"{f.name}: {p}" for p in f.check(case, store, data, final)]
    return problems


def _check(case: Case) -> dict[str, Any]:
    _setup(case, 2)
    resumed = json.loads(case.path("resume.json").read_text())
    with open_store(case) as store:
        return {"problems": check_case(case, store, resumed)}


def _effects(case: Case) -> list[int]:
    p = case.path("effects.log")
    return [int(x) for x in p.read_text().split()] if p.exists() else []


PHASES: dict[str, Callable[[Case], dict[str, Any]]] = {
    "write": _write,
    "resume": _resume,
    "check": _check,
}


def run_job(case: Case, phase: str) -> str:
    """Run one job and leave ``<phase>.json`` (or ``<phase>.error``) in the case's directory.

    Returns ``"ok"``, ``"crashed"`` (inline: the planned ``Crash``) or ``"error"``.
    """
    try:
        result = PHASES[phase](case)
    except Crash:
        return "crashed"
    except BaseException:  # the job's process reports it; the suite shows the traceback
        case.path(f"{phase}.error").write_text(traceback.format_exc())
        return "error"
    case.path(f"{phase}.json").write_text(json.dumps(result))
    return "ok"


def case_to_json(case: Case) -> dict[str, Any]:
    return asdict(case)
