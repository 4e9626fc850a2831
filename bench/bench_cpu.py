"""CPU instructions per step: persistkit on SQLite against the raw sqlite3 floor, without the noise.

    python bench/bench_cpu.py            (needs valgrind; says so and exits 0 without it)

Wall-clock ratios on a shared VM drift by ±30% from one minute to the next;
instruction counts do not. This runs bench_sqlite.py's workload (200 steps,
each appending a 1 KB message) under ``valgrind --tool=cachegrind`` twice per
side — one round and four rounds — and divides the difference by 600 steps,
so start-up and imports cancel out. User-space instructions only: the kernel's
share (the WAL writes: ~2.3 pages per commit for the floor, ~3.4 for
persistkit) is not in these figures, which is why the wall-clock ratio of
bench_sqlite.py runs higher than this one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = 200


def child(mode: str, rounds: int) -> None:
    sys.path.insert(0, str(HERE))
    # bench_sqlite's own two sides, so both pay the same per-round extras (a file
    # and its WAL checkpoint for the byte count) and measure the same work.
    from bench_sqlite import bench_persistkit, bench_raw, messages

    msgs = messages(STEPS)
    d = Path(tempfile.mkdtemp())
    try:
        for r in range(rounds):
            if mode == "floor":
                bench_raw(d / f"raw{r}", msgs)
            else:
                bench_persistkit(d, msgs, f"pk{r}")[2].close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def instructions(mode: str, rounds: int) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, __file__, "--child", mode, str(rounds)],
        capture_output=True, text=True, env=env, check=True,
    )
    found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def main() -> int:
    if shutil.which("valgrind") is None:
        print("bench_cpu.py: valgrind is not installed; skipped (apt install valgrind)")
        return 0
    per_step = {}
    for mode in ("floor", "persistkit"):
        per_step[mode] = (instructions(mode, 4) - instructions(mode, 1)) / (3 * STEPS)
    floor, ours = per_step["floor"], per_step["persistkit"]
    print(f"{STEPS} steps x 1 KB appended, user-space instructions per step (valgrind, PYTHONHASHSEED=0)\n")
    print(f"{'(a) raw sqlite3 INSERT+COMMIT':<34}{floor:>12,.0f}{1.0:>9.2f}x")
    print(f"{'(b) persistkit, SQLite':<34}{ours:>12,.0f}{ours / floor:>9.2f}x")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
