"""Verbs of the coordination layer: ``leases`` (who holds which thread), ``abandon``
(give up an unfinished run that will never be redelivered) and ``cancel`` (stop a run)."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from typing import Any

from ._open import open_store, resolve_url
from ._output import Output, Shown, cell

__all__ = ["add_parsers"]


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "leases", parents=[common], help="who holds which thread's lease, and who waits",
        description="Each thread that ever had a lease: its holder (none when released or "
        "expired), the fencing token of its latest holder, when the lease expires, the run the "
        "thread is reserved for (an unfinished run only whose redelivery or `persistkit abandon` "
        "may take it) and the runs queued for it in arrival order (docs/coordination.md). The store is --url, else "
        "$PERSISTKIT_URL, else sqlite:///.persistkit/persistkit.db.",
    )
    p.add_argument("--prefix", default="", help="only threads whose id starts with this")
    p.add_argument("--held", action="store_true",
                   help="only threads that are not free: held now, or reserved for an unfinished run")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_leases)

    p = sub.add_parser(
        "abandon", parents=[common], help="give up an unfinished run that will never be redelivered",
        description="End RUN, an unfinished run of THREAD (its process died and its message will "
        "never be redelivered), so the thread's next turns, which wait for it to be continued, go "
        "on. Its committed steps stay in the thread; a redelivery of it raises RunAbandonedError "
        "and runs nothing. Refused while a live run holds the thread's lease (it may be RUN "
        "itself), for a run that finished, and for a run the thread moved on past "
        "(docs/coordination.md).",
    )
    p.add_argument("thread", help="the thread's id")
    p.add_argument("run", help="the unfinished run's id (the run_id it was resumed with)")
    p.add_argument("--namespace", default="", help="the thread's namespace (default: none)")
    p.add_argument("--json", action="store_true", help="print the end record as JSON")
    p.set_defaults(func=_abandon)

    p = sub.add_parser(
        "cancel", parents=[common], help="stop a run: live at its next step, or a suspended or crashed one now",
        description="Stop RUN of THREAD (default: the run live or unfinished on it). A live run is "
        "asked to stop: at its next step boundary pk.RunCancelledError is raised inside it (its "
        "compensations run) and it ends with status cancelled; another process's run sees the "
        "request at its lease's next renewal. A run nobody runs (suspended, failed, or its process "
        "died) is ended now with status cancelled; so is a run without a lease (busy=None), which "
        "stops at its next checkpoint. A redelivery of it runs nothing (docs/messages.md).",
    )
    p.add_argument("thread", help="the thread's id")
    p.add_argument("run", nargs="?", default=None, help="the run's id (default: the thread's live or unfinished run)")
    p.add_argument("--namespace", default="", help="the thread's namespace (default: none)")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=_cancel)


def _cancel(ns: argparse.Namespace, out: Output) -> int:
    with open_store(resolve_url(ns.url)) as store:
        outcome = store.cancel(ns.thread, ns.run, namespace=ns.namespace)
    if out.as_json:
        out.value({"thread": ns.thread, "namespace": ns.namespace, "run": ns.run, "outcome": outcome})
    elif outcome == "requested":
        out.line(f"thread {ns.thread}: the live run was asked to stop; it ends, status cancelled, at its next step")
    else:
        out.line(f"thread {ns.thread}: the run was ended now, status cancelled (it was suspended, its process died, or "
                 "it runs without a lease, busy=None: then it stops at its next checkpoint)")
    return 0


def _abandon(ns: argparse.Namespace, out: Output) -> int:
    with open_store(resolve_url(ns.url)) as store:
        cp = store.abandon(ns.thread, ns.run, namespace=ns.namespace)
    if out.as_json:
        out.value({"thread": cp.thread_id, "namespace": cp.namespace, "run": cp.run_id,
                   "checkpoint": cp.checkpoint_id, "run_status": cp.run_status})
    else:
        out.line(f"run {cp.run_id} of thread {cp.thread_id} abandoned (checkpoint {cp.checkpoint_id}); "
                 "its committed steps stay, the thread's next turns go on")
    return 0


def _expiry(expires_at: float, now: float) -> str:
    left = expires_at - now
    when = datetime.fromtimestamp(expires_at, UTC).isoformat(timespec="seconds")
    return f"{when} (in {left:.0f} s)" if left > 0 else f"{when} (expired)"


def _leases(ns: argparse.Namespace, out: Output) -> int:
    with open_store(resolve_url(ns.url), display=True) as store:
        infos = [i for i in store.leases(prefix=ns.prefix) if i.held or i.reserved_for or not ns.held]
    now = time.time()
    if out.as_json:
        out.value([
            {"thread": i.thread_id, "namespace": i.namespace, "holder": i.holder if i.held else None,
             "token": i.token, "expires_at": i.expires_at, "waiting": list(i.waiting),
             "reserved_for": i.reserved_for}
            for i in infos
        ])
        return 0
    rows = [
        (i.thread_id, i.namespace or Shown("''"), i.holder if i.held else "-", i.token,
         _expiry(i.expires_at, now) if i.held else "-", i.reserved_for or "-", len(i.waiting))
        for i in infos
    ]
    heads = ("thread", "namespace", "holder", "token", "expires", "reserved_for", "waiting")
    widths = [max([len(cell(r[k])) for r in rows] + [len(h)]) for k, h in enumerate(heads[:-1])]
    out.table(heads, rows, widths=widths)
    return 0
