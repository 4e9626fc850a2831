"""``persistkit limits``: the shared rate limits and concurrency limits of a store
(docs/flow-control.md)."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import Any

from .._errors import ConfigurationError, LimitNotFoundError
from ..coordination._concurrency import SlotInfo, slots
from ._open import open_store, resolve_url
from ._output import Output, Shown, cell

__all__ = ["add_parsers"]


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "limits",
        parents=[common],
        help="the shared rate limits (rate, burst, use, throttles, waiters) and concurrency slots",
        description="Each rate limit declared on the store (store.limits.set), once per key drawn "
        "from: its rate and burst, the tokens available now and in use (drawn within the last "
        "burst/rate window), the calls waiting for their reserved start, and the time until which "
        "a provider's reset (pk.throttle) holds draws back; then each concurrency key a turn took a "
        "slot of (pk.resume(concurrency=)): its limit, the turns holding a slot and waiting for one, "
        "and how long a turn held one lately (docs/flow-control.md). The store is "
        "--url, else $PERSISTKIT_URL, else sqlite:///.persistkit/persistkit.db.",
    )
    p.add_argument("--name", default=None, help="only the rate or concurrency limit with this name")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_limits)


def _until(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    return f"{datetime.fromtimestamp(t, UTC).isoformat(timespec='seconds')} (in {max(t - now, 0.0):.1f} s)"


def _rate_limits(store: Any, name: str | None, held: list[SlotInfo]) -> list[Any]:
    if name is None:
        return list(store.limits.list())
    try:
        found = store.limits.get(name) is not None
    except ConfigurationError:  # no rate limit's name: a bad name unless a concurrency limit has it
        if not held:
            raise
        found = False
    if not found and not held:
        raise LimitNotFoundError(
            f"no rate or concurrency limit named {name!r} in this store: `persistkit limits --url URL` "
            "lists them",
            limit=name,
        )
    return [i for i in store.limits.list() if i.name == name] if found else []


def _limits(ns: argparse.Namespace, out: Output) -> int:
    with open_store(resolve_url(ns.url), display=True) as store:
        held = [s for s in slots(store) if ns.name is None or s.name == ns.name]
        infos = _rate_limits(store, ns.name, held)
    now = time.time()
    if out.as_json:
        out.value(
            {
                "rate_limits": [
                {
                    "name": i.name,
                    "key": i.key,
                    "rate": i.rate,
                    "burst": i.burst,
                    "tokens_per_call": i.tokens_per_call,
                    "timeout": i.timeout,
                    "available": i.available,
                    "in_use": i.in_use,
                    "waiting": i.waiting,
                    "throttled_until": i.throttled_until,
                }
                for i in infos
                ],
                "concurrency": [
                    {
                        "name": s.name,
                        "key": s.key,
                        "limit": s.limit,
                        "holders": list(s.holders),
                        "waiting": list(s.waiting),
                        "average_hold": s.average_hold,
                    }
                    for s in held
                ],
            }
        )
        return 0
    rows = [
        (
            i.name,
            i.key or Shown("''"),
            i.rate,
            f"{i.burst:g}",
            f"{i.available:g}",
            f"{i.in_use:g}",
            i.waiting,
            _until(i.throttled_until, now),
        )
        for i in infos
    ]
    heads = ("limit", "key", "rate", "burst", "available", "in_use", "waiting", "throttled_until")
    if rows or not held:
        widths = [max([len(cell(r[k])) for r in rows] + [len(h)]) for k, h in enumerate(heads[:-1])]
        out.table(heads, rows, widths=widths)
    if held:
        if rows:
            out.line("")
        _slots_table(out, held)
    return 0


def _slots_table(out: Output, held: list[SlotInfo]) -> None:
    rows = [
        (
            s.name,
            s.key,
            s.limit,
            len(s.holders),
            len(s.waiting),
            f"{s.average_hold:.3g} s" if s.average_hold else "-",
        )
        for s in held
    ]
    heads = ("concurrency", "key", "limit", "holders", "waiting", "average_hold")
    widths = [max([len(cell(r[k])) for r in rows] + [len(h)]) for k, h in enumerate(heads[:-1])]
    out.table(heads, rows, widths=widths)
