"""Long runs: peak memory of a run of many steps, and what loading its thread costs.

    python3 dev.py bench long_run [--steps 50000] [--stores sqlite,postgres]
    .venv/bin/python bench/bench_long_run.py [same options]   (a venv with pip install -e '.[bench]')
    quick check:  bench/bench_long_run.py --steps 2000 --stores sqlite

The workload (issue 23): one run of ``--steps`` checkpointed steps, each appending two
1 KB incompressible strings (random base64) to ``run.state["messages"]``: a 100 MB list
at 50,000 steps. Every figure is measured in a fresh process (peak RSS is the child's
``resource.getrusage(RUSAGE_SELF).ru_maxrss``; the interpreter, persistkit and the
driver are imported before the clock starts, on both sides). Side by side, in the
same run:

* ``plain list``: the same strings appended to a plain Python list (the state's own
  size in memory; the state size below is its content, steps x 2 x 1 KB).
* ``live run``: the run itself, on the store: its peak RSS ÷ the state size
  (target < 2x) and ÷ the plain list.
* ``raw read``: the same strings read from one table of the same database
  (``SELECT data FROM t ORDER BY id`` into a list): the floor of loading the thread.
* ``get_state``: ``store.get_state(thread)`` of the long thread.
* ``resume + 1``: ``with pk.resume(thread):`` and one more step (the run completed:
  a new run starts from the head's state). Targets: <= 3x the time and <= 1.5x the
  peak memory of the raw read.

PostgreSQL is used when reachable (``$PERSISTKIT_BENCH_POSTGRES`` overrides
``postgresql://127.0.0.1:5432/test``); every run uses a fresh schema, dropped after.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import resource
import sqlite3
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
ITEM_BYTES = 1024
PER_STEP = 2
THREAD = "long-run"
ROUNDS = 3  # reads measured this many times each (fresh processes), the median shown


def item() -> str:
    """1 KB that no compressor shrinks: base64 of random bytes."""
    return base64.b64encode(os.urandom(ITEM_BYTES * 3 // 4)).decode()


def peak_mb() -> float:
    """This process's peak resident set size so far, in MB (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pk.checkpointed(name="bench.say")
def say(a: str, b: str) -> int:
    run = pk.current_run()
    assert run is not None
    messages = run.state.setdefault("messages", [])
    messages.append(a)
    messages.append(b)
    return len(messages)


# -- one measurement, in a child process ----------------------------------------------------


def child(kind: str, url: str, raw: str, steps: int) -> dict[str, Any]:
    """Runs one measurement and returns its seconds and peak RSS (MB)."""
    if kind == "plain":
        start = time.perf_counter()
        out: list[str] = []
        for _ in range(steps):
            out.append(item())
            out.append(item())
        return {"s": time.perf_counter() - start, "mb": peak_mb(), "n": len(out)}
    if kind == "fill":  # the raw table: not measured
        conn, sql = _raw_conn(raw)
        rows = [(item(),) for _ in range(steps * PER_STEP)]
        if raw.startswith("sqlite"):
            conn.executemany("INSERT INTO t (data) VALUES (?)", rows)
            conn.commit()
        else:
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO t (data) VALUES (%s)", rows)
        conn.close()
        return {"s": 0.0, "mb": peak_mb(), "n": len(rows)}
    if kind == "raw":
        start = time.perf_counter()
        conn, sql = _raw_conn(raw)
        got = [r[0] for r in conn.execute(sql)]
        conn.close()
        return {"s": time.perf_counter() - start, "mb": peak_mb(), "n": len(got)}
    start = time.perf_counter()
    store = pk.connect(url)
    if kind == "run":
        with pk.resume(THREAD, store=store) as run:
            for _ in range(steps):
                say(item(), item())
            n = len(run.state["messages"])
    elif kind == "get_state":
        n = len(store.get_state(THREAD)["messages"])
    elif kind == "size":  # what the thread takes in the store: rows and blobs (a dry-run prune counts them)
        report = store.prune(pk.Retention(keep_last=1), thread_id=THREAD, dry_run=True, progress=False)
        n = report.bytes_before
    elif kind == "resume":
        with pk.resume(THREAD, store=store) as run:
            say(item(), item())
            n = len(run.state["messages"])
    else:
        raise SystemExit(f"unknown measurement {kind!r}")
    store.close()
    return {"s": time.perf_counter() - start, "mb": peak_mb(), "n": n}


def _raw_conn(raw: str) -> tuple[Any, str]:
    if raw.startswith("sqlite:"):
        conn: Any = sqlite3.connect(raw.removeprefix("sqlite:///"))
        conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, data TEXT)")
        return conn, "SELECT data FROM t ORDER BY id"
    import psycopg

    conn = psycopg.connect(raw, autocommit=True)
    conn.execute("CREATE TABLE IF NOT EXISTS t (id bigserial PRIMARY KEY, data text)")
    return conn, "SELECT data FROM t ORDER BY id"


def median(runs: Any) -> dict[str, Any]:
    """The run of median time (its memory with it): the machine may be busy in one of them."""
    ordered = sorted(runs, key=lambda r: r["s"])
    return dict(ordered[len(ordered) // 2])


def measure(kind: str, url: str, raw: str, steps: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(HERE), "--child", kind, url, raw, str(steps)],
        capture_output=True, text=True, check=False,
    )
    if out.returncode:
        raise SystemExit(f"measurement {kind} on {url} failed:\n{out.stderr}")
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


# -- the driver ----------------------------------------------------------------------------------


def stores(names: list[str], tmp: Path) -> dict[str, tuple[str, str, Any]]:
    """name -> (persistkit URL, raw-table URL, cleanup)."""
    out: dict[str, tuple[str, str, Any]] = {}
    tag = uuid.uuid4().hex[:8]
    for name in names:
        if name == "sqlite":
            out[name] = (f"sqlite:///{tmp}/long-{tag}.db", f"sqlite:///{tmp}/raw-{tag}.db", lambda: None)
        elif name == "postgres":
            schema = f"pkbench_long_{tag}"
            try:
                import psycopg

                with psycopg.connect(POSTGRES, autocommit=True) as conn:
                    conn.execute(f"CREATE SCHEMA {schema}")
            except Exception as exc:  # say why, and go on with the other stores
                print(f"  skipped postgres ({POSTGRES}): {exc}")
                continue
            raw = f"{POSTGRES}{'&' if '?' in POSTGRES else '?'}options=-csearch_path%3D{schema}"

            def drop(schema: str = schema) -> None:
                with psycopg.connect(POSTGRES, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA {schema} CASCADE")

            out[name] = (f"{POSTGRES}?schema={schema}", raw, drop)
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, url, raw, steps = sys.argv[2:6]
        print(json.dumps(child(kind, url, raw, int(steps))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--stores", default="sqlite,postgres")
    args = ap.parse_args()
    steps = args.steps
    state_mb = steps * PER_STEP * ITEM_BYTES / 1e6
    print(
        f"long run: {steps:,} steps x {PER_STEP} x {ITEM_BYTES} B incompressible strings = "
        f"{steps * PER_STEP:,} items, state size {state_mb:.1f} MB; each figure a fresh process"
    )
    plain = measure("plain", "", "", steps)
    print(f"   {'plain list':<24} {plain['s']:>7.2f} s {plain['mb']:>7.0f} MB  ({plain['mb'] / state_mb:.2f}x state)")
    print(f"   {'store':<9} {'measurement':<14} {'time':>9} {'peak RSS':>10}  ratios")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for name, (url, raw, cleanup) in stores(args.stores.split(","), Path(tmp)).items():
            try:
                run = measure("run", url, raw, steps)
                ok = run["mb"] < 2 * state_mb
                failed |= not ok
                print(
                    f"   {name:<9} {'live run':<14} {run['s']:>7.2f} s {run['mb']:>7.0f} MB  "
                    f"{run['mb'] / state_mb:.2f}x state (target < 2x: {'ok' if ok else 'MISSED'}), "
                    f"{run['mb'] / plain['mb']:.2f}x plain list"
                )
                stored = measure("size", url, raw, steps)["n"] / 1e6
                print(
                    f"   {name:<9} {'stored':<14} {stored:>9.1f} MB {'':>10}  {stored / state_mb:.2f}x state "
                    "(rows, and spans of the rows' items)"
                )
                measure("fill", url, raw, steps)
                floor = median(measure("raw", url, raw, steps) for _ in range(ROUNDS))
                print(f"   {name:<9} {'raw read':<14} {floor['s']:>7.2f} s {floor['mb']:>7.0f} MB  floor")
                for kind, label in (("get_state", "get_state"), ("resume", "resume + 1")):
                    got = median(measure(kind, url, raw, steps) for _ in range(ROUNDS))
                    t, m = got["s"] / floor["s"], got["mb"] / floor["mb"]
                    verdict = "ok" if t <= 3 and m <= 1.5 else "MISSED"
                    if kind == "resume":
                        failed |= verdict != "ok"
                    print(
                        f"   {name:<9} {label:<14} {got['s']:>7.2f} s {got['mb']:>7.0f} MB  "
                        f"{t:.2f}x time, {m:.2f}x memory of the raw read (target <= 3x, <= 1.5x: {verdict})"
                    )
            finally:
                cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
