"""The retention verb: ``prune`` deletes what a policy lets go and nothing a resume, a
pending question, an undrained effect or a live fork still needs (``store.prune``)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from .._errors import ConfigurationError
from ..ops._retention import Retention
from ._open import open_store, resolve_url
from ._output import Output

__all__ = ["add_parsers", "duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(text: str) -> float:
    """``90`` (seconds), ``45s``, ``30m``, ``12h``, ``7d`` or ``2w`` as seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text.lower())
    if m is None or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: give e.g. 90, 45s, 30m, 12h, 7d or 2w")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "prune", parents=[common], help="delete old checkpoints by a retention policy",
        description="Delete the checkpoints (and the stored values only they referred to) that the "
        "policy lets go: --keep-last N newest per thread, --max-age (with both, a checkpoint goes "
        "only when both let it go), --final-only (finished runs keep their last checkpoint), "
        "--thread-ttl (whole threads idle that long, with nothing unfinished). Never deleted: a "
        "thread's newest checkpoint (unless --thread-ttl deletes the whole thread), every checkpoint of an unfinished, failed or suspended run and "
        "the one it started from, a pending after-commit effect, a checkpoint another thread was "
        "forked from, while that thread exists. A thread a live run holds (or one these options cannot read) is skipped, "
        "and the exit status is 1. Safe to interrupt and run again; try "
        "--dry-run first (docs/operations.md, Retention). Durations: 90, 45s, 30m, 12h, 7d, 2w.",
    )
    p.add_argument("--keep-last", type=int, default=None, metavar="N", help="keep the newest N checkpoints of each thread")
    p.add_argument("--max-age", type=duration, default=None, metavar="DURATION", help="keep checkpoints younger than this")
    p.add_argument("--final-only", action="store_true", help="finished runs keep only their last checkpoint")
    p.add_argument("--thread-ttl", type=duration, default=None, metavar="DURATION",
                   help="delete whole threads whose newest checkpoint is older than this")
    p.add_argument("--prefix", default="", help="only threads whose id starts with this")
    p.add_argument("--thread", default=None, help="only this thread")
    p.add_argument("--namespace", default=None, help="only this namespace (default: every one)")
    p.add_argument("--dry-run", action="store_true", help="report what would go now, delete nothing (ages "
                   "count from the moment it runs: a later run may delete more)")
    p.add_argument("--json", action="store_true", help="print JSON instead of lines")
    p.set_defaults(func=_prune)


def _prune(ns: argparse.Namespace, out: Output) -> int:
    if ns.keep_last is None and ns.max_age is None and not ns.final_only and ns.thread_ttl is None:
        ns.parser.error("no rule given: give --keep-last N, --max-age, --final-only and/or --thread-ttl")
    if ns.keep_last is not None and ns.keep_last < 1:
        ns.parser.error(f"--keep-last {ns.keep_last}: give a whole number >= 1 (a thread's newest checkpoint always stays)")
    try:
        policy = Retention(
            keep_last=ns.keep_last, max_age=ns.max_age, final_only=ns.final_only, thread_ttl=ns.thread_ttl
        )
    except ConfigurationError as exc:  # pragma: no cover - the checks above and duration() cover the rules
        ns.parser.error(str(exc))
    with open_store(resolve_url(ns.url)) as store:
        report = store.prune(
            policy, prefix=ns.prefix, thread_id=ns.thread, namespace=ns.namespace, dry_run=ns.dry_run,
            progress=None if not ns.json else False,
        )
    if out.as_json:
        out.value(report.as_dict())
    else:
        out.line(str(report))
    return 1 if report.skipped else 0  # a thread left as it was: a live run held it, or it cannot be read
