"""Cost of secret redaction per step, against the same work with redaction off, in one run.

    python3 dev.py bench redact
    .venv/bin/python bench/bench_redact.py   (a venv with pip install -e '.[bench]')

(a) ``Codec.dump_tree`` of a checkpoint-like body holding a 1 KB message:
    redaction off, on with nothing to find (the common case), on with a key in it.
(b) a 200-step agent on SQLite appending a 1 KB message per step (the
    bench_sqlite workload), with ``connect(redact=False)`` and the default.
(c) the scan's cost in µs per KB of stored text (``Codec.dump_tree`` of a
    state value, redaction on minus off) for mixed-case English, base64 and
    random printable text, 64 KB and 1 MB, changed (new bytes every call) and
    unchanged (the same bytes again: a state channel re-serialized at every step).
(d) a 1 MB base64 string in state, per step, redaction off and on.
(e) the high-entropy rule (recorded errors and metadata): false-positive rate
    on a corpus of ordinary strings and recall on generated secrets
    (``bench/redact_corpus.py``), per kind.
"""

from __future__ import annotations

import base64
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _env  # noqa: F401 -- first: a missing package says how to run this script
import redact_corpus
from bench_sqlite import messages

import persistkit as pk
from persistkit.codec._pipeline import Codec
from persistkit.secrets._entropy import random_spans
from persistkit.secrets._redact import Redactor

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


def texts(size: int, rng: random.Random) -> dict[str, str]:
    words = ["The", "agent", "Reads", "a", "Message", "from", "the", "User", "and", "Calls", "a", "Tool", "with", "it,", "then", "Writes"]
    english = " ".join(rng.choice(words) + rng.choice(["", ",", "."]) for _ in range(size // 5))[:size]
    return {
        "english": english,
        "base64": base64.b64encode(rng.randbytes(size * 3 // 4)).decode()[:size],
        "random": "".join(chr(rng.randrange(33, 127)) for _ in range(size)),
    }


_serial = iter(range(10**9))


def timed(codec: Codec, text: str, n: int, same: bool = False) -> float:
    """Seconds per ``dump_tree`` of ``text`` (best of 3 batches of ``n``); unless ``same``,
    each call gets new bytes (a new prefix), so the scan cache never answers."""
    best = float("inf")
    for _ in range(3):
        batch = [text] * n if same else [f"{next(_serial):09d}" + text[9:] for _ in range(n)]
        t = time.perf_counter()
        for v in batch:
            codec.dump_tree(v)
        best = min(best, (time.perf_counter() - t) / n)
    return best


def scan_cost() -> None:
    rng = random.Random(1)
    off, on = Codec(redactor=Redactor(enabled=False)), Codec()
    print("scan cost, us per KB (dump_tree with redaction on minus off):")
    for size in (64 * 1024, 1024 * 1024):
        n = 40 if size < 1 << 20 else 6
        for label, text in texts(size, rng).items():
            base = timed(off, text, n)
            changed = timed(on, text, n) - base
            on.dump_tree(text)
            unchanged = timed(on, text, n, same=True) - timed(off, text, n, same=True)
            kb = size / 1024
            print(f"  {label:8s} {kb:6.0f} KB: changed {changed / kb * 1e6:7.2f} us/KB, "
                  f"unchanged {unchanged / kb * 1e6:7.2f} us/KB (JSON dump alone {base / kb * 1e6:.2f} us/KB)")


def big_state_step() -> None:
    big = base64.b64encode(random.Random(2).randbytes(768 * 1024)).decode()
    with tempfile.TemporaryDirectory() as tmp:
        for label, redact in (("off", False), ("on", None)):
            store = pk.connect(f"sqlite:///{tmp}/{label}.db", redact=redact)

            @pk.checkpointed
            def step(i: int) -> int:
                return i

            with pk.resume("big", store=store) as run:
                run.state["doc"] = big
                step(-1)
                t = time.perf_counter()
                for i in range(20):
                    step(i)
                per = (time.perf_counter() - t) / 20
            store.close()
            print(f"1 MB base64 string in state, redaction {label}: {per * 1e3:.2f} ms per step")


def entropy_rule() -> None:
    clean = redact_corpus.clean()
    total = flagged = 0
    print("high-entropy rule (errors, metadata): false positives on ordinary strings")
    for kind, values in clean.items():
        hits = sum(1 for v in values if random_spans(v))
        total += len(values)
        flagged += hits
        print(f"  {kind:16s} {hits:4d} / {len(values)}")
    print(f"  false-positive rate: {flagged / total:.4f} ({flagged} of {total})")
    rng = random.Random(3)
    print("recall on generated secrets, each inside an error-like sentence")
    found = count = 0
    for kind, values in redact_corpus.secrets().items():
        hits = sum(1 for v in values if random_spans(redact_corpus.in_sentence(rng, v)))
        print(f"  {kind:24s} {hits / len(values):.3f}")
        if not kind.startswith("hex"):
            found, count = found + hits, count + len(values)
    print(f"  recall (every format but hex, which is left to patterns): {found / count:.4f}")


if __name__ == "__main__":
    main()
    scan_cost()
    big_state_step()
    entropy_rule()
