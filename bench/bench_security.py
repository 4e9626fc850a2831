"""The per-step cost of encryption at rest on SQLite, against plain persistkit in the same run.

    python bench/bench_security.py

Workload (the one of ``bench/bench_sqlite.py``): an agent of 200 steps, each
appending a ~1 KB message to a ``pk.append`` channel, on a fresh SQLite file
(WAL, synchronous=NORMAL). Prints the median per-step time of ROUNDS rounds for
plain and encrypted (AES-256-GCM, ``encryption=``) stores, their ratio, and the
time to rotate the encrypted thread to a new key.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sqlite import STEPS, Chat, append_step, file_bytes, messages

import persistkit as pk

ROUNDS = 5
KEY_A = bytes(range(32))
KEY_B = bytes(range(32, 64))


def one_round(tmp: Path, name: str, encryption: object) -> tuple[float, int]:
    path = tmp / f"{name}.db"
    store = pk.connect(f"sqlite:///{path}", encryption=encryption)
    msgs = messages(STEPS)
    t0 = time.perf_counter()
    with pk.resume("t", store=store, state=Chat):
        for m in msgs:
            append_step(m)
    per_step = (time.perf_counter() - t0) / STEPS
    store.close()
    return per_step, file_bytes(path)


def main() -> None:
    plain: list[float] = []
    sealed: list[float] = []
    rotate: list[float] = []
    sizes = (0, 0)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for r in range(ROUNDS):  # interleaved, so drift hits both alike
            p, p_bytes = one_round(tmp, f"plain{r}", None)
            e, e_bytes = one_round(tmp, f"enc{r}", {"a": KEY_A})
            plain.append(p)
            sealed.append(e)
            sizes = (p_bytes, e_bytes)
            with pk.connect(f"sqlite:///{tmp}/enc{r}.db", encryption={"a": KEY_A, "b": KEY_B}) as s:
                t0 = time.perf_counter()
                report = s.rotate_keys("t")
                rotate.append(time.perf_counter() - t0)
    p, e = statistics.median(plain), statistics.median(sealed)
    print(f"workload: {STEPS} steps x 1 KB append on SQLite (WAL, NORMAL), median of {ROUNDS} rounds")
    print(f"plain      {p * 1e6:8.1f} us/step   {sizes[0]:>9,} bytes on disk")
    print(f"encrypted  {e * 1e6:8.1f} us/step   {sizes[1]:>9,} bytes on disk")
    print(f"ratio      {e / p:8.2f} x   (+{(e - p) * 1e6:.1f} us/step)")
    print(
        f"rotate     {statistics.median(rotate) * 1e3:8.1f} ms for the thread "
        f"({report.rows_resealed} rows, {report.blobs_resealed} blobs)"
    )


if __name__ == "__main__":
    main()
