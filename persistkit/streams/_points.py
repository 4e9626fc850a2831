"""Where an event was emitted, and the rule that decides what becomes of it (docs/streams.md).

An event's **point** is ``(step, started)``: the position of the innermost step that
emitted it (``""``: the block) and how many child steps that step had started. Code runs
again on a resume or a retry; the run's records then decide, for the events the earlier
attempt wrote:

* covered: a step committed after the point in the same scope (a record under a child
  ``>= started`` of ``step``). The same code emits the same event before reaching that
  record again, so a replayed emit there is suppressed and the stored event is final;
* replayed whole: ``step`` or a step it is nested in has a record that replays (completed,
  or a failure that did not end an attempt): its body does not run again; final;
* otherwise the attempt's event is superseded (when that attempt has ended).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["Cover", "ancestors", "started"]


def started(frame: Any) -> int:
    """How many child steps ``frame`` (an engine frame) has started: its ``seq`` counter's
    next value. ``itertools.count`` shows it only in its repr (no attribute, and reading it
    with ``next`` would take a position)."""
    seq = frame.seq
    return 0 if seq is None else int(repr(seq)[6:-1])


def ancestors(path: str) -> list[str]:
    """The step positions enclosing ``path`` and ``path`` itself, outermost first."""
    if not path:
        return []
    parts = path.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


class Cover:
    """For each scope, the highest child index under which the run has a record."""

    __slots__ = ("top",)

    def __init__(self) -> None:
        self.top: dict[str, int] = {}

    @classmethod
    def of(cls, positions: Iterable[str], max_child: dict[str, int] | None = None) -> Cover:
        c = cls()
        for pos in positions:
            c.add(pos)
        for parent, n in (max_child or {}).items():
            if n > c.top.get(parent, -1):
                c.top[parent] = n
        return c

    def add(self, position: str) -> None:
        parts = position.split("/")
        top = self.top
        for i, part in enumerate(parts):
            if not (part.isdigit() and part.isascii()):
                return  # not a step position (a layer's own record)
            parent = "/".join(parts[:i])
            n = int(part)
            if n > top.get(parent, -1):
                top[parent] = n

    def covers(self, step: str, started: int) -> bool:
        return self.top.get(step, -1) >= started


def is_final(step: str, started: int, cover: Cover, replays: Callable[[str], bool]) -> bool:
    """Whether an event emitted at ``(step, started)`` by an attempt that ended stands."""
    return cover.covers(step, started) or any(replays(a) for a in ancestors(step))


def replays_in(run: Any) -> Callable[[str], bool]:
    """Whether the record at a position of ``run`` replays (the cursor's own decision)."""

    def replays(position: str) -> bool:
        rec = run._index.get(position)
        if rec is None:
            return False
        return not (rec.body.get("s") == "failed" and run._ended_attempt(rec, position))

    return replays
