"""Verbs that read or delete threads: ``threads``, ``history``, ``state``, ``delete``."""

from __future__ import annotations

import argparse
from typing import Any

from .._errors import NotFoundError
from .._ids import is_checkpoint_id
from ..backends import mask_url
from ..engine._store import check_thread_id
from ..state._records import ResumeInfo
from ._open import namespaces, open_store, require_thread, resolve_url, split_url, thread_not_found
from ._output import Output, Shown, cell

__all__ = ["add_parsers", "resumed_json"]

_RUN_SCAN = 10_000  # checkpoints read per thread to match a run id given cut short

_URL_NOTE = (
    "The store is --url, else $PERSISTKIT_URL, else sqlite:///.persistkit/persistkit.db; "
    "a store URL given as the first argument is accepted too."
)


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    t = sub.add_parser("threads", parents=[common], help="list thread ids and their namespaces",
                       description="List the store's thread ids, ascending, one a line; a thread stored "
                       "under other namespaces than the default one ('') lists them after its id "
                       "(LangGraph threads: 'lg:…'; read them with --namespace). " + _URL_NOTE)
    t.add_argument("legacy_url", nargs="?", help=argparse.SUPPRESS)
    t.add_argument("--prefix", default="", help="only ids starting with this")
    t.add_argument("--limit", type=_positive, help="at most this many")
    t.add_argument("--json", action="store_true", help="print JSON instead of a table")
    t.set_defaults(func=_threads)

    h = sub.add_parser("history", parents=[common], help="checkpoints of one or more threads, newest first",
                       description="Checkpoints of each THREAD, newest first. " + _URL_NOTE)
    h.add_argument("threads", nargs="+", metavar="THREAD", help="thread id(s)")
    h.add_argument("--namespace", default="", help="the threads' namespace (see `persistkit threads`)")
    h.add_argument("--limit", type=_positive, help="at most this many checkpoints per thread")
    h.add_argument("--run", metavar="RUN_ID", help="only this run's checkpoints")
    h.add_argument("--json", action="store_true", help="print JSON instead of a table")
    h.set_defaults(func=_history)

    s = sub.add_parser("state", parents=[common], help="a thread's state as JSON (head or --checkpoint)",
                       description="A thread's state as plain JSON, at its head or at --checkpoint. "
                       "Secrets show as their handles. " + _URL_NOTE)
    s.add_argument("thread", metavar="THREAD", help="the thread id")
    # A legacy leading URL, or a mistake; default=[] keeps argparse from listing it as required.
    s.add_argument("extra", nargs="*", default=[], help=argparse.SUPPRESS)
    s.add_argument("--checkpoint", metavar="ID", help="a checkpoint id from `persistkit history`")
    s.add_argument("--namespace", default="", help="the thread's namespace (see `persistkit threads`)")
    s.add_argument("--json", action="store_true", help="print JSON (the state is always printed as JSON)")
    s.set_defaults(func=_state)

    d = sub.add_parser("delete", parents=[common], help="delete threads and all their data",
                       description="Delete each THREAD (every namespace, every value). " + _URL_NOTE)
    d.add_argument("threads", nargs="+", metavar="THREAD", help="thread id(s)")
    d.add_argument("--json", action="store_true", help='print [{"thread": ..., "deleted": true}, ...]')
    d.set_defaults(func=_delete)


def _threads(ns: argparse.Namespace, out: Output) -> int:
    """One id a line (as scripts expect), followed by its namespaces when it has
    any but the default one; ``--json``: ``[{"thread": id, "namespaces": [...]}]``."""
    with open_store(resolve_url(ns.url or ns.legacy_url), display=True) as store:
        rows: list[tuple[str, Any]] = []
        for tid in store.threads(prefix=ns.prefix, limit=ns.limit):
            spaces = namespaces(store, tid)
            if out.as_json:
                rows.append((tid, spaces))
            else:
                shown = "" if spaces in ([""], None) else "namespaces: " + ", ".join(map(repr, spaces or []))
                rows.append((tid, Shown(shown)))
    out.table(("thread", "namespaces"), rows, widths=(max([len(cell(r[0])) for r in rows] + [6]),), header=False,
              keep=(0,))
    return 0


def _thread_args(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[str, list[str]]:
    url, threads = split_url(ns.threads if "threads" in ns else [ns.thread, *ns.extra])
    if not threads:
        parser.error("give at least one THREAD id (the store URL goes in --url)")
    return resolve_url(ns.url or url), threads


def _history(ns: argparse.Namespace, out: Output) -> int:
    url, threads = _thread_args(ns, ns.parser)
    with open_store(url, display=True) as store:
        rows: list[tuple[Any, ...]] = []
        for tid in threads:
            require_thread(store, tid, ns.namespace)
        if ns.run is not None and not any(
            store.history(tid, limit=1, run_id=ns.run, namespace=ns.namespace) for tid in threads
        ):
            raise run_not_found(store, threads, ns.run, ns.namespace)
        for tid in threads:
            for cp in store.history(tid, limit=ns.limit, run_id=ns.run, namespace=ns.namespace):
                created = cp.created_at.isoformat(timespec="milliseconds")
                if out.as_json:
                    rows.append((tid, cp.checkpoint_id, cp.run_id, cp.kind, cp.position, cp.step,
                                 cp.status, cp.run_status, created, resumed_json(cp.resumed)))
                    continue
                rows.append((tid, cp.checkpoint_id, (cp.run_id or "")[:12], cp.kind, cp.position,
                             _tail(cp.step or "", 24), cp.status, cp.run_status, created))
                if cp.resumed is not None:  # newest first: the resume came before this checkpoint
                    rows.append(_resumed_row(tid, cp.run_id, cp.resumed))
    columns: tuple[str, ...] = ("thread", "checkpoint", "run", "kind", "pos", "step", "status", "run status", "created")
    widths: tuple[int, ...] = (max(len(cell(t)) for t in threads), 24, 12, 6, 7, 24, 9, 10)
    if len(threads) == 1 and not out.as_json:  # one thread: no thread column
        columns, widths, rows = columns[1:], widths[1:], [r[1:] for r in rows]
    # --json: pk.Checkpoint's field names, as `show --json` and the Python API name them
    keys: tuple[str, ...] = (
        "thread_id", "checkpoint_id", "run_id", "kind", "position", "step", "status", "run_status", "created_at",
    )
    keys = keys[len(keys) - len(columns):]
    if out.as_json:
        columns, keys = (*columns, "resumed"), (*keys, "resumed")
    out.table(columns, rows, widths=widths, keep=(columns.index("checkpoint"),), keys=keys)  # ids for show, diff, fork
    return 0


def _resumed_row(tid: str, run_id: str | None, r: ResumeInfo) -> tuple[Any, ...]:
    """The table's line for a block that continued an unfinished run (``Checkpoint.resumed``):
    kind ``resumed``, where (host:pid) and how many steps it replayed, and how the run had
    stopped (``died``: its process was seen gone; ``expired``: its lease ran out; else ``stopped``)."""
    how = "stopped" if r.took_over is None else "died" if r.holder_gone else "expired"
    return (tid, "", (run_id or "")[:12], "resumed", "", _tail(f"{r.replayed} replayed in {r.host}", 24), how, "",
            r.at.isoformat(timespec="milliseconds"))


def resumed_json(r: ResumeInfo | None) -> dict[str, Any] | None:
    if r is None:
        return None
    return {"host": r.host, "at": r.at.isoformat(timespec="milliseconds"), "replayed": r.replayed,
            "after": r.after, "took_over": r.took_over, "holder_gone": r.holder_gone}


def _tail(text: str, width: int) -> str:
    """The end of a long step name (its own name, after the module path), marked as cut."""
    return text if len(text) <= width else "…" + text[-(width - 1):]


def run_not_found(store: Any, threads: list[str], run_id: str, namespace: str) -> NotFoundError:
    """The error for ``history --run`` of a run none of ``threads`` has; a run id the
    table showed cut short (its first 12 characters) is matched to the whole one."""
    where = f" in namespace {namespace!r}" if namespace else ""
    which = f"thread {threads[0]!r}" if len(threads) == 1 else "threads " + ", ".join(map(repr, threads))
    hint = f"List its runs with `persistkit history {cell(threads[0])}` (--json shows whole run ids)"
    whole = sorted({
        cp.run_id for tid in threads for cp in store.history(tid, namespace=namespace, limit=_RUN_SCAN)
        if cp.run_id and cp.run_id.startswith(run_id)
    })
    if whole:
        hint = f"The table shows run ids cut to 12 characters; the whole id is {whole[0]!r}: pass --run {whole[0]}"
        if len(whole) > 1:
            hint = f"The table shows run ids cut to 12 characters; it starts {len(whole)} runs: {', '.join(whole)}"
    return NotFoundError(f"run {run_id!r} not found on {which}{where} in the store at {mask_url(store.url)}. {hint}")


def _state(ns: argparse.Namespace, out: Output) -> int:
    url, threads = _thread_args(ns, ns.parser)
    if len(threads) > 1:
        extra = threads[1]
        hint = (f"{extra!r} is a checkpoint id: use --checkpoint {extra}" if is_checkpoint_id(extra)
                else f"got {len(threads)}: {' '.join(threads)}")
        ns.parser.error(f"state shows ONE thread; {hint}")
    with open_store(url, display=True) as store:
        require_thread(store, threads[0], ns.namespace)
        out.value(store.get_state(threads[0], ns.checkpoint, namespace=ns.namespace))
    return 0


def _delete(ns: argparse.Namespace, out: Output) -> int:
    url, threads = _thread_args(ns, ns.parser)
    with open_store(url) as store:
        for tid in threads:  # all or none: check every id before deleting any
            if namespaces(store, check_thread_id(tid)) == []:
                raise thread_not_found(store, tid)
        for tid in threads:
            if not store.delete_thread(tid):
                raise thread_not_found(store, tid)
            if not out.as_json:
                out.line(f"deleted {cell(tid)}" if len(threads) > 1 else "deleted")
    if out.as_json:
        out.value([{"thread": tid, "deleted": True} for tid in threads])
    return 0


def _positive(text: str) -> int:
    """``--limit``: a whole number >= 1 (a usage error otherwise, exit 2)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= 1")
    return int(text)
