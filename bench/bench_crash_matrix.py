"""The crash matrix: what proving an agent at every crash point costs against one run of it.

    python3 dev.py bench crash_matrix [--steps 20] [--rounds 5] [--work 0,200]
    .venv/bin/python bench/bench_crash_matrix.py [same options]

The agent: ``--steps`` top-level steps on ``memory://`` (the matrix's inline default), each
appending its result to ``run.state["notes"]``; a step body does ``--work`` iterations of a
fake model's string building (0: an empty body, the matrix's worst case, since its fixed
costs then weigh most). Measured in the same run, interleaved round by round: one uncrashed
run of the agent on a fresh store (the baseline), and ``crash_matrix(agent)`` inline with
every crash point (before, inside and after each step: 3 x steps points). It prints the
medians and the matrix as a multiple of the baseline (the goal: under 20x for 20 steps),
and the floor under any matrix: the two uncrashed runs and the resumes alone, unwatched
(the engine's cost of resuming from each store a crash leaves).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import persistkit as pk
from persistkit.testing.crash_matrix import crash_matrix

TARGET = 20  # issue #25: the matrix of a 20-step agent in-process under 20x one uncrashed run


def make_agent(steps: int, work: int):  # type: ignore[no-untyped-def]
    @pk.checkpointed
    def step(i: int, topic: str) -> str:
        text = topic
        for j in range(work):
            text = f"{text[-40:]} {i}:{j}"
        return text

    thread = f"bench-{uuid.uuid4().hex[:8]}"

    def agent() -> int:
        with pk.resume(thread) as run:
            run.state.setdefault("notes", [])
            for i in range(steps):
                note = step(
                    i, "refund order 42"
                )  # the step first: a replayed step restores run.state
                run.state["notes"].append(note)
            return len(run.state["notes"])

    return agent


def once(agent, store: pk.Store | None = None) -> float:  # type: ignore[no-untyped-def]
    from persistkit.engine import _store

    before = _store._default
    _store._default = store or pk.connect("memory://")
    try:
        t = time.perf_counter()
        agent()
        return time.perf_counter() - t
    finally:
        _store._default = before


def floor(agent) -> float:  # type: ignore[no-untyped-def]
    """What the resumes alone cost, without the matrix: two uncrashed runs (the reference and
    the nondeterminism check) plus the agent resumed, unwatched, from each store a crash
    leaves (one per step: its three points share it). No matrix can go below this."""
    from persistkit.testing._crash_stores import Stores
    from persistkit.testing._crash_watch import Snapshot, Watch
    from persistkit.testing.crash_matrix import call_agent

    pool, points = Stores("memory://", None), []
    store = pool.fresh()
    watch = Watch(points.append)
    call_agent(agent, False, store, watch)
    snapshot, cuts = Snapshot(store, set(watch.runs)), {frozenset(p.cuts.items()) for p in points}
    took = once(agent) + once(agent)
    for cut in cuts - {frozenset()}:
        resumed = pk.connect("memory://")
        snapshot.materialize(resumed, dict(cut))
        took += once(agent, resumed)
    return took


def matrix(agent) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    result = crash_matrix(agent, echo=None)
    took = time.perf_counter() - t
    assert result.ok, str(result)
    return took, len(result.points)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--work", default="0,200")
    args = ap.parse_args()
    for work in [int(w) for w in args.work.split(",")]:
        agent = make_agent(args.steps, work)
        once(agent), matrix(agent)  # warm up: imports, first-call caches
        runs, mats, floors, points = [], [], [], 0
        for _ in range(args.rounds):
            runs.append(statistics.median(once(agent) for _ in range(5)))
            took, points = matrix(agent)
            mats.append(took)
            floors.append(floor(agent))
        run_s, mat_s = statistics.median(runs), statistics.median(mats)
        ratio, floor_x = mat_s / run_s, statistics.median(floors) / run_s
        case = (
            "empty step bodies"
            if work == 0
            else f"step bodies doing {work} iterations of fake work"
        )
        print(
            f"{args.steps} steps, {case}: one run {run_s * 1e3:.2f} ms, matrix of {points} crash points "
            f"{mat_s * 1e3:.1f} ms = {ratio:.1f}x one run (target: under {TARGET}x: "
            f"{'met' if ratio < TARGET else 'NOT met'}); the resumes alone, unwatched: {floor_x:.1f}x"
        )


if __name__ == "__main__":
    main()
