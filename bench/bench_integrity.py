"""What tamper evidence costs per step, on SQLite, measured against the plain store in one run.

    python3 dev.py bench integrity
    .venv/bin/python bench/bench_integrity.py   (a venv with pip install -e '.[bench]')

Workload (the one of bench_sqlite.py): an agent of 200 steps, each appending
a 1 KB message to the state. Prints the mean per-step cost of (a) the plain
store, (b) ``integrity=`` (keyed hash chain, no witness), (c) plus a file
witness (flushed), (d) plus a file witness with fsync, and the time of a
``get_state`` of the 200-step thread and of entering ``resume`` on it
(reads: head + newest row check + chain walk). Median of interleaved rounds;
ratios are against (a) measured in the same run.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import _env  # noqa: F401 -- first: a missing package says how to run this script
from bench_sqlite import STEPS, Chat, append_step, messages

import persistkit as pk
from persistkit.wrappers._witness import FileWitness

ROUNDS = 7
KEY = os.urandom(32)


def run(tmp: Path, name: str, msgs: list[dict[str, str]], mode: dict[str, Any]) -> tuple[float, float, float]:
    def options() -> dict[str, Any]:
        opts = dict(mode)
        if opts.get("witness") == "file":
            opts["witness"] = f"file:{tmp}/{name}.witness"
        elif opts.get("witness") == "fsync":
            opts["witness"] = FileWitness(tmp / f"{name}.witness", fsync=True)
        return opts

    store = pk.connect(f"sqlite:///{tmp}/{name}.db", **options())
    t0 = time.perf_counter()
    with pk.resume("t", store=store, state=Chat):
        for m in msgs:
            append_step(m)
    per_step = (time.perf_counter() - t0) / len(msgs)
    store.close()
    store = pk.connect(f"sqlite:///{tmp}/{name}.db", **options())  # a fresh process's view: no caches
    t0 = time.perf_counter()
    state = store.get_state("t", state=Chat)
    get_state = time.perf_counter() - t0
    assert len(state.messages) == STEPS
    t0 = time.perf_counter()
    with pk.resume("t", store=store, state=Chat):
        pass
    resume = time.perf_counter() - t0
    store.close()
    return per_step, get_state, resume


def main() -> int:
    msgs = messages(STEPS)
    modes: dict[str, dict[str, Any]] = {
        "(a) plain": {},
        "(b) integrity": {"integrity": KEY},
        "(c) integrity + file witness": {"integrity": KEY, "witness": "file"},
        "(d) integrity + witness, fsync": {"integrity": KEY, "witness": "fsync"},
    }
    results: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for r in range(ROUNDS):
            for i, (mode, opts) in enumerate(modes.items()):
                results[mode].append(run(tmp, f"m{i}r{r}", msgs, opts))
    base = [statistics.median(x[k] for x in results["(a) plain"]) for k in range(3)]
    print(f"{STEPS} steps, each appending a 1 KB message, SQLite; median of {ROUNDS} interleaved rounds\n")
    print(f"{'':<34}{'per step':>10}{'ratio':>8}{'get_state':>12}{'ratio':>8}{'resume':>10}{'ratio':>8}")
    for mode, rows in results.items():
        med = [statistics.median(x[k] for x in rows) for k in range(3)]
        print(
            f"{mode:<34}{med[0] * 1e6:>8.0f}µs{med[0] / base[0]:>7.2f}x"
            f"{med[1] * 1e3:>10.2f}ms{med[1] / base[1]:>7.2f}x"
            f"{med[2] * 1e3:>8.2f}ms{med[2] / base[2]:>7.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
