"""``persistkit limits``: the shared rate limits of a store (docs/flow-control.md)."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import Any

from .._errors import LimitNotFoundError
from ._open import open_store, resolve_url
from ._output import Output, Shown, cell

__all__ = ["add_parsers"]


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "limits",
        parents=[common],
        help="the shared rate limits: rate, burst, use, throttles, waiters",
        description="Each rate limit declared on the store (store.limits.set), once per key drawn "
        "from: its rate and burst, the tokens available now and in use (drawn within the last "
        "burst/rate window), the calls waiting for their reserved start, and the time until which "
        "a provider's reset (pk.throttle) holds draws back (docs/flow-control.md). The store is "
        "--url, else $PERSISTKIT_URL, else sqlite:///.persistkit/persistkit.db.",
    )
    p.add_argument("--name", default=None, help="only the limit with this name")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_limits)


def _until(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    return f"{datetime.fromtimestamp(t, UTC).isoformat(timespec='seconds')} (in {max(t - now, 0.0):.1f} s)"


def _limits(ns: argparse.Namespace, out: Output) -> int:
    with open_store(resolve_url(ns.url), display=True) as store:
        if ns.name is not None and store.limits.get(ns.name) is None:  # a bad name: ConfigurationError
            raise LimitNotFoundError(
                f"no limit named {ns.name!r} in this store: `persistkit limits --url URL` lists them",
                limit=ns.name,
            )
        infos = [i for i in store.limits.list() if ns.name is None or i.name == ns.name]
    now = time.time()
    if out.as_json:
        out.value(
            [
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
            ]
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
    widths = [max([len(cell(r[k])) for r in rows] + [len(h)]) for k, h in enumerate(heads[:-1])]
    out.table(heads, rows, widths=widths)
    return 0
