"""The thread timeline page: what a thread's runs did, step by step, in one HTML file.

:func:`render` reads a thread's records (``state/_records.py``), oldest first, and builds
the page's model (:func:`model`), which ``_timeline_html`` turns into one self-contained
HTML file. What the records allow, and what the page therefore shows:

* a run is the records of one ``run_id``; its **attempts** are split where an attempt
  stopped: after a failed ``end`` record (a retry of the run id continues it), after a
  ``suspended`` step record (an answer and a resume continue it);
* a step record's status: ``ran``; ``retried`` (a completed step at a position whose
  failure ended an earlier attempt, listed in that attempt's end record ``x``); ``failed``
  (with its error); ``suspended`` (with its question); ``answered`` (``store.answer``'s
  record at a suspended position);
* a **replayed** step writes nothing: the bars of a later attempt marked ``replayed`` are
  the steps recorded in its earlier attempts that it replays (every step recorded there
  but the failures that ended an attempt), inferred from the records, not observed;
* a block that continued an unfinished run (its process died, was interrupted, or its
  block ended with a ``pk.RetryableError``) left a **resume mark** (``rz``) on the first
  record it wrote: the attempt before it ends there ("process HOST:PID died after step 13"),
  and the next one starts with what it replayed ("resumed in HOST:PID, 13 replayed");
  a block that stopped again before it wrote anything left no mark;
* a step's **duration** is the time from the previous record of the same attempt to its
  own record (the ``t`` field, the writer's clock); the first record of an attempt has
  none, as nothing records when an attempt started, except after a resume mark (its time);
* a step that registered **after-commit effects** (``ac``) says how many, and how many of
  them a later record marked done (``ad``);
* the thread's **lease** as it is when the page is written: a run holding it, and the turns
  waiting behind it (or for an unfinished run's redelivery).

Values are shown as stored (``codec/_plain.py``): a secret is its handle, never resolved;
each value embedded is cut to :data:`VALUE_CAP` characters (a list keeps its newest
items), and only the newest :data:`MAX_CHECKPOINTS` checkpoints are read, so a long
thread makes a page of bounded size. The store is taken through :class:`TimelineStore`
(what ``pk.Store`` has), as this floor sits below the engine.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Protocol

from .._errors import ConfigurationError, NotFoundError
from .._io import Plan, call
from ..backends import mask_url
from ..codec._pipeline import Codec
from ..codec._plain import PlainCodec, plain
from ..coordination._lease import host_pid, info
from ..state._channels import Loader
from ..state._records import Record
from ._timeline_html import page

__all__ = ["FORK_ROWS", "FORK_SCAN", "MAX_CHECKPOINTS", "VALUE_CAP", "TimelineStore", "model", "render"]

#: Characters of JSON text embedded per value (a channel's value, a result, a diff's side).
VALUE_CAP = 4_000
#: Checkpoints of the thread read at most (the newest): the page says when older ones are left out.
MAX_CHECKPOINTS = 2_000
#: Other threads of the store looked at for forks of this one, and rows read at most doing
#: so (a fork's first record is its oldest, read last): the page says when either stopped it.
FORK_SCAN = 1_000
FORK_ROWS = 20_000
_PAGE = 500


class TimelineStore(Protocol):
    """What the timeline needs of ``pk.Store`` (named so, not imported: this floor is below it)."""

    codec: Codec

    @property
    def url(self) -> str: ...

    def run_sync(self, plan: Plan[Any]) -> Any: ...


def render(store: TimelineStore, thread_id: str, *, namespace: str = "") -> str:
    """The timeline page of ``thread_id`` as one self-contained HTML document."""
    return page(model(store, thread_id, namespace=namespace))


def model(store: TimelineStore, thread_id: str, *, namespace: str = "") -> dict[str, Any]:
    """The page's data: runs, attempts, bars, and each checkpoint's details (JSON-able)."""
    codec = PlainCodec.like(store.codec)  # values as stored: no class revived, no handle resolved
    data: dict[str, Any] = store.run_sync(_model(codec, thread_id, namespace))
    data["store"] = mask_url(store.url)
    return data


def _model(codec: Codec, thread_id: str, namespace: str) -> Plan[dict[str, Any]]:
    records, total, oldest = yield from _read(codec, thread_id, namespace)
    if not records:
        where = f" in namespace {namespace!r}" if namespace else ""
        raise NotFoundError(f"thread {thread_id!r} has no checkpoints{where}: nothing to show on a timeline")
    loader = Loader(codec, thread_id, namespace)
    loader.add(records)
    big = {f"result{i}": {"b": r.body["rb"]} for i, r in enumerate(records) if "rb" in r.body}
    yield from loader.fetch([r.refs for r in records] + ([big] if big else []))
    values = _Values(loader)
    by_id = {r.id: r for r in records}
    details = {r.id: _details(r, by_id.get(r.row.parent_id or ""), values, loader) for r in records}
    runs, outside = _lanes(records)
    first = records[0]
    if oldest is not None and oldest != first.id:  # a long thread: its first record was not read
        row = yield call("get", thread_id, namespace, oldest)
        first = Record.decode(codec, row) if row is not None else first
    forked_from = None
    if first.kind == "fork" and "f" in first.body:
        forked_from = {"thread": first.body["f"][0], "checkpoint": first.body["f"][1]}
    forks, scanned, limited = yield from _forks(codec, thread_id, namespace, first.id)
    lease = yield from _lease(thread_id, namespace)
    children = yield from _children(codec, thread_id, namespace)
    return {
        "thread": thread_id,
        "namespace": namespace,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "shown": len(records),
        "total": total,
        "cap": VALUE_CAP,
        "forked_from": forked_from,
        "forks": forks,
        "forks_scanned": scanned,
        "forks_limited": limited,
        "runs": runs,
        "outside": outside,
        "lease": lease,
        "children": children,
        "checkpoints": details,
        "values": values.texts,
    }


def _read(codec: Codec, thread_id: str, namespace: str) -> Plan[tuple[list[Record], int | None, str | None]]:
    """The newest :data:`MAX_CHECKPOINTS` records, oldest first, the thread's record count
    when it has more (None when all were read), and the id of its oldest record."""
    out: list[Record] = []
    before = None
    while len(out) < MAX_CHECKPOINTS:
        want = min(_PAGE, MAX_CHECKPOINTS - len(out))
        page = yield call("list", thread_id, namespace, before=before, limit=want)
        out.extend(Record.decode(codec, row) for row in page)
        if len(page) < want:
            out.reverse()
            return out, None, out[0].id if out else None
        before = page[-1].checkpoint_id
    more = yield call("list", thread_id, namespace, before=before, limit=1)
    out.reverse()
    if not more:
        return out, None, out[0].id
    total = len(out)
    while True:  # count what is left out (rows are not decoded)
        page = yield call("list", thread_id, namespace, before=before, limit=_PAGE)
        total += len(page)
        if page:
            before = page[-1].checkpoint_id
        if len(page) < _PAGE:
            break
    return out, total, before


def _forks(codec: Codec, thread_id: str, namespace: str, first_id: str) -> Plan[tuple[list[dict[str, str]], int, bool]]:
    """Threads whose first record is a fork of ``thread_id``: at most :data:`FORK_SCAN`
    other threads are looked at. A thread with a record older than this thread's first
    one cannot be its fork (checkpoint ids are time-ordered): one short read skips it."""
    threads: list[str] = yield call("threads", prefix="", after=None, limit=FORK_SCAN + 2)  # + this one + one more
    others = [t for t in threads if t != thread_id][:FORK_SCAN]
    limited = len(threads) > len(others) + (thread_id in threads)
    found: list[dict[str, str]] = []
    budget = FORK_ROWS
    for looked, other in enumerate(others):
        older = yield call("list", other, namespace, before=first_id, limit=1)
        if older:
            continue
        oldest = None
        before = None
        while budget > 0:
            page = yield call("list", other, namespace, before=before, limit=_PAGE)
            budget -= max(1, len(page))
            if page:
                oldest = page[-1]
            if len(page) < _PAGE:
                break
            before = page[-1].checkpoint_id
        else:
            return found, looked, True  # out of rows to read: this thread and the rest unseen
        if oldest is None or oldest.run_id is not None:
            continue
        rec = Record.decode(codec, oldest)
        src = rec.body.get("f")
        if rec.kind == "fork" and src and src[0] == thread_id:
            found.append({"thread": other, "checkpoint": str(src[1]), "at": rec.id})
    return found, len(others), limited


def _lease(thread_id: str, namespace: str) -> Plan[dict[str, Any] | None]:
    """The thread's lease as it is now: who holds it, who waits, and for which unfinished run
    the thread waits; None when nobody holds it and nobody waits (or the store has no leases)."""
    try:
        rec = yield call("lease_get", thread_id, namespace)
    except (ConfigurationError, NotImplementedError):  # a store without lease primitives
        return None
    if rec is None:
        return None
    found = info(thread_id, namespace, rec)
    if found.holder is None and not found.waiting and found.reserved_for is None:
        return None
    return {
        "holder": found.holder and host_pid(found.holder),
        "expires": found.expires_at if found.holder else None,
        "waiting": [host_pid(w) for w in found.waiting],
        "reserved_for": found.reserved_for,
    }


def _children(codec: Codec, thread_id: str, namespace: str) -> Plan[list[dict[str, Any]]]:
    """The child runs the thread's runs started (``pk.start``), as a tree with each one's status
    now; empty for a store without a kv space."""
    from ..coordination._children import tree_plan

    try:
        tree: list[dict[str, Any]] = yield from tree_plan(codec, thread_id, namespace)
    except (ConfigurationError, NotImplementedError):  # a store without kv (or leases)
        return []
    return tree


# -- runs, attempts, bars -------------------------------------------------------------------


def _lanes(records: list[Record]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The runs (each with its attempts and their bars), and the records outside runs
    (forks, state updates), in the order they were written."""
    runs: dict[str, list[Record]] = {}
    outside: list[dict[str, Any]] = []
    for rec in records:
        if rec.row.run_id:
            runs.setdefault(rec.row.run_id, []).append(rec)
        elif rec.kind in ("fork", "update"):
            outside.append(_bar(rec, rec.kind, None))
    done = {i for r in records for i in r.body.get("ad") or ()}  # after-commit effects marked done (a drain
    # marks them on whatever record is the thread's head then, maybe another run's)
    return [_run(run_id, recs, done) for run_id, recs in runs.items()], outside


def _run(run_id: str, recs: list[Record], done: set[str]) -> dict[str, Any]:
    attempts: list[dict[str, Any]] = []
    bars: list[dict[str, Any]] = []
    recorded: dict[str, Record] = {}  # position -> its newest step record in earlier attempts
    escaped: set[str] = set()  # failures that ended an attempt: they run again
    failures: dict[str, int] = {}  # position -> failed records so far
    suspended_at: set[str] = set()
    prev: Record | None = None
    this_attempt: dict[str, Record] = {}
    resumed: dict[str, Any] | None = None  # the resume mark that opened the attempt being built

    def close(ended: str) -> None:
        nonlocal bars, prev, this_attempt, resumed
        attempts.append({"n": len(attempts) + 1, "ended": ended, "bars": bars, "resumed": resumed})
        recorded.update(this_attempt)
        bars, prev, this_attempt, resumed = [], None, {}, None

    for rec in recs:
        if rec.body.get("dm"):  # an outbox done mark: a copy of the record before it
            continue
        mark = rec.body.get("rz")
        if mark is not None:  # a block continued the run here: the attempt before it stopped
            steps = len(recorded.keys() | this_attempt.keys())
            words = _resume_words(mark, prev, steps)
            if bars:
                close(words["ended"])
            resumed = words
        if not bars and attempts:  # a later attempt: what it replays comes first
            bars.extend(
                {**_bar(r, "replayed", None), "from": r.id}
                for r in sorted(recorded.values(), key=lambda r: r.id)
                if r.id not in escaped and r.body.get("s") != "suspended"
            )
        if prev is not None:
            duration: float | None = max(0.0, _time(rec) - _time(prev))
        else:  # an attempt's first record: timed from its resume mark, if it has one
            duration = max(0.0, _time(rec) - float(mark["t"])) if mark is not None else None
        if rec.kind == "step":
            pos, status = str(rec.body["p"]), str(rec.body["s"])
            shown = {"failed": "failed", "suspended": "suspended"}.get(status, "ran")
            if status == "completed" and pos in suspended_at:
                shown = "answered"
            elif status == "completed" and failures.get(pos):
                shown = "retried"
            bar = _bar(rec, shown, duration)
            bar["retries"] = failures.get(pos, 0)
            effects = rec.body.get("ac")
            if effects and status == "completed":
                ids = [f"{rec.id}.{i}" for i in range(len(effects))]
                bar["effects"] = {"n": len(ids), "done": sum(1 for i in ids if i in done),
                                  "names": [str(e.get("f")) for e in effects]}
            bars.append(bar)
            if status == "failed":
                failures[pos] = failures.get(pos, 0) + 1
            if status == "suspended":
                suspended_at.add(pos)
            this_attempt[pos] = rec
            prev = rec
            if status == "suspended" and rec.run_status == "suspended":
                close("suspended")
        else:
            shown = f"run {rec.run_status}" if rec.kind == "end" else rec.kind  # an update made by a run
            bars.append(_bar(rec, shown, duration))
            prev = rec
            if rec.kind == "end":
                escaped.update(rec.body.get("x") or ())
                close(rec.run_status or "ended")
    if bars:
        last = recs[-1].run_status or "running"
        close(last if last != "running" else "unfinished")
    status = recs[-1].run_status or "unknown"
    if status == "running":
        status = "unfinished"
    return {"run": run_id, "status": status, "attempts": attempts, "first": recs[0].id}


def _resume_words(mark: dict[str, Any], last: Record | None, steps: int) -> dict[str, Any]:
    """What a resume mark (``rz``) says, for people: how the attempt before it ended (the
    process died, its lease expired, a retryable error, or it stopped) and what resumed it."""
    holder = mark.get("w")
    if isinstance(holder, str):
        how = f"process {holder} died" if mark.get("g") == 1 else f"process {holder} stopped renewing its lease"
        ended = "process died" if mark.get("g") == 1 else "lease expired"
    elif last is not None and last.body.get("ru"):
        how, ended = "stopped by a retryable error", "retryable error"
    else:
        how, ended = "process stopped", "stopped"
    after = ""
    if last is not None and last.kind == "step":
        after = f" after step {steps} ({last.body.get('n')} at {last.body.get('p')})"
    elif steps:
        after = f" after step {steps}"
    n = int(mark["n"])
    text = f"{how}{after} · resumed in {mark['h']}, {n} replayed"
    return {"text": text, "ended": ended, "host": str(mark["h"]), "replayed": n, "t": float(mark["t"]),
            "holder": holder if isinstance(holder, str) else None}


def _bar(rec: Record, status: str, duration: float | None) -> dict[str, Any]:
    b = rec.body
    name = b.get("n") or {"end": "end of run", "fork": "fork", "update": "state update"}.get(rec.kind, rec.kind)
    return {
        "c": rec.id,
        "name": str(name),
        "pos": b.get("p"),
        "status": status,
        "dur": duration,
        "t": _time(rec),
        "error": _error(b.get("e")),
        "retries": 0,
    }


def _time(rec: Record) -> float:
    t = rec.body.get("t", 0.0)
    return float(t) if isinstance(t, (int, float)) else 0.0


def _error(tree: Any) -> str | None:
    """A recorded exception as ``Class: message`` (handles as stored)."""
    if not isinstance(tree, dict):
        return None
    text = plain(tree)
    return text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, default=str)


# -- one checkpoint's details: result, state, diff ----------------------------------------------


def _details(rec: Record, parent: Record | None, values: _Values, loader: Loader) -> dict[str, Any]:
    b = rec.body
    result = None
    if "rb" in b:
        result = values.text(loader.codec.unpack_tree(loader.blobs[b["rb"]], "result"))
    elif "r" in b and rec.kind == "step":
        result = values.text(b["r"])
    out: dict[str, Any] = {
        "id": rec.id,
        "kind": "mark" if b.get("dm") else rec.kind,
        "step": b.get("n"),
        "pos": b.get("p"),
        "status": b.get("s"),
        "rs": rec.run_status,
        "run": rec.row.run_id,
        "parent": rec.row.parent_id,
        "t": _time(rec),
        "args": b.get("a"),
        "result": result,
        "error": _error(b.get("e")),
        "question": values.text(_questions(b["q"])) if "q" in b else None,
        "state": {name: values.of(name, ref) for name, ref in sorted(rec.refs.items())},
        "diff": _diff(rec, parent, values),
    }
    if "f" in b:
        out["forked_from"] = {"thread": b["f"][0], "checkpoint": b["f"][1]}
    return out


def _questions(q: Any) -> Any:
    """A suspend record's question(s) (``q``) with readable keys: id, payload, deadline, ..."""
    if isinstance(q, list):
        return [_questions(one) for one in q]
    names = {"i": "id", "v": "payload", "d": "deadline", "df": "default", "ty": "answer type", "w": "timer", "a": "answer"}
    if not isinstance(q, dict):
        return q
    out = {names.get(k, k): v for k, v in q.items()}
    if isinstance(q.get("d"), (int, float)):  # seconds since the epoch: as a date
        out["deadline"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(q["d"]))
    return out


def _diff(rec: Record, parent: Record | None, values: _Values) -> dict[str, Any]:
    """What changed from the parent checkpoint (the thread's previous one), channel by channel."""
    if parent is None:
        why = "first checkpoint read" if rec.row.parent_id else "first checkpoint of the thread"
        return {"base": None, "note": why, "changes": [], "unchanged": []}
    changes: list[dict[str, Any]] = []
    unchanged: list[str] = []
    old, new = parent.refs, rec.refs
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            unchanged.append(name)
        elif a is None:
            changes.append({"ch": name, "op": "added", "new": values.of(name, b)})  # type: ignore[arg-type]
        elif b is None:
            changes.append({"ch": name, "op": "removed", "old": values.of(name, a)})
        elif "l" in a and "l" in b and a["g"] == b["g"] and a["n"] <= b["n"]:
            changes.append({"ch": name, "op": "appended", "n": b["n"] - a["n"],
                            "new": values.items(name, b, a["n"])})
        else:
            change = {"ch": name, "op": "changed", "old": values.of(name, a), "new": values.of(name, b)}
            keys = values.keys_changed(name, a, b)
            if keys is not None:
                change["keys"] = keys
            changes.append(change)
    return {"base": parent.id, "note": None, "changes": changes, "unchanged": unchanged}


class _Values:
    """Each distinct value's text once (``texts``), cut to :data:`VALUE_CAP`; checkpoints
    refer to it by index, so an unchanged channel costs one number per checkpoint."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self.texts: list[str] = []
        self._index: dict[str, int] = {}

    def _add(self, key: str, make: Any) -> int:
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.texts)
            self.texts.append(make())
        return i

    def text(self, tree: Any) -> int:
        """A stored tree (a result, a question) as plain JSON text."""
        digest = hashlib.blake2b(json.dumps(tree, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()
        return self._add("t" + digest, lambda: _cut(_dump(plain(tree))))

    def of(self, name: str, ref: dict[str, Any]) -> int:
        """Channel ``name``'s value at a ref; a list shows its newest items when cut."""
        if "l" in ref:
            return self.items(name, ref, 0)
        return self._add("v" + name + json.dumps(ref, sort_keys=True, default=str),
                         lambda: _cut(_dump(self.loader.value(name, ref))))

    def items(self, name: str, ref: dict[str, Any], start: int) -> int:
        """A list channel's items from ``start`` on (an append's new items)."""
        key = f"l{name}\x00{ref['g']}\x00{ref['l']}\x00{ref['n']}\x00{start}"
        return self._add(key, lambda: _list_text(self.loader.list_items(name, ref)[start:], start))

    def keys_changed(self, name: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[str]] | None:
        """For two dict values: the keys added, removed and changed (else None)."""
        if "l" in a or "l" in b:
            return None
        x, y = self.loader.value(name, a), self.loader.value(name, b)
        if not (isinstance(x, dict) and isinstance(y, dict)):
            return None
        return {
            "added": sorted(str(k) for k in y.keys() - x.keys()),
            "removed": sorted(str(k) for k in x.keys() - y.keys()),
            "changed": sorted(str(k) for k in x.keys() & y.keys() if x[k] != y[k]),
        }


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


def _cut(text: str) -> str:
    if len(text) <= VALUE_CAP:
        return text
    return f"{text[:VALUE_CAP]}\n… cut: {len(text):,} characters in all, the first {VALUE_CAP:,} shown"


def _list_text(items: list[Any], start: int) -> str:
    """Items as a JSON list; when too long, the newest items that fit, saying how many are left out."""
    shown: list[str] = []
    size = 0
    for item in reversed(items):
        text = "  " + _dump(item).replace("\n", "\n  ")
        if shown and size + len(text) > VALUE_CAP:
            break
        shown.append(_cut(text) if not shown else text)
        size += len(text) + 2
    shown.reverse()
    body = "[\n" + ",\n".join(shown) + "\n]" if shown else "[]"
    left = len(items) - len(shown)
    if left:
        first = f"items {start}..{start + left - 1}" if left > 1 else f"item {start}"
        body = f"… cut: {first} not shown ({len(items):,} items here), the newest {len(shown):,} shown\n" + body
    return body
