"""LangGraph's ``prune`` and ``delete_for_runs`` on persistkit (``PersistkitSaver``).

Both delete through persistkit's retention (``store.prune``, the store's ``prune``
capability), which never deletes a namespace's head row, re-roots the lists a kept
checkpoint still reads and sweeps the values no kept checkpoint refers to. Each step
below is a plan (see ``_plans``) run by the saver's blocking or awaiting driver.

``prune(thread_ids, strategy="keep_latest")``
    The pending writes of every checkpoint that goes are emptied first (their values
    set to None, so the sweep takes them), then ``store.prune(Retention(keep_last=1),
    thread_id=...)`` keeps the newest record of each of the thread's namespaces: the
    latest checkpoint of each LangGraph namespace, its writes, the namespace list. A
    namespace whose latest turn was abandoned (``store.abandon``) keeps the checkpoint
    behind the abandon record too. ``strategy="delete"`` is ``delete_thread``.

``delete_for_runs(run_ids)``
    Scans every thread of the store. A thread whose checkpoints all belong to those
    runs is deleted (``delete_thread``). Otherwise, in each namespace holding some,
    the head cannot simply go (the store never deletes a head, and the next put
    compares against it), so the namespace is rewritten: a cut marker (``CUT_KEY``:
    the deleted runs; its state empties every channel) is written on top, then a copy
    of every kept checkpoint, oldest first, each with its own metadata and run id;
    then ``store.prune(Retention(keep_last=...), namespace=...)`` deletes everything
    below the marker. Readers never show a checkpoint of a deleted run below a marker,
    nor an original once its copy is written, so an interrupted call leaves the
    deleted runs hidden; calling ``delete_for_runs`` again finishes the work. The
    writes of deleted checkpoints are emptied and pruned the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import persistkit as pk

from ._plans import (
    _CP,
    CUT_KEY,
    RUN_DIGEST_KEY,
    Plan,
    _call,
    _wns,
    abandon_record,
    cut_marker,
    record_run,
    run_digest,
)

__all__ = ["PrunePlans", "check_run_ids", "check_strategy"]

STRATEGIES = ("keep_latest", "delete")

_PAGE = 200  # threads and history rows per page


def check_strategy(strategy: object) -> str:
    if strategy not in STRATEGIES:
        raise pk.ConfigurationError(
            f"prune(strategy={strategy!r}): give 'keep_latest' (keep the latest checkpoint of each "
            "namespace) or 'delete' (delete the threads)"
        )
    return str(strategy)


def check_ids(ids: object, what: str) -> list[str]:
    """``ids`` as a list of str (a bare str would be taken letter by letter)."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence | set | frozenset):
        raise pk.ConfigurationError(f"{what}: give a list of ids, not {ids!r}")
    out = [str(i) for i in ids]
    if any(not i for i in out):
        raise pk.ConfigurationError(f"{what}: an id is empty in {ids!r}")
    return out


def check_run_ids(run_ids: object) -> set[str]:
    return {run_digest(r) for r in check_ids(run_ids, "delete_for_runs(run_ids)")}


@dataclass
class _Chain:
    """One LangGraph namespace of a thread, as stored (``records`` newest first) and as seen."""

    ns: str
    records: list[pk.Checkpoint]
    visible: list[tuple[pk.Checkpoint, str | None]] = field(default_factory=list)  #: (record, run digest), chain order, oldest first
    pending: set[str] = field(default_factory=set)  #: runs of cut markers with rows still below them


def _busy(thread_id: str, report: Any) -> pk.ThreadBusyError:
    why = "; ".join(f"namespace {ns!r}: {reason}" for _, ns, reason in report.skipped)
    return pk.ThreadBusyError(
        f"LangGraph thread {thread_id!r} was not pruned: {why}. Prune it again once its turn has finished",
        thread_id=thread_id,
    )


class PrunePlans:
    """The plans of ``PersistkitSaver.prune`` and ``delete_for_runs`` (see the module docstring)."""

    store: pk.Store
    _pk_ids: dict[str, str]

    if TYPE_CHECKING:  # SaverPlans' own (both are bases of PersistkitSaver)

        def _namespaces(self, thread_id: str) -> Plan[list[str]]: ...

        def _writes(self, thread_id: str, ns: str, checkpoint_id: str) -> Plan[dict[str, Any]]: ...

        def _load_lg(self, stored: dict[str, Any]) -> dict[str, Any]: ...

        def _remember(self, cp: pk.Checkpoint) -> None: ...

    def _require_prune(self, what: str) -> None:
        if not getattr(self.store.backend, "supports_prune", False):
            raise pk.ConfigurationError(
                f"PersistkitSaver.{what} needs the store's prune capability, which "
                f"{type(self.store.backend).__name__} ({self.store.url}) does not have; "
                "delete whole threads with delete_thread, or use a store that has it (see docs/operations.md)"
            )

    # -- reading --------------------------------------------------------------------

    def _chain(self, thread_id: str, ns: str) -> Plan[_Chain]:
        records: list[pk.Checkpoint] = []
        before = None
        while True:
            page = yield _call("history", thread_id, limit=_PAGE, before=before, namespace=_CP + ns)
            records.extend(page)
            if len(page) < _PAGE:
                break
            before = page[-1].checkpoint_id
        chain = _Chain(ns, records)
        # a checkpoint's place is its original's (the oldest record of its id): an interrupted
        # rewrite left copies of some above originals of later checkpoints
        place = {cp.metadata["langgraph_id"]: i for i, cp in enumerate(records) if "langgraph_id" in cp.metadata}
        seen: set[str] = set()
        hidden: set[str] = set()
        for i, cp in enumerate(records):
            if cut_marker(cp):
                if i < len(records) - 1:  # rows below it are still to be deleted
                    chain.pending.update(cp.metadata[CUT_KEY])
                hidden.update(cp.metadata[CUT_KEY])
                continue
            if abandon_record(cp) or cp.metadata["langgraph_id"] in seen:
                continue
            seen.add(cp.metadata["langgraph_id"])
            lg = None if RUN_DIGEST_KEY in cp.metadata else self._load_lg(cp.metadata["langgraph"])
            run = record_run(cp, lg)
            if run is None or run not in hidden:
                chain.visible.append((cp, run))
        chain.visible.sort(key=lambda seen_cp: -place[seen_cp[0].metadata["langgraph_id"]])
        return chain

    def _chains(self, thread_id: str) -> Plan[list[_Chain]]:
        out = []
        for ns in (yield from self._namespaces(thread_id)):
            out.append((yield from self._chain(thread_id, ns)))
        return out

    # -- prune -------------------------------------------------------------------------

    def _prune_plan(self, thread_id: str, strategy: str) -> Plan[None]:
        if strategy == "delete":
            yield _call("delete_thread", thread_id)
            return
        chains = yield from self._chains(thread_id)
        if not chains:
            return
        keep: dict[str, int] = {}
        kept_writes: list[str] = []
        for chain in chains:
            head = chain.records[0] if chain.records else None
            abandoned = head is not None and abandon_record(head)
            keep[_CP + chain.ns] = 2 if abandoned and len(chain.records) > 1 else 1
            latest = chain.visible[-1][0].metadata["langgraph_id"] if chain.visible else None
            if latest is not None:
                kept_writes.append(_wns(chain.ns, latest))
            for cp in chain.records:
                lg_id = cp.metadata.get("langgraph_id")
                if lg_id is not None and lg_id != latest:
                    yield from self._empty_writes(thread_id, chain.ns, lg_id)
        if all(n == 1 for n in keep.values()):
            report = yield _call("prune", pk.Retention(keep_last=1), thread_id=thread_id)
            if report.skipped:
                raise _busy(thread_id, report)
            return
        # an abandoned turn keeps two records: each namespace on its own
        spaces = {"lg:n": 1, **keep, **dict.fromkeys(kept_writes, 1)}
        for chain in chains:
            for cp in chain.records:
                lg_id = cp.metadata.get("langgraph_id")
                if lg_id is not None:
                    spaces.setdefault(_wns(chain.ns, lg_id), 1)
        for space, n in spaces.items():
            report = yield _call("prune", pk.Retention(keep_last=n), thread_id=thread_id, namespace=space)
            if report.skipped:
                raise _busy(thread_id, report)

    def _empty_writes(self, thread_id: str, ns: str, lg_id: str) -> Plan[bool]:
        """Set the pending writes of one checkpoint to None (the sweep then takes their values);
        whether it had any."""
        current = yield from self._writes(thread_id, ns, lg_id)
        if not current:
            return False
        yield _call("update_state", thread_id, dict.fromkeys(current), namespace=_wns(ns, lg_id))
        return True

    # -- delete_for_runs ---------------------------------------------------------------

    def _threads(self) -> Plan[list[str]]:
        out: list[str] = []
        after = None
        while True:
            page = yield _call("threads", after=after, limit=_PAGE)
            out.extend(page)
            if len(page) < _PAGE:
                return out
            after = page[-1]

    def _delete_runs_plan(self, runs: set[str]) -> Plan[None]:
        for thread_id in (yield from self._threads()):
            chains = yield from self._chains(thread_id)
            touched = [c for c in chains if c.pending or any(r in runs for _, r in c.visible)]
            if not touched:
                continue
            if all(r in runs for c in chains for _, r in c.visible):
                yield _call("delete_thread", thread_id)  # nothing of the thread stays
                continue
            for chain in touched:
                if chain.records and abandon_record(chain.records[0]):
                    raise pk.ConfigurationError(
                        f"delete_for_runs: LangGraph thread {thread_id!r}"
                        f"{f' namespace {chain.ns!r}' if chain.ns else ''}: its latest turn was abandoned "
                        "(store.abandon), and deleting runs below it would rewrite the namespace over "
                        "that record. Run the thread's next turn first, or delete the whole thread "
                        "(delete_thread); nothing of this thread was changed"
                    )
            for chain in touched:
                yield from self._cut(thread_id, chain, runs)

    def _cut(self, thread_id: str, chain: _Chain, runs: set[str]) -> Plan[None]:
        """Rewrite one namespace without the runs ``runs`` (see the module docstring)."""
        space = _CP + chain.ns
        kept = [cp for cp, r in chain.visible if r not in runs]
        gone = {cp.metadata["langgraph_id"] for cp in chain.records if "langgraph_id" in cp.metadata}
        gone -= {cp.metadata["langgraph_id"] for cp in kept}
        head = chain.records[0]
        state = yield _call("get_state", thread_id, head.checkpoint_id, namespace=space)
        keys = set(state)
        hidden = sorted(chain.pending | {r for _, r in chain.visible if r in runs})
        marker = yield _call(
            "update_state", thread_id, dict.fromkeys(keys), metadata={CUT_KEY: hidden}, namespace=space,
            expected_head=head.checkpoint_id,
        )
        top = marker.checkpoint_id
        for cp in kept:
            values = yield _call("get_state", thread_id, cp.checkpoint_id, namespace=space)
            changes = {**dict.fromkeys(keys), **values}
            copy = yield _call(
                "update_state", thread_id, changes, metadata=cp.metadata, namespace=space, run_id=cp.run_id,
                expected_head=top,
            )
            self._remember(copy)
            top, keys = copy.checkpoint_id, set(values)
        count = 0  # the records from the head down to the marker (a turn may have written since)
        before = None
        while True:
            page = yield _call("history", thread_id, limit=_PAGE, before=before, namespace=space)
            ids = [cp.checkpoint_id for cp in page]
            if marker.checkpoint_id in ids:
                count += ids.index(marker.checkpoint_id) + 1
                break
            count += len(page)
            if len(page) < _PAGE:
                break
            before = page[-1].checkpoint_id
        report = yield _call("prune", pk.Retention(keep_last=count), thread_id=thread_id, namespace=space)
        if report.skipped:
            raise _busy(thread_id, report)
        for lg_id in sorted(gone):
            if (yield from self._empty_writes(thread_id, chain.ns, lg_id)):
                report = yield _call(
                    "prune", pk.Retention(keep_last=1), thread_id=thread_id, namespace=_wns(chain.ns, lg_id)
                )
                if report.skipped:
                    raise _busy(thread_id, report)
