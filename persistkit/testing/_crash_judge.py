"""How the crash matrix judges one resume (``persistkit.testing.crash_matrix``).

:class:`Judge` is the half of the matrix that compares a resumed run with the uncrashed
one and words the findings: how often each step body ran (every committed step once, the
one in flight at the crash once more per attempt its ``retry=`` allows), the arguments
each step was called with, the return value, each thread's state and its recorded step
sequence (compared as the replay contract compares it: ``_crash_report.compared``). A
difference that follows from another finding is listed under it ("follows from it"), not
as a finding of its own: the first step whose arguments moved, or a step before it that
changed its own argument in place.
"""

from __future__ import annotations

import re
from typing import Any

from .._errors import NonDeterminismError, SerializationError
from ..engine._store import Store
from ._crash_report import (
    Outcome,
    cause_of,
    compared,
    describe_diff,
    differs_by_clock,
    first_difference,
    same,
    short,
)
from ._crash_watch import Key, Point, StepCall, Watch

__all__ = ["Judge"]


class Judge:
    """The judging half of ``crash_matrix._Matrix`` (a mixin: the matrix holds the state)."""

    found: dict[tuple[str, str], list[str]]
    texts: dict[tuple[str, str], str]
    names: dict[Key, str]
    shaky: dict[Key, str]
    attempts: dict[Key, int]
    under: dict[tuple[str, str], list[str]]
    order: dict[Key, int]
    mutated: dict[Key, str]

    def _expected(self, p: Point, ref: Outcome, got: Outcome) -> tuple[Outcome, dict[Key, Any]]:
        raise NotImplementedError

    def note(
        self,
        kind: str,
        message: str,
        point: str | None = None,
        group: str | None = None,
        under: tuple[str, str] | None = None,
    ) -> tuple[str, str]:
        """Record a finding; findings of one ``group`` (default: the message) are one, at many
        points. ``under``: the finding this one follows from; it is listed there, not apart."""
        if under is not None:
            follows = self.under.setdefault(under, [])
            if message not in follows:
                follows.append(message)
            return under
        key = (kind, group or message)
        self.texts.setdefault(key, message)
        seen = self.found.setdefault(key, [])
        if point is not None and point not in seen:
            seen.append(point)
        return key

    def _judge(self, p: Point, ref: Outcome, got: Outcome) -> None:
        label = p.label()
        self._counts(p, ref, got, label)
        if got.error is not None:
            self._resume_error(got.error, label)
            return
        ref, changed = self._expected(p, ref, got)
        moved = sorted(
            (k for k, d in got.digests.items() if k in ref.digests and d != ref.digests[k]),
            key=lambda k: self.order.get(k, len(self.order)),
        )
        root = self._arguments(self.names.get(moved[0], "?"), moved[0][2], label) if moved else None
        for k in moved[1:]:  # the arguments of later steps, built from the first's
            self.note("arguments", f"the arguments of step `{self.names.get(k, '?')}` at position {k[2]} differ in turn", under=root)
        # no argument moved: a difference may follow from an argument a replayed step changed in place
        mut = None if root is not None else next((k for k in self.mutated if k in p.committed), None)

        def under() -> tuple[str, str] | None:
            return root if root is not None or mut is None else self._mutation(mut, label)

        cause, tag = cause_of(self.names, ref, got, changed)
        if not same(ref.value, got.value):
            what, why = (
                describe_diff("the return value", ref.value, got.value),
                cause(ref.value, got.value),
            )
            self.note("value", f"{what}: {why}", label, group=f"value {tag or why}", under=under())
        for chain in sorted(set(ref.states) | set(got.states)):
            a, b = ref.states.get(chain), got.states.get(chain)
            if not same(a, b):
                what, why = describe_diff(f"thread {chain[0]!r}: state", a, b), cause(a, b)
                where = first_difference(a, b)
                self.note(
                    "state",
                    f"{what}: {why}",
                    label,
                    group=f"{chain} {where[0] if where else ''} {tag or why}",
                    under=under(),
                )
            sa, sb = compared(ref.sequences.get(chain, [])), compared(got.sequences.get(chain, []))
            if sa != sb:
                i = next(
                    (i for i, (x, y) in enumerate(zip(sa, sb, strict=False)) if x != y),
                    min(len(sa), len(sb)),
                )
                one = sa[i] if i < len(sa) else ("-", "nothing", "")
                two = sb[i] if i < len(sb) else ("-", "nothing", "")
                self.note(
                    "sequence",
                    f"thread {chain[0]!r}: the recorded steps differ from checkpoint {i} on: uncrashed `{one[1]}` at {one[0]}, "
                    f"after the crash `{two[1]}` at {two[0]} ({len(sa)} and {len(sb)} step checkpoints)",
                    label,
                    under=under(),
                )

    def _counts(self, p: Point, ref: Outcome, got: Outcome, label: str) -> None:
        retried = any(a > 1 for a in self.attempts.values())  # else no parent allows attempts
        for key in sorted(set(ref.counts) | set(got.counts) | set(p.counts)):
            total = p.counts.get(key, 0) + got.counts.get(key, 0)
            in_flight = p.counts.get(key, 0) > 0 and key not in p.committed
            # the step in flight at the crash may run again on resume: each attempt its retry= allows
            again = self.attempts.get(key, 1) if in_flight else 0
            # a step under a retry= parent in flight at the crash: the resumed parent may run it on each attempt
            if retried:
                again = max(again, self._parent_attempts(p, key) * self.attempts.get(key, 1))
            # a position the uncrashed run never reached (a transient error struck the resume
            # once more, and the agent's own loop called the step again): once, like any step
            allowed = max(ref.counts.get(key, 0), 1) + again
            if total > allowed:
                name, at = self.names.get(key) or got.names.get(key, "a step"), _at(key)
                if key in p.committed:
                    msg = f"step `{name}` at {at} ran again after its checkpoint had committed ({total} times in all)"
                else:
                    msg = f"step `{name}` at {at} ran {total} times, {allowed} allowed"
                self.note("ran-twice", msg, label)
        for name in sorted(set(ref.plain) | set(got.plain) | set(p.plain)):
            total, once = p.plain.get(name, 0) + got.plain.get(name, 0), ref.plain.get(name, 0)
            if total > once:
                self.note(
                    "ran-twice",
                    f"step `{name}` ran {_times(total)} ({_times(once)} in the uncrashed run): it was called where no "
                    "pk.resume run was current (in another thread the context did not follow, or before or after the "
                    "block), so nothing records it and every resume runs it again. "
                    "Call it inside the block, in the block's thread (contextvars.copy_context().run for a pool)",
                    label,
                )

    def _parent_attempts(self, p: Point, key: Key) -> int:
        """The most attempts a retry= step ``key`` is nested in allows, when it was in flight
        at ``p`` (its body ran, its checkpoint had not landed); 0 if none was."""
        parts = key[2].split("/")
        up = [(key[0], key[1], "/".join(parts[:i]), key[3]) for i in range(1, len(parts))]
        return max(
            (self.attempts.get(a, 1) for a in up if p.counts.get(a, 0) > 0 and a not in p.committed and self.attempts.get(a, 1) > 1),
            default=0,
        )

    def _resume_error(self, error: BaseException, label: str) -> None:
        if isinstance(error, NonDeterminismError) and "different arguments" in str(error):
            self._arguments(str(error.step), str(error.position), label)
            return
        if isinstance(error, NonDeterminismError):
            self.note(
                "sequence",
                f"on replay another step was called at position {error.position} than the run recorded "
                f"(`{error.step}`): the code between steps chose another path, it depends on something that is not in the state",
                label,
            )
            return
        first = str(error).splitlines()[0] if str(error) else ""
        self.note(
            "resume-failed",
            f"the resumed run raised {type(error).__name__}: {short(first, 300)}",
            label,
        )

    def _arguments(self, step: str, position: str, label: str) -> tuple[str, str]:
        """The finding that the arguments of ``step`` differ on replay, or the one it follows
        from (a step before it that changed its own argument in place)."""
        key = next((k for k, n in self.names.items() if k[2] == position and n == step), None)
        at = self.order.get(key, len(self.order)) if key else len(self.order)
        earlier = [k for k in self.mutated if self.order.get(k, at) < at]
        if earlier and not (key and key in self.shaky):
            root = self._mutation(earlier[-1], label)
            self.note("arguments", f"the arguments of step `{step}` at position {position} differ on replay", under=root)
            return root
        cause = (self.shaky.get(key) if key else None) or (
            "they depend on something that is not in the state (a global, a cache, or a variable a step's body "
            "sets: a replayed step does not run its body). Build them from run.state or from step results"
        )
        return self.note(
            "arguments",
            f"the arguments of step `{step}` at position {position} differ on replay: {cause}",
            label,
        )

    def _mutation(self, key: Key, label: str) -> tuple[str, str]:
        names = self.mutated[key]
        return self.note(
            "arguments",
            f"step `{self.names.get(key, '?')}` at position {key[2]} changes its own argument {names} in place: a "
            "replayed step does not run its body, so after a crash the caller's object keeps its old value. Return "
            "the new value instead (or change a copy)",
            label,
        )

    def _between(self, watch: Watch) -> None:
        """What the uncrashed run did outside its steps that a resume does again, and the
        arguments its steps changed in place (findings only when a resume differs)."""
        for i, c in enumerate(watch.calls):
            self.order.setdefault(c.key, i)
            if c.mutated and c.key not in self.mutated:
                self.mutated[c.key] = ", ".join(f"`{n}`" for n in c.mutated)
        for what, where in dict.fromkeys(watch.effects):
            self.note(
                "effect",
                f"an effect outside a step, it will run again on every resume: {what} at {where}. Make it a "
                "@pk.checkpointed step (or move it into one), whose body a resume does not run again once it committed",
            )

    # -- the uncrashed runs -----------------------------------------------------------------

    def _reference_failed(self, error: BaseException) -> None:
        text = str(error).splitlines()[0] if str(error) else type(error).__name__
        if isinstance(error, SerializationError):
            m = re.search(r"state\.([\w.\[\]]+): cannot serialize an object of type ([\w.]+)", text)
            if m:
                self.note(
                    "unstorable",
                    f"state field `{m.group(1)}` cannot be stored (it holds a {m.group(2)}), so the uncrashed run failed "
                    "before any crash point: keep functions, locks, clients and other live objects out of run.state; "
                    "store the data they stand for",
                )
                return
        self.note(
            "reference-failed",
            f"the uncrashed run raised {type(error).__name__}: {short(text, 400)} (no crash point was tried)",
        )

    def _unstorable(self, store: Store, watch: Watch) -> None:
        """A state field the run held in memory that the store does not give back as it was."""
        for chain, mem in watch.end_states.items():
            try:
                if hasattr(mem, "model_dump"):
                    stored = store.get_state(chain[0], namespace=chain[1], state=type(mem))
                else:
                    stored = store.get_state(chain[0], namespace=chain[1])
            except Exception as exc:  # the finding says what
                self.note(
                    "unstorable",
                    f"the state of thread {chain[0]!r} does not load back: {type(exc).__name__}: {exc}",
                )
                continue
            found = first_difference(_fields(mem), _fields(stored))
            if found is not None:
                path, a, b = found
                self.note(
                    "unstorable",
                    f"state field `{path}` does not come back from the store as the run held it: in memory {short(a)}, "
                    f"read back {short(b)}; a resumed run sees the stored value. Store plain data (JSON-like values, "
                    "pydantic models, dataclasses), not live objects",
                )

    def _compare_uncrashed(self, a: list[StepCall], b: list[StepCall], second: Outcome) -> None:
        if second.error is not None:
            self.note(
                "nondeterminism",
                f"a second uncrashed run raised {type(second.error).__name__}: {short(str(second.error), 300)}",
            )
        for x, y in zip(a, b, strict=False):
            if x.key != y.key or x.step != y.step:
                self.note(
                    "nondeterminism",
                    f"two uncrashed runs called different steps: `{x.step}` at position {x.key[2]} in one, `{y.step}` at "
                    f"{y.key[2]} in the other: the code between steps chose another path (it reads the clock, a random "
                    "choice or a global; keep such reads in steps)",
                )
                return
            if x.digest != y.digest:
                where = first_difference((x.args, x.kwargs), (y.args, y.kwargs))
                detail = (
                    f" ({short(where[1])} in one, {short(where[2])} in the other)" if where else ""
                )
                if differs_by_clock((x.args, x.kwargs), (y.args, y.kwargs)):
                    cause = "code between steps read the clock: read it inside a step, whose result is recorded"
                else:
                    cause = (
                        "they depend on something that is not in the state and not deterministic (a random "
                        "choice, a uuid, a global the runs changed): make it a step, or keep it in run.state"
                    )
                self.shaky[x.key] = cause
                self.note(
                    "nondeterminism",
                    f"the arguments of step `{x.step}` at position {x.key[2]} differ between two uncrashed runs{detail}: {cause}",
                )
        if len(a) != len(b):
            self.note(
                "nondeterminism",
                f"two uncrashed runs ran {len(a)} and {len(b)} step bodies: the code between steps is not deterministic",
            )


def _fields(state: Any) -> Any:
    return state.model_dump() if hasattr(state, "model_dump") else state

def _at(key: Key) -> str:
    """Where a step key is, for a person: its position, and its run when not the thread's first."""
    run = f" of run {int(key[3]) + 1} on thread {key[0]!r}" if key[3] != "0" else ""
    return f"position {key[2]}{run}"


def _times(n: int) -> str:
    return {1: "once", 2: "twice"}.get(n, f"{n} times")
