"""Turns: what a short agent turn costs when many processes share one store.

    python3 dev.py bench turns [--processes 8] [--threads 4] [--steps 2,10,50]
                               [--turns-per-thread 10] [--seconds 6] [--rounds 2]
                               [--stores sqlite,postgres]
    .venv/bin/python bench/bench_turns.py [same options]   (a venv with pip install -e '.[bench]')
    quick check:  bench/bench_turns.py --processes 2 --threads 2 --steps 2,10 --seconds 1 --rounds 1 --stores sqlite

``--processes`` processes each own ``--threads`` threads and run turns on them
round robin for ``--seconds``, all at once, on one store. A thread holds
``--turns-per-thread`` turns (a conversation), then the process goes on with a
new thread in its place: a turn loads its thread's state, and the figures must
not depend on how long the bench ran. Two sides, measured in
the same run and interleaved round by round (the order alternates):

* persistkit: one turn is ``with pk.resume(thread, run_id=<new id>):`` with the
  default lease (``busy="queue"``) and ``S`` checkpointed steps, each appending
  a 1 KB incompressible message (random base64) to ``run.state["messages"]``.
* the floor: the same processes, each step one autocommit ``INSERT`` of the same
  1 KB message into a plain table (SQLite: WAL, ``synchronous=NORMAL``, as the
  store uses it; PostgreSQL: one connection per process).

It prints steps/s of each (the median over ``--rounds``) and persistkit's cost
as a multiple of the floor (floor steps/s / persistkit steps/s; 1.00x = free).
Each worker also counts the store round trips of its turns (calls into the
backend), printed per turn: the fixed cost beside the one write per step.

PostgreSQL is used when reachable (``$PERSISTKIT_BENCH_POSTGRES`` overrides
``postgresql://127.0.0.1:5432/test``); every run uses a fresh schema, dropped after.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _env  # noqa: F401 -- first: a missing package says how to run this script

import persistkit as pk

HERE = Path(__file__).resolve()
POSTGRES = os.environ.get("PERSISTKIT_BENCH_POSTGRES", "postgresql://127.0.0.1:5432/test")
MESSAGE_BYTES = 1024


def message() -> str:
    """1 KB that no compressor shrinks: base64 of random bytes."""
    return base64.b64encode(os.urandom(MESSAGE_BYTES * 3 // 4)).decode()


@pk.checkpointed(name="bench.say")
def say(text: str) -> int:
    run = pk.current_run()
    assert run is not None
    messages = run.state.setdefault("messages", [])
    messages.append(text)
    return len(messages)


class Counting:
    """Counts the calls into a backend (each one round trip to the store; a call the
    backend makes to itself, like ``write_fenced`` to ``write``, is not counted again)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: dict[str, int] = {}
        self.depth = 0

    def wrap(self, store: pk.Store) -> None:
        for name in dir(type(self.inner)):
            fn = getattr(self.inner, name, None)
            if name.startswith("_") or not callable(fn) or name in ("from_url", "close", "lease_inner"):
                continue
            setattr(self.inner, name, self._counted(name, fn))

    def _counted(self, name: str, fn: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.depth == 0:
                self.calls[name] = self.calls.get(name, 0) + 1
            self.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1

        return counted


# -- one worker process ---------------------------------------------------------------------


def worker(
    side: str, url: str, floor_url: str, name: str, threads: int, per_thread: int, steps: int, seconds: float
) -> None:
    """Warms up, says so, reads the start time from stdin, runs turns (or the floor's
    inserts) from then for ``seconds``; prints what it did."""
    texts = [message() for _ in range(64)]
    counter = None
    if side == "persistkit":
        store = pk.connect(url)
        counter = Counting(store.backend)
        counter.wrap(store)
        do_turn = _pk_turn(store, steps, texts)
        close = store.close
    else:
        do_turn, close = _floor_turn(floor_url, steps, texts)
    do_turn(f"{name}-warmup")  # connections, schema, statement caches: outside the timed window
    if counter is not None:
        counter.calls.clear()
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    time.sleep(max(start - time.time(), 0.0))
    done = turns = 0
    end = start + seconds
    while time.time() < end:
        conversation, slot = divmod(turns, threads)
        do_turn(f"{name}-t{slot}-c{conversation // per_thread}")
        turns += 1
        done += steps
    elapsed = time.time() - start
    close()
    calls = counter.calls if counter is not None else {}
    print(json.dumps({"steps": done, "turns": turns, "elapsed": elapsed, "calls": calls}))


def _pk_turn(store: pk.Store, steps: int, texts: list[str]) -> Any:
    n = 0

    def turn(thread: str) -> None:
        nonlocal n
        with pk.resume(thread, store=store, run_id=uuid.uuid4().hex):
            for _ in range(steps):
                say(texts[n % len(texts)])
                n += 1

    return turn


def _floor_turn(url: str, steps: int, texts: list[str]) -> tuple[Any, Any]:
    n = 0
    if url.startswith("sqlite:"):
        conn: Any = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, timeout=60)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        sql = "INSERT INTO floor (thread_id, seq, data) VALUES (?, ?, ?)"
    else:
        import psycopg

        conn = psycopg.connect(url, autocommit=True)
        sql = "INSERT INTO floor (thread_id, seq, data) VALUES (%s, %s, %s)"

    def turn(thread: str) -> None:
        nonlocal n
        for _ in range(steps):
            conn.execute(sql, (thread, n, texts[n % len(texts)]))
            n += 1

    return turn, conn.close


# -- the driver ----------------------------------------------------------------------------------


def stores(names: list[str], tmp: Path) -> dict[str, tuple[str, str, Any]]:
    """name -> (persistkit URL, floor URL, cleanup)."""
    out: dict[str, tuple[str, str, Any]] = {}
    tag = uuid.uuid4().hex[:8]
    for name in names:
        if name == "sqlite":
            floor = tmp / f"floor-{tag}.db"
            with sqlite3.connect(floor) as conn:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("CREATE TABLE floor (id INTEGER PRIMARY KEY, thread_id TEXT, seq INTEGER, data TEXT)")
            out[name] = (f"sqlite:///{tmp}/turns-{tag}.db", f"sqlite:///{floor}", lambda: None)
        elif name == "postgres":
            schema = f"pkbench_turns_{tag}"
            try:
                import psycopg

                with psycopg.connect(POSTGRES, autocommit=True) as conn:
                    conn.execute(f"CREATE SCHEMA {schema}")
                    conn.execute(
                        f"CREATE TABLE {schema}.floor (id bigserial PRIMARY KEY, thread_id text, seq bigint, data text)"
                    )
            except Exception as exc:  # say why, and go on with the other stores
                print(f"  skipped postgres ({POSTGRES}): {exc}")
                continue
            floor = f"{POSTGRES}{'&' if '?' in POSTGRES else '?'}options=-csearch_path%3D{schema}"

            def drop(schema: str = schema) -> None:
                with psycopg.connect(POSTGRES, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA {schema} CASCADE")

            out[name] = (f"{POSTGRES}?schema={schema}", floor, drop)
    return out


def measure(
    side: str, url: str, floor: str, processes: int, threads: int, per_thread: int, steps: int, seconds: float
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE), "--worker", side, url, floor, f"{side[0]}{tag}p{i}", str(threads), str(per_thread), str(steps),
             repr(seconds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        for i in range(processes)
    ]
    for p in procs:  # every worker imported, connected and warmed up
        assert p.stdout is not None
        if p.stdout.readline().strip() != "ready":
            raise SystemExit(f"a {side} worker failed before it was ready (exit code {p.wait()})")
    start = repr(time.time() + 0.2)
    outs = [p.communicate(start + "\n")[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a {side} worker failed (exit codes {[p.returncode for p in procs]})")
    got = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    late = [g for g in got if g["elapsed"] > seconds * 1.5 + 0.5]
    if late:
        print(f"   (note: {len(late)} worker(s) overran the window: the machine is loaded)")
    calls: dict[str, int] = {}
    for g in got:
        for k, v in g["calls"].items():
            calls[k] = calls.get(k, 0) + v
    return {
        "rate": sum(g["steps"] for g in got) / max(g["elapsed"] for g in got),
        "turns": sum(g["turns"] for g in got),
        "calls": calls,
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        side, url, floor, name, threads, per_thread, steps, seconds = sys.argv[2:10]
        worker(side, url, floor, name, int(threads), int(per_thread), int(steps), float(seconds))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--threads", type=int, default=4, help="threads per process, turns run on them round robin")
    ap.add_argument("--turns-per-thread", type=int, default=10, help="turns of one thread before a new one")
    ap.add_argument("--steps", default="2,10,50", help="steps per turn, comma-separated")
    ap.add_argument("--seconds", type=float, default=6.0, help="length of each measurement")
    ap.add_argument("--rounds", type=int, default=2, help="measurements per side; the median is printed")
    ap.add_argument("--stores", default="sqlite,postgres")
    args = ap.parse_args()
    steps_list = [int(s) for s in args.steps.split(",")]
    print(
        f"turns: {args.processes} processes x {args.threads} threads ({args.turns_per_thread} turns a thread), "
        f"{args.seconds:g} s a measurement, "
        f"median of {args.rounds} interleaved rounds; 1 KB incompressible message per step"
    )
    print(f"   {'store':<9} {'steps/turn':>10} {'floor st/s':>11} {'persistkit':>11} {'ratio':>7}  round trips a turn")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (url, floor, cleanup) in stores(args.stores.split(","), Path(tmp)).items():
            try:
                for steps in steps_list:
                    got: dict[str, list[dict[str, Any]]] = {"floor": [], "persistkit": []}
                    for r in range(args.rounds):
                        for side in ("floor", "persistkit") if r % 2 == 0 else ("persistkit", "floor"):
                            got[side].append(
                                measure(
                                    side, url, floor, args.processes, args.threads, args.turns_per_thread, steps,
                                    args.seconds,
                                )
                            )
                    f = statistics.median(g["rate"] for g in got["floor"])
                    p = statistics.median(g["rate"] for g in got["persistkit"])
                    ratios = [a["rate"] / b["rate"] for a, b in zip(got["floor"], got["persistkit"], strict=True)]
                    last = got["persistkit"][-1]
                    per_turn = {k: v / max(last["turns"], 1) for k, v in sorted(last["calls"].items())}
                    fixed = sum(per_turn.values()) - steps
                    trips = f"{sum(per_turn.values()):.1f} ({fixed:.1f} + {steps} step writes): " + ", ".join(
                        f"{k} {v:.2f}" for k, v in per_turn.items()
                    )
                    print(
                        f"   {name:<9} {steps:>10} {f:>11,.0f} {p:>11,.0f} {f / p:>6.2f}x  {trips}"
                    )
                    if args.rounds > 1:
                        print(f"   {'':<9} {'':>10} {'':>11} {'':>11} rounds: " + ", ".join(f"{x:.2f}x" for x in ratios))
            finally:
                cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
