"""Verbs of suspended runs: ``answer`` (answer a run's open question), ``pending`` (the open
questions across threads) and ``due`` (suspended runs a resume now continues)."""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any

from .._errors import ConfigurationError
from ._open import open_store, resolve_url
from ._output import Output, Shown, cell, dumps

__all__ = ["add_parsers"]


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "answer", parents=[common], help="answer the open question of a suspended run",
        description="Record VALUE_JSON (a JSON value) as the answer to THREAD's open question "
        "(pk.suspend); the run's next resume goes on with it. Nothing of the agent runs here: "
        "resume the run afterwards (your worker, or `pk.resume(THREAD)`). Refused, with nothing "
        "stored, when the thread is not suspended, the question was answered or expired, the "
        "value does not fit the question's answer type, or a live run holds the thread's lease "
        "(docs/long-runs.md).",
    )
    p.add_argument("thread", help="the thread's id")
    p.add_argument("value", metavar="VALUE_JSON", help='the answer as JSON, e.g. true, 42, \'{"approved": true}\'')
    p.add_argument("--question", default=None, help="the question id, when several are open (see `persistkit pending`)")
    p.add_argument("--namespace", default="", help="the thread's namespace (default: none)")
    p.add_argument("--allow-module", action="append", default=[], metavar="MODULE",
                   help="a module whose classes an answer type may be (a pydantic model or dataclass): "
                   "imported to check the answer; repeat for several")
    p.add_argument("--json", action="store_true", help="print the answer's checkpoint as JSON")
    p.set_defaults(func=_answer)

    p = sub.add_parser(
        "pending", parents=[common], help="open questions of suspended runs, across threads",
        description="Every open question (pk.suspend) of the store's suspended runs: thread, run, "
        "question id, deadline and payload. Reads the head of each thread (under --prefix).",
    )
    p.add_argument("--prefix", default="", help="only threads whose id starts with this")
    p.add_argument("--namespace", default="", help="the threads' namespace (default: none)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_pending)

    p = sub.add_parser(
        "due", parents=[common], help="suspended runs whose timer or deadline passed",
        description="Suspended runs that a resume now continues: a pk.sleep timer whose wake time "
        "passed, or questions whose deadlines passed (their defaults are taken). A scheduler "
        "resumes each with pk.resume(THREAD, run_id=RUN).",
    )
    p.add_argument("--prefix", default="", help="only threads whose id starts with this")
    p.add_argument("--namespace", default="", help="the threads' namespace (default: none)")
    p.add_argument("--now", default=None, help="judge due at this ISO time with a zone (default: now)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_due)


def _iso(d: datetime | None) -> str | None:
    return d.isoformat(timespec="seconds") if d is not None else None


def _answer(ns: argparse.Namespace, out: Output) -> int:
    try:
        value = json.loads(ns.value)
    except ValueError as exc:
        raise ConfigurationError(f"VALUE_JSON is not JSON ({exc}): quote strings, e.g. '\"yes\"'") from exc
    options: dict[str, Any] = {"allow_modules": ns.allow_module} if ns.allow_module else {}
    with open_store(resolve_url(ns.url), **options) as store:
        cp = store.answer(ns.thread, value, question=ns.question, namespace=ns.namespace)
    if out.as_json:
        out.value({"thread": cp.thread_id, "namespace": cp.namespace, "run": cp.run_id,
                   "checkpoint": cp.checkpoint_id, "run_status": cp.run_status})
    else:
        more = " (other questions still open)" if cp.run_status == "suspended" else ""
        out.line(f"answered thread {cp.thread_id} (checkpoint {cp.checkpoint_id}){more}; resume run "
                 f"{cp.run_id} to go on")
    return 0


def _pending(ns: argparse.Namespace, out: Output) -> int:
    with open_store(resolve_url(ns.url), display=True) as store:
        qs = store.pending(prefix=ns.prefix, namespace=ns.namespace)
    if out.as_json:
        out.value([{"thread": q.thread_id, "namespace": q.namespace, "run": q.run_id, "question": q.question_id,
                    "asked_at": _iso(q.asked_at), "deadline": _iso(q.deadline), "has_default": q.has_default,
                    "answer_type": q.answer_type, "payload": q.payload, "kind": q.kind, "topic": q.topic} for q in qs])
        return 0
    rows = [(q.thread_id, q.run_id, q.question_id, _iso(q.deadline) or "-",
             f"(waits for a message on topic {q.topic!r}: store.send)" if q.kind == "message"
             else Shown(dumps(q.payload, indent=None)))
            for q in qs]
    _table(out, ("thread", "run", "question", "deadline", "payload"), rows)
    return 0


def _due(ns: argparse.Namespace, out: Output) -> int:
    now = None
    if ns.now is not None:
        try:
            now = datetime.fromisoformat(ns.now)
        except ValueError as exc:
            raise ConfigurationError(f"--now {ns.now!r} is not an ISO time (2026-01-31T12:00:00+00:00)") from exc
        if now.tzinfo is None:
            raise ConfigurationError(
                f"--now {ns.now!r} has no time zone: add one (2026-01-31T12:00:00+00:00, or Z for UTC)"
            )
    with open_store(resolve_url(ns.url), display=True) as store:
        due = store.due(now, prefix=ns.prefix, namespace=ns.namespace)
    if out.as_json:
        out.value([{"thread": d.thread_id, "namespace": d.namespace, "run": d.run_id, "due_at": _iso(d.due_at),
                    "kind": d.questions[0].kind if d.questions else "question",
                    "questions": [q.question_id for q in d.questions]} for d in due])
        return 0
    rows = [(d.thread_id, d.namespace or Shown("''"), d.run_id, _iso(d.due_at),
             d.questions[0].kind if d.questions else "question") for d in due]
    _table(out, ("thread", "namespace", "run", "due_at", "kind"), rows)
    return 0


def _table(out: Output, heads: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    widths = [max([len(cell(r[k])) for r in rows] + [len(h)]) for k, h in enumerate(heads[:-1])]
    out.table(heads, rows, widths=widths)
