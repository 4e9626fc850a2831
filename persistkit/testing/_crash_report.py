"""The crash matrix's findings, in words a person can act on (``persistkit.testing.crash_matrix``).

Each finding names the crash point, what differs (a state field's diff, the return value,
a step's body runs, the recorded step sequence) and the likely cause, told apart by what
the matrix saw: a value that looks like the time of the run ("code between steps read the
clock"), a step that ran where no run was current ("it was called where no pk.resume run was
current"), arguments that two uncrashed runs agree on but a resume does not ("they depend on
something that is not in the state"), a step that returned something else when it ran
again ("the step is not deterministic"), a state field the store cannot keep.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FAILED",
    "Finding",
    "Outcome",
    "began",
    "cause_of",
    "clock_like",
    "compared",
    "describe_diff",
    "first_difference",
    "same",
    "short",
    "text_of",
    "unaddressed",
]

#: Kinds of finding, and which assertion reports them.
EXACTLY_ONCE = ("ran-twice", "effect", "resume-failed", "reference-failed", "unstorable", "no-steps")
SAME_OUTCOME = (
    "order",
    "state",
    "value",
    "sequence",
    "nondeterminism",
    "arguments",
    "resume-failed",
    "reference-failed",
    "unstorable",
    "no-steps",
)

_STARTED = time.time()


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing the matrix found: ``kind`` (see ``EXACTLY_ONCE`` / ``SAME_OUTCOME``),
    ``message`` (what and the likely cause), ``points`` (the crash points it was seen at)."""

    kind: str
    message: str
    points: tuple[str, ...] = ()
    #: the differences seen at those points that follow from this finding (grouped under it)
    consequences: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = self.message + "".join(f"\n    follows from it: {c}" for c in self.consequences)
        if not self.points:
            return text
        shown = ", ".join(self.points[:3]) + (
            f" and {len(self.points) - 3} more" if len(self.points) > 3 else ""
        )
        return f"{text}\n    seen at: {shown}"


@dataclass(slots=True)
class Outcome:
    """What one agent call ended with: its return value (or error), each thread's final
    state, the recorded step sequence per thread, and how often each step body ran."""

    value: Any = None
    error: BaseException | None = None
    states: dict[tuple[str, str], Any] = field(default_factory=dict)
    # per chain: its step checkpoints (position, name, run ordinal) in the order they landed
    sequences: dict[tuple[str, str], list[tuple[str, str, str]]] = field(default_factory=dict)
    counts: Mapping[tuple[str, str, str, str], int] = field(default_factory=dict)
    plain: Mapping[str, int] = field(default_factory=dict)
    results: dict[tuple[str, str, str, str], Any] = field(default_factory=dict)
    digests: dict[tuple[str, str, str, str], str] = field(default_factory=dict)
    names: dict[tuple[str, str, str, str], str] = field(default_factory=dict)  # step key -> name


def short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _leaves(value: Any, path: str) -> Iterable[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{path}[{i}]")
    elif (held := _held(value)) is not None:
        yield from _leaves(held, path)
    else:
        yield path, value


def first_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first place (a path such as ``notes[2]``) where ``a`` and ``b`` differ."""
    if _same(a, b):
        return None
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for k in list(a) + [k for k in b if k not in a]:
            sub = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                return sub, a.get(k, "<missing>"), b.get(k, "<missing>")
            found = first_difference(a[k], b[k], sub)
            if found is not None:
                return found
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found is not None:
                return found
        if len(a) != len(b):
            return f"{path} (length)", len(a), len(b)
    left, right = _held(a), _held(b)
    if type(a) is type(b) and left is not None and right is not None:
        return first_difference(left, right, path)
    return path, a, b


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def unaddressed(text: str) -> str:
    """``text`` without memory addresses (``<... object at 0x7f...>``): two runs' objects
    of one kind print the same."""
    return _ADDRESS.sub(" at 0x...", text)


def text_of(value: Any) -> str:
    return unaddressed(repr(value))


def _attributes(value: Any) -> dict[str, Any] | None:
    """What an object holds (its ``vars()`` and slots), or None when it holds nothing
    Python can read (a lock, a C object)."""
    found: dict[str, Any] = dict(getattr(value, "__dict__", None) or {})
    for cls in type(value).__mro__:
        slots = getattr(cls, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                found[name] = getattr(value, name)
    return found if found or hasattr(value, "__dict__") else None


def _own_eq(value: Any) -> bool:
    """Whether ``value``'s type defines ``==`` (else ``==`` compares identity)."""
    eq: Any = type(value).__eq__
    return eq is not _OBJECT_EQ


_OBJECT_EQ: Any = object.__eq__


def _held(value: Any) -> dict[str, Any] | None:
    """The attributes of an object that ``==`` compares by identity (None: not one)."""
    if isinstance(value, Mapping | list | tuple | str | bytes) or _own_eq(value):
        return None
    return _attributes(value)


def _same(a: Any, b: Any, depth: int = 0) -> bool:
    """``a == b``; for an object whose type has no ``__eq__`` of its own (an SDK's result
    class, a lock), which ``==`` compares by identity: the same type holding the same
    attributes (compared so, recursively), or, holding none Python can read, the same text."""
    try:
        if a == b:
            return True
    except Exception:  # a value whose == raises: compared by its text
        return text_of(a) == text_of(b)
    if depth > 20 or type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y, depth + 1) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], depth + 1) for k in a)
    if _own_eq(a):
        return False  # its own == said they differ
    left, right = _attributes(a), _attributes(b)
    if left is None or right is None:
        return text_of(a) == text_of(b)
    return left.keys() == right.keys() and all(_same(left[k], right[k], depth + 1) for k in left)


def clock_like(value: Any) -> bool:
    """Whether ``value`` looks like a reading of the clock taken while the matrix runs."""
    lo, hi = _STARTED - 86400, time.time() + 86400
    if isinstance(value, dt.datetime):
        stamp = value if value.tzinfo else value.astimezone()
        return lo <= stamp.timestamp() <= hi
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return any(lo <= value / scale <= hi for scale in (1, 1e3, 1e6, 1e9))
    if isinstance(value, str) and 10 <= len(value) <= 40:
        try:
            return clock_like(dt.datetime.fromisoformat(value))
        except ValueError:
            return False
    return False


#: ``time.monotonic()`` and ``time.perf_counter()`` when the current matrix began (``began``).
_SINCE = [time.monotonic(), time.perf_counter()]


def began() -> None:
    """A matrix begins: a monotonic reading taken from now on is one of its runs'."""
    _SINCE[:] = [time.monotonic(), time.perf_counter()]


def _monotonic_like(value: Any) -> bool:
    """A float between the matrix's start and now on ``time.monotonic`` or ``perf_counter``
    (system-wide clocks: a forked child reads the same): what a run read. Any other float
    falls in that window of a few seconds only by a rare coincidence."""
    if type(value) is not float:
        return False
    return _SINCE[0] <= value <= time.monotonic() or _SINCE[1] <= value <= time.perf_counter()


def differs_by_clock(a: Any, b: Any) -> bool:
    """Whether the leaves where ``a`` and ``b`` differ look like two readings of the clock
    (the wall clock, or two of a monotonic clock taken while the matrix runs)."""
    left, right = dict(_leaves(a, "")), dict(_leaves(b, ""))
    return any(
        (clock_like(left[p]) or clock_like(right[p]) or (_monotonic_like(left[p]) and _monotonic_like(right[p])))
        and not _same(left[p], right[p])
        for p in left.keys() & right.keys()
    )


def describe_diff(what: str, ref: Any, got: Any) -> str:
    """``what`` differs: where, the uncrashed run's value and the resumed one's."""
    found = first_difference(ref, got)
    if found is None:
        return f"{what} is the same"
    path, a, b = found
    where = f"{what}{'.' + path if path and not path.startswith((' ', '[')) else path}"
    return f"{where} differs: uncrashed run {short(a)}, after the crash {short(b)}"


def cause_of(
    names: Mapping[Any, str], ref: Outcome, got: Outcome, changed: Mapping[Any, Any]
) -> tuple[Callable[[Any, Any], str], str | None]:
    """The likely cause of a difference between the outcome ``ref`` a resume should have
    ended with and the one it ended with, ``got``; and what groups its findings across crash
    points (the step whose arguments moved or whose result changed; None: the cause's text).
    ``changed``: the step results the resumed outcome rests on (what the killed run recorded,
    what the resume ran again) that differ from ``ref``'s, when the matrix could not make an
    uncrashed run rest on them too (``ref`` is then the uncrashed run)."""
    moved = [k for k, d in got.digests.items() if k in ref.digests and d != ref.digests[k]]
    rerun = list(changed)

    def cause(a: Any, b: Any) -> str:
        if moved:
            k = moved[0]
            return (
                f"it follows from the arguments of step `{names.get(k, '?')}` at position {k[2]}, "
                "which differ on replay (see that finding)"
            )
        if rerun:
            k = rerun[0]
            return (
                f"step `{names.get(k, '?')}` at position {k[2]} returned {short(changed[k], 60)} after the crash "
                f"(in the run that crashed or in its resume), {short(ref.results.get(k), 60)} in the uncrashed run: "
                "the step is not deterministic (a clock, a random choice or a real model inside it), and an "
                "uncrashed run given that result could not be made to compare with; give the matrix a fake model"
            )
        if differs_by_clock(a, b):
            return (
                "code between steps read the clock (time.time, datetime.now, time.monotonic, perf_counter): every "
                "resume reads it again; read it inside a step, whose result is recorded"
            )
        return (
            "code between steps is not deterministic or reads something that is not in the state (a global, "
            "a cache, a random choice): make it a step, or keep what it needs in run.state"
        )

    tag = f"arguments {moved[0]}" if moved else f"result {rerun[0]}" if rerun else None
    return cause, tag


same = _same

#: How a step checkpoint that records a failure shows in a recorded step sequence.
FAILED = " (failed)"


def _order(position: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in position.split("/"))


def compared(sequence: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """A recorded step sequence as the replay contract sees it: in position order within
    each run (position is given by call order; steps run side by side land in any order),
    without the failures a retry ran again — the same step recorded later in the run, by its
    ``retry=`` at the same position or by the agent's own loop at the next: how often a
    transient error struck is no outcome. Positions are then renumbered by what is left (a
    retry loop's next call lands one position further per failure)."""
    ordered = sorted(sequence, key=lambda s: (int(s[2]) if s[2].isdigit() else 0, _order(s[0])))
    kept = [
        s
        for i, s in enumerate(ordered)
        if not (
            s[1].endswith(FAILED)
            and any(
                t[2] == s[2] and t[1] == s[1].removesuffix(FAILED) and _parent(t[0]) == _parent(s[0])
                for t in ordered[i + 1 :]
            )
        )
    ]
    # renumber each run's positions by the order of what is left, parent by parent
    out, seen, renamed = [], {}, {}  # type: ignore[var-annotated]
    for pos, name, run in kept:
        parent = _parent(pos)
        parent = renamed.get((run, parent), parent)
        n = seen.get((run, parent), 0)
        seen[(run, parent)] = n + 1
        new = f"{parent}/{n}" if parent else str(n)
        renamed[(run, pos)] = new
        out.append((new, name, run))
    return out


def _parent(position: str) -> str:
    return position.rpartition("/")[0]
