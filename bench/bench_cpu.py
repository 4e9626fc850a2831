"""CPU instructions per step: persistkit on SQLite against the raw sqlite3 floor, without the noise.

    python3 dev.py bench cpu          (needs valgrind; says so and exits 0 without it)
    .venv/bin/python bench/bench_cpu.py   (a venv with pip install -e '.[bench]')

Wall-clock ratios on a shared VM drift by ±30% from one minute to the next;
instruction counts do not. This runs bench_sqlite.py's workload (200 steps,
each appending a 1 KB message) under ``valgrind --tool=cachegrind`` twice per
side — one round and four rounds — and divides the difference by 600 steps,
so start-up and imports cancel out. User-space instructions only: the kernel's
share (the WAL writes: ~2.3 pages per commit for the floor, ~3.4 for
persistkit) is not in these figures, which is why the wall-clock ratio of
bench_sqlite.py runs higher than this one.

Then the second workload of bench_sqlite.py (the step returns the message and
the caller appends it), base64 and mixed-case English, with the loop written
in a script and in a function of an imported module (``_loops.py``): the
instructions a step costs must not depend on how the loop is written. Each
text kind has its own floor (a bare INSERT+COMMIT of its messages); ``÷ floor``
is the slower loop form against it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import _env  # noqa: F401 -- first: a missing package says how to run this script

HERE = Path(__file__).resolve().parent
STEPS = 200


def child(mode: str, rounds: int) -> None:
    sys.path.insert(0, str(HERE))
    # bench_sqlite's own two sides, so both pay the same per-round extras (a file
    # and its WAL checkpoint for the byte count) and measure the same work.
    import _loops
    from bench_sqlite import base64_texts, bench_persistkit, bench_raw, english_texts, messages

    import persistkit as pk

    msgs = messages(STEPS)
    d = Path(tempfile.mkdtemp())
    form, _, text = mode.partition(":")
    if text:
        _loops.TEXTS[:] = base64_texts(STEPS) if text == "base64" else english_texts(STEPS)
        loop = _loops.Script() if form == "script" else _loops.in_function
    try:
        for r in range(rounds):
            if form == "floor":  # the floor of a workload: a bare INSERT+COMMIT of each message
                bench_raw(d / f"raw{r}", _loops.TEXTS if text else msgs)
            elif text:
                store = pk.connect(f"sqlite:///{d}/{form}{r}.db")
                loop(store, "t")
                store.close()
            else:
                bench_persistkit(d, msgs, f"pk{r}")[2].close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _child_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached by the warm-up, read by the counted runs
    return env


def warm(mode: str) -> None:
    """Run ``mode`` once outside valgrind: a module compiled during a counted run adds ~10^9
    instructions to that run alone (the first count of a fresh checkout came out 15x the floor)."""
    subprocess.run([sys.executable, __file__, "--child", mode, "1"], env=_child_env(), check=True)


def instructions(mode: str, rounds: int) -> int:
    env = _child_env()
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
    for mode in ("floor", "persistkit", "script:base64", "module:english"):
        warm(mode)
    for mode in ("floor", "persistkit"):
        per_step[mode] = (instructions(mode, 4) - instructions(mode, 1)) / (3 * STEPS)
    floor, ours = per_step["floor"], per_step["persistkit"]
    print(f"{STEPS} steps x 1 KB appended, user-space instructions per step (valgrind, PYTHONHASHSEED=0)\n")
    print(f"{'(a) raw sqlite3 INSERT+COMMIT':<34}{floor:>12,.0f}{1.0:>9.2f}x")
    print(f"{'(b) persistkit, SQLite':<34}{ours:>12,.0f}{ours / floor:>9.2f}x")
    print("\nthe step returns the message and the caller appends it: instructions per step")
    print(f"{'':<26}{'floor':>10}{'loop in script':>16}{'in module fn':>14}{'module÷script':>15}{'÷ floor':>9}")
    for text, label in (("base64", "base64 (incompressible)"), ("english", "English, mixed case")):
        forms = {f: (instructions(f"{f}:{text}", 4) - instructions(f"{f}:{text}", 1)) / (3 * STEPS)
                 for f in ("floor", "script", "module")}
        worst = max(forms["script"], forms["module"]) / forms["floor"]
        print(f"{label:<26}{forms['floor']:>10,.0f}{forms['script']:>16,.0f}{forms['module']:>14,.0f}"
              f"{forms['module'] / forms['script']:>14.3f}x{worst:>8.2f}x")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
