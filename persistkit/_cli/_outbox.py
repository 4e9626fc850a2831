"""The outbox verb: ``drain-outbox`` runs after-commit effects that committed but that no
process ran (its process died between a checkpoint and its effects), as a sweeper would."""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from .._errors import ConfigurationError
from ._open import open_store, resolve_url
from ._output import Output

__all__ = ["add_parsers"]


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "drain-outbox", parents=[common], help="run after-commit effects a crashed process left pending",
        description="Find the after-commit effects (run.after_commit) whose step committed but that "
        "no process ran or recorded done, run them (each with its idempotency key, under its retry "
        "policy, holding the thread's lease; a thread whose lease a live run or another drain holds "
        "is waited for about 2 s, then skipped: that run or drain runs them) and record them done. Effect functions are called only if "
        "registered (@pk.register where they are defined): --import the modules that define them "
        "(or add ?allow_modules=myapp.effects to the URL). Reads every row of each thread it looks at: "
        "narrow it with --prefix or --thread. Exit status 1 when an effect failed for good (it "
        "stays pending) (docs/long-runs.md).",
    )
    p.add_argument("--prefix", default="", help="only threads whose id starts with this")
    p.add_argument("--thread", default=None, help="only this thread")
    p.add_argument("--namespace", default=None, help="only this namespace (default: every one)")
    p.add_argument("--import", dest="modules", action="append", default=[], metavar="MODULE",
                   help="import MODULE (its @pk.register effect functions) and allowlist it (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="list the pending effects, run nothing")
    p.add_argument("--json", action="store_true", help="print JSON instead of lines")
    p.set_defaults(func=_drain)


def _drain(ns: argparse.Namespace, out: Output) -> int:
    for module in ns.modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigurationError(f"--import {module}: cannot import it ({exc}); check PYTHONPATH") from exc
    with open_store(resolve_url(ns.url), allow_modules=tuple(ns.modules)) as store:
        report = store.drain_outbox(prefix=ns.prefix, thread_id=ns.thread, namespace=ns.namespace, dry_run=ns.dry_run)
    effects = [("pending", e) for e in report.pending] + [("done", e) for e in report.done] + [
        ("failed", e) for e in report.failed
    ]
    if out.as_json:
        out.value({
            "threads": report.threads,
            "effects": [
                {"status": s, "thread": e.thread_id, "namespace": e.namespace, "run": e.run_id,
                 "checkpoint": e.checkpoint_id, "position": e.position, "index": e.index,
                 "function": e.function, "key": e.key, "error": e.error}
                for s, e in effects
            ],
            "skipped": [{"thread": t, "namespace": n, "why": why} for t, n, why in report.skipped],
        })
    else:
        for s, e in effects:
            line = f"{s} {e.thread_id} run {e.run_id} step {e.position} effect {e.index} {e.function} key {e.key}"
            out.line(line + (f": {e.error}" if e.error else ""))
        for t, _n, why in report.skipped:
            out.line(f"skipped {t}: {why}")
        out.line(f"{report.threads} thread(s) looked at; {len(report.done)} effect(s) run, "
                 f"{len(report.failed)} failed, {len(report.pending)} pending, {len(report.skipped)} thread(s) skipped")
    return 0 if report.ok else 1
