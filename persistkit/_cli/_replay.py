"""The ``replay-check`` verb: would the code as it is now continue the runs that wait?

``persistkit replay-check URL module:function [--thread T ...] [--prefix P] [--json]``
imports ``function`` from ``module`` (the current directory is on the import path) —
the entry the worker calls, ``entry(thread_id, run_id)`` opening
``pk.resume(thread_id, run_id=run_id, ...)`` — and runs ``store.check_replay`` with it
(``engine/_replay_check``): every unfinished or suspended run is replayed without running
a step body or writing anything. It prints each run that would stop (thread, run, step,
position, why), each run that still needs a patch's old path (answered
``pk.patched(id)`` False: keep that guard; ``pk.deprecate_patch(id)`` once none does),
and exits 1 when any run would stop, 0 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from .._errors import ConfigurationError
from ..backends import mask_url
from ._open import open_store, resolve_url, split_url
from ._output import Output

__all__ = ["add_parsers"]


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "replay-check", parents=[common], help="replay every waiting run against the code as it is now (before a deploy)",
        description="Replay the recorded steps of every unfinished or suspended run of the store at URL "
        "against the code as it is now, through ENTRY (module:function, imported with the current "
        "directory on the import path: the function the worker calls, entry(thread_id, run_id), "
        "which opens pk.resume(thread_id, run_id=run_id, ...)). No step body runs and nothing is "
        "written. Lists the runs that would stop (thread, run, step, position, why) and the runs "
        "that still need a patch's old path (pk.patched answered False). Exit status 1 when any "
        "run would stop (docs/long-runs.md). The store is --url (as for every verb) or a URL "
        "before ENTRY.",
    )
    p.add_argument("args", nargs="+", metavar="[URL] ENTRY",
                   help="module:function, the entry that resumes one run (after the store's URL, "
                   "or give the URL with --url)")
    p.add_argument("--thread", dest="threads", action="append", metavar="THREAD",
                   help="check only this thread (repeatable)")
    p.add_argument("--prefix", default="", help="only threads whose id starts with this")
    p.add_argument("--namespace", default="", help="the threads' namespace (default: none)")
    p.add_argument("--json", action="store_true", help="print JSON instead of lines")
    p.set_defaults(func=_replay_check)


def load_entry(spec: str) -> Any:
    """The function named ``module:qualname``."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ConfigurationError(f"entry {spec!r}: expected module:function, e.g. myapp.worker:handle")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(f"entry {spec!r}: cannot import {module!r}: {exc}") from exc
    for part in name.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConfigurationError(f"entry {spec!r}: {module!r} has no {name!r}") from exc
    if not callable(obj):
        raise ConfigurationError(f"entry {spec!r} is not a function")
    return obj


def _replay_check(ns: argparse.Namespace, out: Output) -> int:
    given, rest = split_url(ns.args)
    if len(rest) != 1:
        ns.parser.error(f"replay-check takes one ENTRY (module:function), after an optional store URL; got {' '.join(ns.args)}")
    if given is not None and ns.url is not None and given != ns.url:
        ns.parser.error(f"two store URLs: {mask_url(given)} and --url {mask_url(ns.url)}; give one")
    try:
        entry = load_entry(rest[0])
    except ConfigurationError as exc:
        ns.parser.error(str(exc))
    with open_store(resolve_url(given or ns.url)) as store:
        report = store.check_replay(entry, threads=ns.threads, prefix=ns.prefix, namespace=ns.namespace)
    if out.as_json:
        out.value([
            {"thread": r.thread_id, "namespace": r.namespace, "run": r.run_id, "status": r.status,
             "outcome": r.outcome, "ok": r.ok, "step": r.step, "position": r.position,
             "error_type": r.error_type, "error": r.error, "old_patches": list(r.old_patches)}
            for r in report.runs
        ])
        return 0 if report.ok else 1
    for r in report.stopped:
        if r.position is None:
            where = "as it opens"
        elif r.step is None:
            where = f"after position {r.position}"
        else:
            where = f"step {r.step!r} at position {r.position}"
        out.line(f"STOPS thread {r.thread_id} run {r.run_id} ({r.status}): {where}: {r.error_type}: {r.error}")
    for r in report.runs:
        if r.old_patches:
            out.line(f"NEEDS OLD PATH thread {r.thread_id} run {r.run_id}: "
                     + ", ".join(f"pk.patched({p!r})" for p in r.old_patches))
    stopped = len(report.stopped)
    out.line(f"{len(report.runs)} waiting run(s) replayed, {stopped} would stop"
             + ("" if stopped else ": safe to deploy"))
    return 0 if report.ok else 1

