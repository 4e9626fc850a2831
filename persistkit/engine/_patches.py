"""``pk.patched("id")`` and ``pk.deprecate_patch("id")``: change the code of runs that wait.

A run that waits days (a suspended approval, a crashed job awaiting its retry) is
continued by code deployed after it started. A change to what the code does between or
instead of steps would make the old run's replay meet other steps than it recorded
(``NonDeterminismError``). Guard the change::

    if pk.patched("refund-v2"):
        refund_v2(order)          # new runs, and old runs that got here under new code
    else:
        refund(order)             # runs recorded before the patch existed

The answer is recorded, never guessed. The first time a block asks about an id:

* the run recorded the id (a ``pt`` key on any of its records) → True;
* the run is *replaying* at this point → False: it recorded steps this block has not
  reached yet (see :func:`_past`), or it is a completed run replayed read-only (its
  end is past every point) — old code went past this point without the id;
* otherwise the run is at its live frontier → True, and the id rides on the run's next
  checkpoint of any kind (``run._attach["pt"]``: no write of its own).

The block keeps that answer for the id (a loop asking on every turn gets one answer).
Why this is safe: a True answer is attached to the next row the run writes, so any
row written after a block took the new path carries the id or follows one that does;
if no record carries it, nothing recorded depends on the new path, and the old path
is what the recorded steps past this point ran.

"Not reached yet": a recorded step position is reached when it (or a step it is
nested in) was replayed or ran in this block, or when it comes before this point in
the calling code's own order: an ancestor of the calling step, or an earlier position
(``0/3`` is before ``0/4`` and ``1``). Concurrent async steps: a sibling branch's
recorded steps count as not reached until that branch replays them, so a branch that
asks while another still replays gets False (the old path, which is always safe when
the id was never recorded).

Outside a run ``patched`` is True: there is no run to be old.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import ConfigurationError, NonDeterminismError

if TYPE_CHECKING:
    from ._api import _Frame
    from ._run import Run

__all__ = ["deprecate_patch", "patched"]


def patched(patch_id: str) -> bool:
    """True where the new code path may run: in runs that reach this point live (the id is
    recorded with the run's next checkpoint), in replays of runs that recorded the id, and
    outside a run; False when replaying a run recorded before the patch existed (it went
    past this point without the id). See docs/long-runs.md, "Deploys while runs wait"."""
    from ._api import _CURRENT

    _check_id(patch_id, "patched")
    frame = _CURRENT.get()
    if frame is None:
        return True
    run = frame.run
    known = run._patches.get(patch_id)
    if known is not None:
        return known
    past = _past(run, frame)
    answer = not past
    run._patches[patch_id] = answer
    if answer:
        _attach(run, patch_id)
    else:
        _note_old(run, patch_id, past)
    return answer


def deprecate_patch(patch_id: str) -> None:
    """Mark the patch ``patch_id`` as always taken, once no run recorded before it remains
    (``persistkit replay-check`` lists the runs that still need its old path): replace
    ``if pk.patched(id): new() else: old()`` by ``pk.deprecate_patch(id); new()``.

    Like Temporal's ``deprecatePatch``: a run reaching it live records the id as
    ``patched`` does (so a rollback to the code with ``patched`` still sends that run down
    the new path), and a run that recorded the id replays. A run recorded before the patch
    existed (it went past this point without the id) raises ``NonDeterminismError``
    instead of being sent down a path it never took. Outside a run it does nothing."""
    from ._api import _CURRENT

    _check_id(patch_id, "deprecate_patch")
    frame = _CURRENT.get()
    if frame is None:
        return
    run = frame.run
    known = run._patches.get(patch_id)
    if known:
        return
    past = _past(run, frame) if known is None else []
    if known is None and not past:
        run._patches[patch_id] = True
        _attach(run, patch_id)
        return
    _note_old(run, patch_id, past)
    if not past:
        where = f"pk.patched({patch_id!r}) answered False earlier in this block"
    elif past[0] == "end":
        where = "it completed without it"
    else:
        where = f"its step at {past[0]} was recorded past this point without it"
    raise NonDeterminismError(
        f"thread {run.thread_id!r} run {run.run_id}: pk.deprecate_patch({patch_id!r}) was reached "
        f"by a run recorded before the patch existed ({where}): the run needs the old path, "
        "which this code no longer has. Put back "
        f"`if pk.patched({patch_id!r}): ... else: ...` until `persistkit replay-check` lists no "
        "run that needs it. " + run.remedies(),
        position=_here(frame), step=f"pk.deprecate_patch({patch_id!r})",
    )


def _check_id(patch_id: object, fn: str) -> None:
    if not isinstance(patch_id, str) or not patch_id or len(patch_id) > 200:
        raise ConfigurationError(
            f"pk.{fn}({patch_id!r}): a patch id is a non-empty str of at most 200 characters "
            "naming one change, e.g. pk.patched('refund-v2'); keep it once it is deployed"
        )


def _attach(run: Run, patch_id: str) -> None:
    """The id rides on the run's next checkpoint. A new list each time: ``_landed`` clears
    an attachment only if the row carried that very object."""
    if run.replay_only:
        return  # a read-only replay (or a replay check) writes nothing
    ids = run._attach.get("pt") or []
    if patch_id not in ids:
        run._attach["pt"] = [*ids, patch_id]


def _note_old(run: Run, patch_id: str, past: list[str]) -> None:
    """Tell a replay check (if one runs) that this run needs the old path of ``patch_id``."""
    from ._replay_check import CHECKING

    check = CHECKING.get()
    if check is not None:
        check.old_patch(run, patch_id)


def _here(frame: _Frame) -> str:
    """The position the next step of ``frame`` would take (the point of the call)."""
    seq = frame.seq
    n = 0 if seq is None else int(repr(seq)[6:-1])  # itertools.count's repr: "count(5)"
    return f"{frame.path}/{n}" if frame.path else str(n)


def _key(position: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in position.split("/")) if position else ()


def _past(run: Run, frame: _Frame) -> list[str]:
    """The recorded step positions of ``run`` this block has not reached at this point (the
    run is replaying while there are any), in position order; ``["end"]`` for a completed run
    replayed read-only. Asked once per patch id and block: O(recorded steps)."""
    from ._replay_check import CHECKING

    if run.replay_only and CHECKING.get() is None:
        return ["end"]  # a completed run replayed read-only: its end is past every point
    here = _key(_here(frame))
    reached = {pos for pos, *_ in run._events}
    out: list[tuple[tuple[int, ...], str]] = []
    for pos in run._index:
        key = _key(pos)
        if key < here:
            continue  # before this point in the calling code's order (or an ancestor of it)
        parts = pos.split("/")
        if any("/".join(parts[: i + 1]) in reached for i in range(len(parts))):
            continue  # it, or a step it is nested in, replayed or ran in this block
        out.append((key, pos))
    return [pos for _, pos in sorted(out)]
