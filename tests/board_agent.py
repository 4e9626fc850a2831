"""A worker for the board process tests (tests/test_board_processes.py), run as its own process.

    python board_agent.py MODE URL BOARD NAME LOG OPTIONS_JSON

Every line it appends to LOG is ``NAME EVENT ...``, written with one ``write`` on a file
opened for appending (so lines of concurrent workers never interleave, and a line
written before a SIGKILL stays). Modes:

- ``claim``: loop ``claim("tasks/")`` -> log ``claim ITEM TOKEN`` -> "work" (log ``work``) ->
  ``complete(results={"done/ITEM": NAME})`` -> log ``done ITEM``. On its ``hold``-th claim it
  logs ``hold ITEM`` and waits for the file ``go`` first (the test SIGKILLs or SIGSTOPs it
  there). A refused complete logs ``lost ITEM`` and the loop goes on. When ``claim`` returns
  None the worker stops only if no item is left at all (an item claimed by a dead or paused
  worker comes back after ``lease_ttl``): it then logs ``exit``.
- ``count``: ``runs`` times ``update("counter", +1)`` and a hand-written cas loop on
  ``counter-cas``; logs ``counted RUNS CAS_CONFLICTS``.
- ``watch``: watches ``w/*``, logs ``ready`` once the watch is open, then ``change KEY
  VERSION KIND`` for every change until the file ``go`` exists and ``w/stop`` was seen.
- ``scoped``: a scoped handle tries what its grants allow and what they do not; logs
  ``result JSON`` (what happened to each attempt).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import persistkit as pk


class Log:
    def __init__(self, path: str, name: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.name = name

    def __call__(self, *words: object) -> None:
        os.write(self.fd, (" ".join(str(w) for w in (self.name, *words)) + "\n").encode())


def wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.01)


def claimer(board: pk.Board, name: str, log: Log, opts: dict[str, Any]) -> None:
    ttl = float(opts["lease_ttl"])
    hold = int(opts.get("hold", 0))
    claims = 0
    while True:
        claim = board.claim("tasks/", name, lease_ttl=ttl)
        if claim is None:
            if not board.list("tasks/", limit=1):
                break
            # items remain, held by others: one may come back when its claim expires (twice a
            # claim's life, not faster: sixteen idle pollers were most of moto's load on S3)
            time.sleep(ttl / 2)
            continue
        claims += 1
        item = claim.key.removeprefix("tasks/")
        log("claim", item, claim.token)
        log("work", item)  # the side effect: counted by the test
        if claims == hold:
            log("hold", item)
            wait_for(str(opts["go"]))
        try:
            claim.complete(results={f"done/{item}": name})
        except pk.ClaimLostError:
            log("lost", item)
            continue
        log("done", item)
    log("exit")


def counter(board: pk.Board, name: str, log: Log, opts: dict[str, Any]) -> None:
    runs = int(opts["runs"])
    conflicts = 0
    for _ in range(runs):
        board.update("counter", lambda n: n + 1, default=0)
        while True:  # the same by hand: read, cas, read again on conflict
            entry = board.get("counter-cas")
            current, version = (0, 0) if entry is None else (entry.value, entry.version)
            try:
                board.cas("counter-cas", current + 1, version)
                break
            except pk.ConflictError:
                conflicts += 1
    log("counted", runs, conflicts)


def watcher(board: pk.Board, name: str, log: Log, opts: dict[str, Any]) -> None:
    with board.watch("w/*", poll_interval=0.05) as watch:
        log("ready", os.getpid())
        stopped = False
        while not (stopped and os.path.exists(str(opts["go"]))):
            change = watch.next(timeout=0.2)
            if change is not None:
                log("change", change.key, change.version, change.kind)
                stopped = stopped or change.key == "w/stop"
    log("exit")


def _attempt(fn: Any) -> dict[str, Any]:
    try:
        result = fn()
    except pk.AccessDeniedError as exc:
        return {"denied": str(exc), "key": exc.key}
    except pk.PersistkitError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if isinstance(result, list):
        result = [getattr(e, "key", e) for e in result]
    elif hasattr(result, "value") and hasattr(result, "version"):
        result = result.value
    elif isinstance(result, pk.Claim):
        result = result.key
    return {"ok": result}


def scoped(board: pk.Board, name: str, log: Log, opts: dict[str, Any]) -> None:
    agent = board.scoped(name, read=["research/*", "inbox/summarizer/*"], write=["output/summarizer/*", "inbox/summarizer/*"])
    out: dict[str, Any] = {}

    def batch_outside() -> None:
        with agent.batch() as b:
            b.put("output/summarizer/in-batch", 1)
            b.put("secret/from-batch", 1)

    def complete_outside() -> Any:
        claim = agent.claim("inbox/summarizer/", name, lease_ttl=60)
        assert claim is not None
        try:
            claim.complete(results={"secret/leak": "x"})
        except pk.AccessDeniedError:
            claim.complete(results={"output/summarizer/answer": "done"})  # the same claim, inside the grants
            raise
        return claim.key

    attempts = {
        "get_inside": lambda: agent.get("research/a"),
        "get_outside": lambda: agent.get("secret/plan"),
        "value_outside": lambda: agent.value("secret/plan"),
        "history_outside": lambda: agent.history("secret/plan"),
        "list_all": lambda: agent.list(""),
        "list_outside": lambda: agent.list("secret/"),
        "put_inside": lambda: agent.put("output/summarizer/1", "summary"),
        "put_outside": lambda: agent.put("secret/plan", "overwritten"),
        "put_readonly": lambda: agent.put("research/a", "overwritten"),
        "cas_outside": lambda: agent.cas("secret/plan", "overwritten", 1),
        "delete_outside": lambda: agent.delete("secret/plan"),
        "update_outside": lambda: agent.update("secret/plan", lambda v: "overwritten"),
        "batch_outside": batch_outside,
        "claim_outside": lambda: agent.claim("secret/", name),
        "claim_readonly": lambda: agent.claim("research/", name),
        "complete_outside": complete_outside,
        "watch_outside": lambda: agent.watch("secret/*"),
        "policy": lambda: agent.policy("", history=1),
        "clear": lambda: agent.clear(),
        "rescope": lambda: agent.scoped(name, read=["*"], write=["*"]),
        "aget_outside": lambda: asyncio.run(agent.aget("secret/plan")),
        "aput_outside": lambda: asyncio.run(agent.aput("secret/plan", "overwritten")),
    }
    for what, fn in attempts.items():
        out[what] = _attempt(fn)
    # A watch of everything: only keys the grants cover come out of it.
    with agent.watch("*", poll_interval=0.05) as watch:
        log("watching")
        seen: list[str] = []
        while "research/last" not in seen:
            change = watch.next(timeout=60)
            assert change is not None, f"no change after 60 s: {seen}"
            seen.append(change.key)
    out["watched"] = seen
    log("result", json.dumps(out))


MODES = {"claim": claimer, "count": counter, "watch": watcher, "scoped": scoped}


def main() -> None:
    mode, url, board_name, name, path, raw = sys.argv[1:7]
    opts = json.loads(raw)
    log = Log(path, name)
    store = pk.connect(url)
    try:
        MODES[mode](store.board(board_name), name, log, opts)
    finally:
        store.close()


if __name__ == "__main__":
    main()
