"""Restoring a run's state: set ``run.state`` (in place) to the state committed with a
recorded step, migrated to the code's schema version and checked like every load.

Lists and dicts keep their identity (a caller holding ``run.state.messages`` sees the
restored items, and ``run.state.messages.append(step())`` appends to the restored list,
even when the list is a plain one the code set itself); a typed state's channels are validated; the records a run opens with
are checked once, before anything runs (:meth:`StateRestore._check_rows`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..state._records import Record
from ..state._spec import TrackedList
from ._fields import RunFields

if TYPE_CHECKING:

    pass


class StateRestore(RunFields):
    """Setting ``run.state`` to a recorded checkpoint's state (part of :class:`Run`)."""

    def _restore(self, rec: Record) -> None:
        """Set ``run.state`` (in place) to the state committed with ``rec``, migrated to the
        code's schema version and checked like every load (field names and list items of
        the run's records were checked when it opened: :meth:`_check_rows`)."""
        spec, state, loader = self.spec, self.state, self._loader
        schema = rec.schema
        current = spec.channels(state)
        if spec.cls is not None and schema != spec.schema:
            fresh = spec.build({n: loader.value(n, r, True, rec.live) for n, r in rec.refs.items()}, schema, self._where(rec))
            for name, migrated in spec.channels(fresh).items():  # every field: a migration may add some
                self._set(current, name, migrated)
            return
        typed = spec.cls is not None
        for name, ref in rec.refs.items():
            live = current.get(name)
            if "l" in ref:
                if isinstance(live, TrackedList):
                    self._tracker.detach(name)
                    live._pk_reset(loader.list_items(name, ref))
                    continue
                if type(live) is list:  # a plain list the code put there (e.g. by setdefault)
                    live[:] = loader.list_items(name, ref)
                    continue
                value: Any = TrackedList(loader.list_items(name, ref))
            else:
                value = loader.value(name, ref, live=rec.live)
                if typed:
                    value = spec.check_value(name, value, schema, lambda: self._where(rec))
            self._set(current, name, value)
        if spec.cls is None:
            for name in [n for n in current if n not in rec.refs]:
                spec.del_channel(state, name)

    def _where(self, rec: Record) -> str:
        return f"thread {self.thread_id!r} checkpoint {rec.id} (step {rec.body.get('n')!r} at {rec.body.get('p')})"

    def _set(self, current: dict[str, Any], name: str, value: Any) -> None:
        """Set one channel of the live state, keeping the identity of its list or dict."""
        live = current.get(name)
        if isinstance(live, TrackedList) and isinstance(value, list):
            self._tracker.detach(name)
            live._pk_reset(value)
        elif type(live) is list and isinstance(value, list):
            live[:] = value
        elif isinstance(live, dict) and isinstance(value, dict) and type(live) is type(value):
            live.clear()
            live.update(value)
        else:
            self.spec.set_channel(self.state, name, value)

    def _check_rows(self, base: Record | None, rows: list[Record]) -> None:
        """Refuse, before anything runs, records of this run at the code's schema version
        that hold a field the class does not declare or list items that do not validate.

        Each list chain (channel, generation) only grows by appending, so its items are
        validated once, in one call, from where the base state (validated whole) ends."""
        spec = self.spec
        if spec.cls is None:
            return
        done: dict[tuple[str, int], int] = {}
        if base is not None and base.schema == spec.schema:
            done = {(n, r["g"]): r["n"] for n, r in base.refs.items() if "l" in r}
        longest: dict[tuple[str, int], tuple[Record, dict[str, Any]]] = {}
        fields, code_schema = spec.field_set, spec.schema
        for rec in rows:
            refs = rec.refs
            if rec.schema != code_schema:
                continue  # migrated and validated whole when replayed
            if not fields.issuperset(refs):
                spec.check_names(refs, code_schema, self._where(rec))
            for name, ref in refs.items():
                if "l" in ref:
                    best = longest.get((name, ref["g"]))
                    if best is None or ref["n"] > best[1]["n"]:
                        longest[(name, ref["g"])] = (rec, ref)
        for (name, gen), (rec, ref) in longest.items():
            if ref["n"] > done.get((name, gen), 0):
                items = self._loader.list_items(name, ref)
                spec.check_items(name, items, done.get((name, gen), 0), rec.schema, self._where(rec))
