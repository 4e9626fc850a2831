"""The per-step cost of each security layer on SQLite, against plain persistkit in the same run.

    python3 dev.py bench security
    .venv/bin/python bench/bench_security.py   (a venv with pip install -e '.[bench]')

Workload (the one of ``bench/bench_sqlite.py``): an agent of 200 steps, each
appending a ~1 KB message to a ``pk.append`` channel, on a fresh SQLite file
(WAL, synchronous=NORMAL). Modes, interleaved round by round:

* no redaction (``redact=False``) — the floor of this table;
* default — secret redaction on (what every user gets);
* + encryption (AES-256-GCM, ``encryption=``);
* + integrity (keyed hash chain, ``integrity=``);
* + encryption + integrity + a file witness — everything on.

Prints the median per-step time of ROUNDS rounds, the ratio to the default,
bytes on disk, the time of a fresh store's ``get_state`` of the thread, and the
time to rotate the encrypted thread to a new key.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _env  # noqa: F401 -- first: a missing package says how to run this script
from bench_sqlite import STEPS, Chat, append_step, file_bytes, messages

import persistkit as pk

ROUNDS = 5
KEY_A = bytes(range(32))
KEY_B = bytes(range(32, 64))
MAC = bytes(range(64, 96))


def modes(tmp: Path, r: int) -> dict[str, dict[str, Any]]:
    return {
        "no redaction": {"redact": False},
        "default (redaction on)": {},
        "+ encryption": {"encryption": {"a": KEY_A}},
        "+ integrity": {"integrity": {"m": MAC}},
        "+ encryption + integrity + witness": {
            "encryption": {"a": KEY_A},
            "integrity": {"m": MAC},
            "witness": f"file:{tmp}/witness{r}.log",
        },
    }


def one_round(path: Path, options: dict[str, Any]) -> tuple[float, int, float]:
    store = pk.connect(f"sqlite:///{path}", **options)
    msgs = messages(STEPS)
    t0 = time.perf_counter()
    with pk.resume("t", store=store, state=Chat):
        for m in msgs:
            append_step(m)
    per_step = (time.perf_counter() - t0) / STEPS
    store.close()
    with pk.connect(f"sqlite:///{path}", **options) as fresh:
        t0 = time.perf_counter()
        fresh.get_state("t", state=Chat)
        read = time.perf_counter() - t0
    return per_step, file_bytes(path), read


def main() -> None:
    steps: dict[str, list[float]] = {}
    reads: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}
    rotate: list[float] = []
    report = None
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for r in range(ROUNDS):  # interleaved, so drift hits every mode alike
            for i, (name, options) in enumerate(modes(tmp, r).items()):
                path = tmp / f"m{i}-r{r}.db"
                s, size, read = one_round(path, options)
                steps.setdefault(name, []).append(s)
                reads.setdefault(name, []).append(read)
                sizes[name] = size
            with pk.connect(f"sqlite:///{tmp}/m2-r{r}.db", encryption={"a": KEY_A, "b": KEY_B}) as s:
                t0 = time.perf_counter()
                report = s.rotate_keys("t")
                rotate.append(time.perf_counter() - t0)
    base = statistics.median(steps["default (redaction on)"])
    print(f"workload: {STEPS} steps x 1 KB append on SQLite (WAL, NORMAL), median of {ROUNDS} interleaved rounds\n")
    print(f"{'mode':38} {'per step':>10} {'vs default':>11} {'bytes on disk':>14} {'get_state':>10}")
    for name in steps:
        m = statistics.median(steps[name])
        print(
            f"{name:38} {m * 1e6:8.1f}µs {m / base:10.2f}x {sizes[name]:>14,} "
            f"{statistics.median(reads[name]) * 1e3:8.1f}ms"
        )
    assert report is not None
    print(
        f"\nrotate-keys of the encrypted thread: {statistics.median(rotate) * 1e3:.1f} ms "
        f"({report.rows_resealed} rows, {report.blobs_resealed} blobs resealed)"
    )


if __name__ == "__main__":
    main()
