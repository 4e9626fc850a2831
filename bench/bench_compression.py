"""Where compression pays: zstd level 1 on the records agents write, by kind and size.

    python3 dev.py bench compression
    .venv/bin/python bench/bench_compression.py   (a venv with pip install -e '.[bench]')

A record is sealed compressed when it is at least ``compress_threshold`` bytes
(``pk.connect(compress_threshold=)``) and compression makes it smaller. This prints,
for four kinds of payload sealed as a step's record would be (a chat message, a tool
result, JSON state and incompressible base64), at sizes from 128 bytes to 16 KB:
the compressed size ÷ the raw size, and the CPU time to compress and to decompress
one record (microseconds; the best of 5 rounds of 300 records, each compressed once
between others, as in the step loop). Then, for a few thresholds, a 200-step agent on
SQLite whose messages are 1 KB and 2 KB: bytes on disk ÷ content and time per step
(median of 5 interleaved rounds; wall clock, so noisy: compare within one run).
No randomness: every payload is built from fixed word lists.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import _env  # noqa: F401 -- first: a missing package says how to run this script

import persistkit as pk

SIZES = (128, 256, 512, 1024, 2048, 4096, 16384)
NAMES = ["Alice", "Jordan", "Yasmin", "Zoe", "Kai", "Berlin", "Zurich", "Amazon", "GitHub", "Monday"]
VERBS = ["checked", "found", "sent", "asked for", "updated", "summarized", "booked", "rejected"]
NOUNS = ["the invoice", "a flight", "the database", "three reports", "the meeting notes", "a refund"]
TAILS = [".", "!", "?", ", then waited.", " before lunch.", " at 10:42.", " for 1,250 EUR."]


def _pick(seq: list[str], i: int) -> str:
    return seq[(i * 2654435761 >> 7) % len(seq)]


def chat(size: int, i: int = 0) -> dict[str, Any]:
    """A chat message of about ``size`` bytes of English."""
    text, j = "", i
    while len(text) < size:
        text += f"{_pick(NAMES, j)} {_pick(VERBS, j + 1)} {_pick(NOUNS, j + 2)}{_pick(TAILS, j + 3)} "
        j += 4
    return {"role": "assistant", "content": text[:size]}


def tool_result(size: int, i: int = 0) -> dict[str, Any]:
    """A search tool's JSON result of about ``size`` bytes: titles, URLs, snippets, scores."""
    hits: list[dict[str, Any]] = []
    j = i
    while len(json.dumps(hits)) < size:
        hits.append({"title": f"{_pick(NAMES, j)} {_pick(NOUNS, j + 1)}", "url": f"https://example.com/doc/{j * 7919 % 100000}",
                     "snippet": f"{_pick(NAMES, j + 2)} {_pick(VERBS, j + 3)} {_pick(NOUNS, j + 4)}{_pick(TAILS, j + 5)}",
                     "score": round((j * 37 % 100) / 100, 2)})
        j += 6
    return {"tool": "search", "ok": True, "hits": hits}


def json_state(size: int, i: int = 0) -> dict[str, Any]:
    """An agent's working state of about ``size`` bytes: a plan, counters, ids, flags."""
    state: dict[str, Any] = {"goal": "book a flight to Zurich under 400 EUR", "step": i, "todo": [], "seen": {}}
    j = i
    while len(json.dumps(state)) < size:
        state["todo"].append({"id": hashlib.blake2b(str(j).encode(), digest_size=6).hexdigest(),
                              "what": f"{_pick(VERBS, j)} {_pick(NOUNS, j + 1)}", "done": j % 3 == 0})
        state["seen"][f"k{j}"] = j * 31 % 997
        j += 1
    return state


def incompressible(size: int, i: int = 0) -> dict[str, Any]:
    """Base64 of pseudo-random bytes (BLAKE2b in counter mode): images, embeddings, ciphertext."""
    raw = b"".join(hashlib.blake2b(f"{i}:{k}".encode()).digest() for k in range(size * 3 // 4 // 64 + 1))
    return {"role": "tool", "content": base64.b64encode(raw).decode()[:size]}


KINDS = {"chat message": chat, "tool result": tool_result, "JSON state": json_state, "base64": incompressible}


def record(payload: dict[str, Any], i: int) -> bytes:
    """A step record's JSON around ``payload``, as the engine writes it (keys and ids included)."""
    body = {"k": "step", "p": f"{i}", "n": "agent.step", "rs": "running", "s": "completed", "r": None,
            "sg": {"messages": {"p": f"{0x18c3a5f0000 + i:012x}{i:012x}", "s": i, "i": [payload]}},
            "sc": ["bench.Agent", 1], "t": 1765000000.0 + i,
            "ch": {"messages": {"l": f"{0x18c3a5f0000 + i:012x}{i:012x}", "n": i + 1, "g": 1}}, "a": "x:0123456789abcdef"}
    return json.dumps(body, separators=(",", ":")).encode()


def micro() -> None:
    from persistkit.codec._pipeline import Codec

    always = Codec(compress_threshold=1)
    print("zstd level 1 on a step's record, by payload kind and record size\n")
    print(f"{'kind':<14}{'size':>7}{'compressed÷raw':>16}{'compress µs':>13}{'decompress µs':>15}{'bytes saved/µs':>16}")
    for kind, make in KINDS.items():
        for size in SIZES:
            recs = [record(make(size, i), i) for i in range(300)]
            sealed = [always.seal(r) for r in recs]
            ratio = sum(len(s) - 1 for s in sealed) / sum(len(r) for r in recs)
            best_c = best_d = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for r in recs:
                    always.seal(r)
                best_c = min(best_c, (time.perf_counter() - t0) / len(recs))
                t0 = time.perf_counter()
                for s in sealed:
                    always.open(s)
                best_d = min(best_d, (time.perf_counter() - t0) / len(recs))
            raw_len = statistics.mean(len(r) for r in recs)
            saved = raw_len * max(0.0, 1 - ratio)
            print(f"{kind:<14}{raw_len:>7.0f}{ratio:>16.2f}{best_c * 1e6:>13.1f}{best_d * 1e6:>15.1f}"
                  f"{saved / (best_c * 1e6):>16.0f}")
        print()


class Agent(pk.State, name="bench.compression.Agent"):
    messages: Annotated[list[dict[str, Any]], pk.append] = []


@pk.checkpointed(name="step")
def step(msg: dict[str, Any]) -> None:
    run = pk.current_run()
    assert run is not None
    run.state.messages.append(msg)


def file_bytes(path: Path) -> int:
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


CASES = (("chat, 300 B", chat, 300), ("chat, 600 B", chat, 600), ("chat, 1 KB", chat, 1000),
         ("tool result, 600 B", tool_result, 600), ("tool result, 1 KB", tool_result, 1000),
         ("base64, 1 KB", incompressible, 1000))


def end_to_end(thresholds: tuple[int, ...]) -> None:
    print("200 steps on SQLite, each appending one message; median of 5 interleaved rounds (wall clock)\n")
    print(f"{'messages':<22}{'threshold':>10}{'µs/step':>10}{'bytes÷content':>15}")
    for label, make, size in CASES:
        msgs = [make(size, i) for i in range(200)]
        content = sum(len(json.dumps(m)) for m in msgs)
        times: dict[int, list[float]] = {t: [] for t in thresholds}
        sizes: dict[int, int] = {}
        with tempfile.TemporaryDirectory() as d:
            for r in range(5):
                for t in thresholds if r % 2 == 0 else reversed(thresholds):
                    path = Path(d) / f"{t}-{r}.db"
                    store = pk.connect(f"sqlite:///{path}", compress_threshold=t)
                    t0 = time.perf_counter()
                    with pk.resume("t", store=store, state=Agent, busy=None):
                        for m in msgs:
                            step(m)
                    times[t].append((time.perf_counter() - t0) / len(msgs))
                    store.close()
                    sizes[t] = file_bytes(path)
        for t in thresholds:
            print(f"{label:<22}{t:>10,}{statistics.median(times[t]) * 1e6:>10.0f}{sizes[t] / content:>15.2f}")
        print()


PG_URL = os.environ.get("PERSISTKIT_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test")


def pg_bytes(thresholds: tuple[int, ...]) -> None:
    """Bytes on PostgreSQL (heap + TOAST + indexes of every table) of a 200-step run per
    threshold, against a raw table (seq, JSON bytes) of the same messages."""
    try:
        import psycopg
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except Exception as exc:  # any driver failure: no PostgreSQL here
        print(f"PostgreSQL: skipped ({exc})")
        return
    print("200 steps on PostgreSQL, each appending one message: bytes (table + TOAST + indexes)\n")
    print(f"{'messages':<22}{'threshold':>10}{'bytes':>10}{'÷ raw table':>13}")
    tag = f"pkcmp_{os.getpid()}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        try:
            for label, make, size in CASES:
                msgs = [make(size, i) for i in range(200)]
                raw = f"{tag}_raw"
                admin.execute(f"CREATE SCHEMA IF NOT EXISTS {raw}")
                admin.execute(f"CREATE TABLE {raw}.log (thread text, seq int, data bytea, PRIMARY KEY (thread, seq))")
                for i, m in enumerate(msgs):
                    admin.execute(f"INSERT INTO {raw}.log VALUES ('t', %s, %s)", (i, json.dumps(m).encode()))
                floor = schema_bytes(admin, raw)
                admin.execute(f"DROP SCHEMA {raw} CASCADE")
                for t in thresholds:
                    schema = f"{tag}_{t}"
                    store = pk.connect(f"{PG_URL}?schema={schema}", compress_threshold=t)
                    with pk.resume("t", store=store, state=Agent, busy=None):
                        for m in msgs:
                            step(m)
                    store.close()
                    stored = schema_bytes(admin, schema)
                    admin.execute(f"DROP SCHEMA {schema} CASCADE")
                    print(f"{label:<22}{t:>10,}{stored:>10,}{stored / floor:>13.2f}")
                print()
        finally:
            for (name,) in admin.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (tag + "%",)).fetchall():
                admin.execute(f'DROP SCHEMA "{name}" CASCADE')


def schema_bytes(admin: Any, schema: str) -> int:
    row = admin.execute(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'm')",
        (schema,),
    ).fetchone()
    return int(row[0]) if row else 0


def main() -> int:
    micro()
    end_to_end((512, 1024, 1 << 30))
    pg_bytes((512, 1024, 1 << 30))
    return 0


if __name__ == "__main__":
    sys.exit(main())
