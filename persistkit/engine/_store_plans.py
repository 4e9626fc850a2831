"""What a store's operations read and write, each written once as a plan (``_io``).

``Store``'s blocking and awaiting methods drive the same plan (``history`` and
``ahistory`` both run ``_history``), and the runtime reads through two of them:
``Run.open`` loads records and state with :meth:`StorePlans.read_record` and
:meth:`StorePlans.load_state`. A read for inspection (``get_state``) decodes without
resolving secret handles (``_inspecting``); ``fork`` and ``update_state`` write one
checkpoint with the head's compare-and-swap (``_write_state``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._errors import (
    ConfigurationError,
    ConflictError,
    IntegrityError,
    NotFoundError,
)
from .._ids import is_checkpoint_id
from .._io import Plan, call
from ..backends import Backend, Head
from ..codec._pipeline import Codec
from ..coordination._fence import write_call
from ..coordination._suspend import is_answered
from ..state._channels import Loader
from ..state._records import Checkpoint, Record, fork_key, fork_link_blob
from ..state._spec import StateSpec
from ..state._tracker import Tracker
from ._heads import ANY_HEAD, AnyHead, check_head

if TYPE_CHECKING:
    pass


class StorePlans:
    """The plans behind ``Store``'s methods (part of :class:`Store`)."""

    backend: Backend
    codec: Codec

    # -- plans shared by the public methods and the runtime ---------------------------

    def read_record(self, thread_id: str, namespace: str, checkpoint_id: str | None) -> Plan[Record]:
        if checkpoint_id is None:
            head = yield call("head", thread_id, namespace)
            if head is None:
                raise NotFoundError(f"thread {thread_id!r} has no checkpoints")
            checkpoint_id = head.checkpoint_id
        elif not is_checkpoint_id(checkpoint_id):
            raise NotFoundError(
                f"thread {thread_id!r} has no checkpoint {checkpoint_id!r} (not a checkpoint id)"
            )
        row = yield call("get", thread_id, namespace, checkpoint_id)
        if row is None:
            raise NotFoundError(f"thread {thread_id!r} has no checkpoint {checkpoint_id!r}")
        return Record.decode(self.codec, row)

    def load_state(
        self, rec: Record, spec: StateSpec, loader: Loader | None = None, *, plain: bool = False
    ) -> Plan[Any]:
        loader = loader or Loader(self.codec, rec.row.thread_id, rec.row.namespace)
        loader.add([rec])
        yield from loader.fetch([rec.refs])
        plain = plain or spec.plain(rec.schema)  # a migration may run: it gets nested values as dicts
        channels = {name: loader.value(name, ref, plain) for name, ref in rec.refs.items()}
        where = f"thread {rec.row.thread_id!r} checkpoint {rec.id}"
        return spec.build(channels, rec.schema, where)

    def _history(
        self,
        thread_id: str,
        namespace: str,
        limit: int | None,
        before: str | None,
        run_id: str | None,
        metadata: Mapping[str, Any] | None,
    ) -> Plan[list[Checkpoint]]:
        out: list[Checkpoint] = []
        page = limit if not metadata else max(limit or 0, 100)
        cursor = before
        while True:
            rows = yield call("list", thread_id, namespace, run_id=run_id, before=cursor, limit=page)
            for row in rows:
                cp = Record.decode(self.codec, row).public(self.codec)
                if metadata and any(cp.metadata.get(k, _MISSING) != v for k, v in metadata.items()):
                    continue
                out.append(cp)
                if limit is not None and len(out) >= limit:
                    return out
            if not rows or page is None or len(rows) < page:
                return out
            cursor = rows[-1].checkpoint_id

    def _get_state(
        self, thread_id: str, checkpoint_id: str | None, spec: StateSpec, namespace: str, plain: bool = False
    ) -> Plan[Any]:
        rec = yield from self.read_record(thread_id, namespace, checkpoint_id)
        # Inspection never needs a secret's value: handles stay handle text (a Secret field
        # stays a lazy Secret), so a thread can be read in a process that cannot resolve them.
        loader = Loader(self._inspecting(), thread_id, namespace)
        try:
            state = yield from self.load_state(rec, spec, loader, plain=plain)
        except IntegrityError:
            # A row its lists link to is missing: deleted by a prune running now, if the
            # checkpoint itself went meanwhile. Then it is not found, not damaged.
            if (yield call("get", thread_id, namespace, rec.id)) is None:
                raise NotFoundError(
                    f"thread {thread_id!r} has no checkpoint {rec.id!r} (deleted while it was read: retention)"
                ) from None
            raise
        return state

    def _inspecting(self) -> Codec:
        """The store's codec, decoding without resolving handles (see ``_get_state``)."""
        codec = self.__dict__.get("_inspect_codec")
        if codec is None:
            codec = copy.copy(self.codec)
            codec.reveal = False
            self.__dict__["_inspect_codec"] = codec
        return codec

    def _write_state(
        self,
        thread_id: str,
        namespace: str,
        state: Any,
        spec: StateSpec,
        body: dict[str, Any],
        parent: Record | None,
        expected: int,
        tracker: Tracker,
        run_id: str | None = None,
        extra_blobs: Mapping[str, bytes] | None = None,
    ) -> Plan[Checkpoint]:
        body = dict(body)
        where = (thread_id, namespace, parent.id if parent else None, run_id)
        row, diff = tracker.checkpoint(spec.channels(state), body, where, list(spec.schema) if spec.schema else None)
        blobs = {**diff.blobs, **extra_blobs} if extra_blobs else diff.blobs
        try:
            yield write_call(thread_id, namespace, row, blobs, expected)  # fenced under coordination.fenced
        except ConflictError as exc:
            if body["k"] == "fork":
                what = (
                    f"cannot fork into thread {thread_id!r}: another writer created it first, so "
                    "nothing was written. Fork again with another new_thread_id (or none, for a fresh one)"
                )
            else:
                what = (
                    f"thread {thread_id!r}: update_state wrote nothing: another writer moved the head "
                    f"from version {exc.expected} to {exc.found}"
                    + (f" (checkpoint {exc.found_checkpoint})" if exc.found_checkpoint else "")
                    + " after the state was read. Call update_state again: it applies the changes "
                    "to the new head"
                )
            raise ConflictError(
                what, thread_id=thread_id, namespace=namespace, expected=exc.expected,
                found=exc.found, found_checkpoint=exc.found_checkpoint,
            ) from exc
        return Record(row, body).public(self.codec)

    def _fork(
        self,
        thread_id: str,
        checkpoint_id: str | None,
        new_thread_id: str,
        update: Mapping[str, Any] | None,
        spec: StateSpec,
        namespace: str,
        metadata: Mapping[str, Any] | None,
    ) -> Plan[Checkpoint]:
        src = yield from self.read_record(thread_id, namespace, checkpoint_id)
        state = yield from self.load_state(src, spec)
        if spec.cls is None and src.schema is not None:
            spec.name, spec.version = src.schema  # dict view of typed state: keep its stamp
        if update:
            spec.update(state, dict(update))
        existing = yield call("head", new_thread_id, namespace)
        if existing is not None:
            raise ConfigurationError(
                f"cannot fork into thread {new_thread_id!r}: it already exists; pick a new id "
                "or leave new_thread_id out to get a fresh one"
            )
        body = {
            "k": "fork",
            "rs": None,
            "m": self.codec.encode(dict(metadata or {}), "metadata"),
            "f": [thread_id, src.id],
        }
        # the link is also the thread's (a blob, written in the same write): a prune of the
        # fork may take this first record, and the source must stay while the fork exists
        link = {fork_key(namespace): fork_link_blob(self.codec, (thread_id, src.id))}
        cp = yield from self._write_state(
            new_thread_id, namespace, state, spec, body, None, 0, Tracker(self.codec), extra_blobs=link
        )
        return cp

    def _update_state(
        self,
        thread_id: str,
        changes: Mapping[str, Any],
        spec: StateSpec,
        namespace: str,
        metadata: Mapping[str, Any] | None, expected_head: str | AnyHead | None = ANY_HEAD,
        run_id: str | None = None,
    ) -> Plan[Checkpoint]:
        head: Head | None = yield call("head", thread_id, namespace)
        check_head(thread_id, namespace, head, expected_head)
        tracker = Tracker(self.codec)
        if head is None:
            rec, state = None, spec.empty()
        else:
            rec = yield from self.read_record(thread_id, namespace, head.checkpoint_id)
            _refuse_waiting(thread_id, namespace, rec)
            loader = Loader(self.codec, thread_id, namespace)
            state = yield from self.load_state(rec, spec, loader)
            # a head of another schema version: lists are written anew (a chain holds one version)
            tracker.reset(rec.refs, loader, new_lists=spec.cls is not None and rec.schema != spec.schema)
        spec.update(state, dict(changes))
        body = {"k": "update", "rs": rec.run_status if rec else None,
                "m": self.codec.encode(dict(metadata or {}), "metadata")}
        cp = yield from self._write_state(
            thread_id, namespace, state, spec, body, rec, head.version if head else 0, tracker, run_id
        )
        return cp


_MISSING = object()

#: Run statuses of a head whose run waits to go on (docs/long-runs.md): an edit on top of it
#: would strand the run (its question, answer, timer or rollback is the head it replays to).
_WAITING = {"suspended": "is suspended (pk.suspend / pk.sleep): answer it, or let its timer come due, and resume it",
            "compensating": "is rolling back (its compensations are not all done): resume it to finish the rollback"}


def _refuse_waiting(thread_id: str, namespace: str, rec: Record) -> None:
    """``update_state`` on a thread whose newest run waits (suspended, answered and not resumed
    yet, or rolling back): refused, nothing written — the edit would become the head and the
    run could never go on (found from outside: the question, the answer or the rollback was lost)."""
    waiting = _WAITING.get(rec.run_status or "")
    if waiting is None and is_answered(rec):
        waiting = "was answered and waits for its resume: resume it first"
    if waiting is None or rec.kind != "step":
        return
    where = f"{thread_id!r}" + (f" (namespace {namespace!r})" if namespace else "")
    raise ConfigurationError(
        f"cannot update the state of thread {where} now: its run {rec.row.run_id} {waiting} "
        f"(pk.resume({thread_id!r}, run_id={rec.row.run_id!r})); an edit written on top of it would "
        "strand the run. Edit the state inside the run (run.update(...)) once it goes on, or give the "
        f"run up first: store.abandon({thread_id!r}, {rec.row.run_id!r}). Nothing was written"
    )
