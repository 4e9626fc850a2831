"""Cost of secret redaction per step, against the same work with redaction off, in one run.

    python bench/bench_redact.py

(a) ``Codec.dump_tree`` of a checkpoint-like body holding a 1 KB message:
    redaction off, on with nothing to find (the common case), on with a key in it.
(b) a 200-step agent on SQLite appending a 1 KB message per step (the
    bench_sqlite workload), with ``connect(redact=False)`` and the default.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sqlite import messages

import persistkit as pk
from persistkit._codec import Codec
from persistkit._secrets import Redactor

STEPS = 200


def per_call(fn, n: int = 20000) -> float:
    best = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best.append((time.perf_counter() - t) / n)
    return min(best) * 1e6


def agent_us(url: str, redact: bool | None, msgs: list[dict[str, str]]) -> float:
    store = pk.connect(url, redact=redact)

    @pk.checkpointed
    def step(i: int) -> int:
        return i

    t = time.perf_counter()
    with pk.resume("bench", store=store) as run:
        run.state["messages"] = []
        for i, m in enumerate(msgs):
            run.state["messages"].append(m)
            step(i)
    elapsed = time.perf_counter() - t
    store.close()
    return elapsed / len(msgs) * 1e6


def main() -> None:
    msg = messages(1)[0]
    body = {"k": "step", "p": "3", "n": "step", "s": "completed", "r": 3, "sg": {"messages": {"p": None, "s": 0, "i": [msg]}}}
    with_key = {**body, "r": "used sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7"}
    off, on = Codec(redactor=Redactor(enabled=False)), Codec()
    base = per_call(lambda: off.dump_tree(body))
    clean = per_call(lambda: on.dump_tree(body))
    hit = per_call(lambda: on.dump_tree(with_key), 5000)
    print(f"dump_tree of a 1 KB step body: off {base:.2f} us, on/no secret {clean:.2f} us "
          f"(+{clean - base:.2f} us), on/with a key {hit:.2f} us (+{hit - base:.2f} us)")

    msgs = messages(STEPS)
    runs: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(3):
            for label, redact in (("off", False), ("on", None)):
                runs[label].append(agent_us(f"sqlite:///{tmp}/{label}{r}.db", redact, msgs))
    off_us, on_us = statistics.median(runs["off"]), statistics.median(runs["on"])
    print(f"{STEPS}-step x 1 KB agent on SQLite: redaction off {off_us:.1f} us/step, "
          f"on {on_us:.1f} us/step (ratio {on_us / off_us:.3f})")


if __name__ == "__main__":
    main()
