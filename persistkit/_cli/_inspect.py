"""Verbs that look into one thread's checkpoints, or branch from one: ``show``, ``diff``, ``fork``.

``show`` and ``diff`` read with the display codec (``_open.plain``): stored values
as plain JSON, secrets as their handles, no class of the user's program needed.
``fork`` writes, and must write the state exactly as it is stored, classes and
handles included, in a process that has none of the agent's classes: it runs
``store.fork`` with :class:`_TreeCodec`, which hands the stored trees through
unrevived (``--update`` / ``--metadata`` values are encoded by the store's own
codec first).
"""

from __future__ import annotations

import argparse
import copy
import json
from typing import Any

from .._errors import ConfigurationError, NotFoundError
from ..backends import mask_url
from ..codec._pipeline import Codec
from ..codec._serde import Serializer
from ..engine._store import Store, check_thread_id
from ..ops._diff import ChannelDiff, format_path, state_diff
from ..secrets._redact import hold_text, scrub
from ._open import open_store, plain, require_thread, resolve_url
from ._output import Output, Shown, clip, dumps
from ._threads import resumed_json

__all__ = ["add_parsers"]

_URL_NOTE = "The store is --url, else $PERSISTKIT_URL, else sqlite:///.persistkit/persistkit.db."


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser(
        "show", parents=[common], help="one checkpoint: step, arguments digest, result, error, state",
        description="One checkpoint of THREAD (CHECKPOINT, default the head): kind, step name, position, "
        "status, run id, time, arguments digest, result, error, metadata and the state at it, as plain "
        "JSON. Secrets show as their handles. " + _URL_NOTE,
    )
    s.add_argument("thread", metavar="THREAD", help="the thread id")
    s.add_argument("checkpoint", metavar="CHECKPOINT", nargs="?", help="a checkpoint id (default: the head)")
    s.add_argument("--namespace", default="", help="the thread's namespace (see `persistkit threads`)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=_show)

    d = sub.add_parser(
        "diff", parents=[common], help="the state change between two checkpoints of a thread",
        description="How THREAD's state changed from checkpoint A to checkpoint B (default: the head): per "
        "channel added, removed or changed, with the path of each change inside it; items appended "
        "to a list show as appends ('+ [12] ...'). --json gives the same as data. " + _URL_NOTE,
    )
    d.add_argument("thread", metavar="THREAD", help="the thread id")
    d.add_argument("a", metavar="A", help="the older checkpoint id")
    d.add_argument("b", metavar="B", nargs="?", help="the newer checkpoint id (default: the head)")
    d.add_argument("--namespace", default="", help="the thread's namespace (see `persistkit threads`)")
    d.add_argument("--json", action="store_true", help="print the diff as JSON")
    d.set_defaults(func=_diff)

    f = sub.add_parser(
        "fork", parents=[common], help="start a new thread from a checkpoint of another",
        description="Start a new thread from THREAD's CHECKPOINT (default: its head), as store.fork does: "
        "the state is copied as stored (classes and secret handles as they are; the agent's code is "
        "not needed), --update applied through the reducers, and the new thread records where it "
        "came from. Refused when the new thread exists. " + _URL_NOTE,
    )
    f.add_argument("thread", metavar="THREAD", help="the thread to fork")
    f.add_argument("checkpoint", metavar="CHECKPOINT", nargs="?", help="a checkpoint id (default: the head)")
    f.add_argument("--to", metavar="NEW_THREAD", help="the new thread's id (default: THREAD~<random>)")
    f.add_argument("--update", metavar="JSON", help='channels to change, a JSON object: \'{"draft": null}\'')
    f.add_argument("--metadata", metavar="JSON", help="metadata of the fork's checkpoint, a JSON object")
    f.add_argument("--namespace", default="", help="the thread's namespace (the fork gets the same)")
    f.add_argument("--json", action="store_true", help="print the new checkpoint as JSON")
    f.set_defaults(func=_fork)


# -- show ---------------------------------------------------------------------------------


def _checkpoint_not_found(store: Store, thread_id: str, checkpoint_id: str, namespace: str) -> NotFoundError:
    where = f" in namespace {namespace!r}" if namespace else ""
    return NotFoundError(
        f"thread {thread_id!r}{where} has no checkpoint {checkpoint_id!r} in the store at {mask_url(store.url)}. "
        f"List its checkpoints with `persistkit history {thread_id}`"
    )


def _record(store: Store, thread_id: str, checkpoint_id: str | None, namespace: str) -> Any:
    try:
        return store.run_sync(store.read_record(thread_id, namespace, checkpoint_id))
    except NotFoundError:
        if checkpoint_id is None:
            raise
        raise _checkpoint_not_found(store, thread_id, checkpoint_id, namespace) from None


def _result(store: Store, rec: Any) -> Any:
    """The recorded result as plain JSON: inline (``r``) or in its blob (``rb``)."""
    body = rec.body
    if "r" in body:
        return plain(body["r"])
    key = body.get("rb")
    if not isinstance(key, str):
        return None
    blob = store.backend.get_blobs(rec.row.thread_id, [key]).get(key)
    if blob is None:
        raise NotFoundError(f"checkpoint {rec.id}: its result blob {key!r} is missing from the store")
    return plain(Codec.load_tree(store.codec.open(blob, f"result {key}"), f"result {key}"))


_QUESTION_KEYS = {"i": "id", "v": "payload", "d": "deadline", "df": "default", "ty": "answer_type", "w": "timer",
                  "a": "answer"}


def _question(q: Any) -> Any:
    """A suspend record's question (or questions), its stored short keys spelled out."""
    if isinstance(q, list):
        return [_question(x) for x in q]
    return {_QUESTION_KEYS.get(k, k): plain(v) for k, v in q.items()} if isinstance(q, dict) else plain(q)


def _show(ns: argparse.Namespace, out: Output) -> int:
    with open_store(resolve_url(ns.url), display=True) as store:
        require_thread(store, ns.thread, ns.namespace)
        rec = _record(store, ns.thread, ns.checkpoint, ns.namespace)
        cp = rec.public(store.codec)
        data: dict[str, Any] = {
            # pk.Checkpoint's field names (`history --json` uses the same)
            "thread_id": cp.thread_id, "namespace": cp.namespace, "checkpoint_id": cp.checkpoint_id,
            "parent_id": cp.parent_id, "run_id": cp.run_id, "run_status": cp.run_status, "kind": cp.kind,
            "step": cp.step, "position": cp.position, "status": cp.status,
            "created_at": cp.created_at.isoformat(timespec="milliseconds"),
            "args_digest": rec.body.get("a"), "result": _result(store, rec),
            "error": None if cp.error is None else scrub(cp.error),
            "metadata": cp.metadata,
            "forked_from": None if cp.forked_from is None else _source(*cp.forked_from),
            # a block that continued the unfinished run wrote this checkpoint first (`history` too)
            "resumed": resumed_json(cp.resumed),
            # a suspended step's question(s), as stored (payload, deadline, answer so far)
            "question": _question(rec.body["q"]) if "q" in rec.body else None,
            "state": store.get_state(ns.thread, rec.id, namespace=ns.namespace),
            # the child runs this checkpoint's run started (pk.start), each with its own, and their status
            "children": _children(store, ns.thread, ns.namespace, cp.run_id),
        }
    if out.as_json:
        out.value(data)
        return 0
    shown = {k: v for k, v in data.items()
             if k not in ("state", "children") and (v is not None or k in ("result", "error")) and (k != "namespace" or v)}
    if "forked_from" in shown:
        shown["forked_from"] = f"{data['forked_from']['thread_id']} at {data['forked_from']['checkpoint_id']}"
    rows = [(_LABELS.get(k, k), v if isinstance(v, str) and k not in ("result", "error") else Shown(_compact(v)))
            for k, v in shown.items()]
    out.table(("field", "value"), rows, widths=(max(len(k) for k, _ in rows),), header=False)
    if data["children"]:
        out.line("children:")
        for line in _tree_lines(data["children"], "  "):
            out.line(line)
    out.line("state:")
    out.value(data["state"])
    return 0


def _children(store: Any, thread_id: str, namespace: str, run_id: str | None) -> list[dict[str, Any]]:
    """The run's child runs as a tree (``coordination/_children``); none without a run or a kv space."""
    from ..backends._capabilities import has
    from ..coordination._children import tree_plan

    if not run_id or not has(store.backend, "kv"):
        return []
    tree: list[dict[str, Any]] = store.run_sync(tree_plan(store.codec, thread_id, namespace, run_id))
    return tree


def _tree_lines(kids: list[dict[str, Any]], indent: str) -> list[str]:
    """``persistkit show``'s children: one line each, its own children indented under it."""
    lines = []
    for k in kids:
        lines.append(f"{indent}{k['position']}: {k['agent']} on thread {k['thread_id']} (run {k['run_id']}): {k['status']}")
        lines.extend(_tree_lines(k["children"], indent + "  "))
    return lines


#: The table's shorter labels of ``show``'s fields (for people; --json keeps the API's names).
_LABELS = {"thread_id": "thread", "checkpoint_id": "checkpoint", "parent_id": "parent", "run_id": "run",
           "created_at": "created"}


def _source(thread_id: str, checkpoint_id: str) -> dict[str, str]:
    return {"thread_id": thread_id, "checkpoint_id": checkpoint_id}


def _compact(value: Any) -> str:
    return "-" if value is None else dumps(value, indent=None)


# -- diff ---------------------------------------------------------------------------------


def _diff(ns: argparse.Namespace, out: Output) -> int:
    with open_store(resolve_url(ns.url), display=True) as store:
        require_thread(store, ns.thread, ns.namespace)
        a = _record(store, ns.thread, ns.a, ns.namespace)
        b = _record(store, ns.thread, ns.b, ns.namespace)
        old = store.get_state(ns.thread, a.id, namespace=ns.namespace)
        new = store.get_state(ns.thread, b.id, namespace=ns.namespace)
        heads = [_label(rec.public(store.codec)) for rec in (a, b)]
    channels = state_diff(old, new)
    if out.as_json:
        out.value({"thread": ns.thread, "namespace": ns.namespace, "from": a.id, "to": b.id,
                   "channels": [c.as_json() for c in channels]})
        return 0
    width = out.width
    out.line(f"--- {a.id} {heads[0]}")
    out.line(f"+++ {b.id} {heads[1]}")
    if not channels:
        out.line("no differences")
    for line in _diff_lines(channels):
        out.line(line if width is None else clip(line, width))
    return 0


def _label(cp: Any) -> str:
    if cp.kind == "step":
        return f"(step {cp.step} at {cp.position}, {cp.status})"
    return f"({cp.kind}" + (f", run {cp.run_status}" if cp.run_status else "") + ")"


def _diff_lines(channels: list[ChannelDiff]) -> list[str]:
    """The diff for people: a line per channel, an indented line per change."""
    lines: list[str] = []
    marks = {"add": "+", "append": "+", "remove": "-", "change": "~"}
    for ch in channels:
        lines.append(f"{_name(ch.channel)}: {ch.status}")
        for c in ch.changes:
            where = format_path(c.path)
            where = (where + " ") if where else ""
            if c.op == "change":
                what = f"{_compact_json(c.old)} -> {_compact_json(c.new)}"
            else:
                what = _compact_json(c.new if c.op in ("add", "append") else c.old)
            lines.append(f"  {marks[c.op]} {where}{what}")
    return lines


def _name(channel: str) -> str:
    return channel if channel.isprintable() and channel.strip() == channel and channel else repr(channel)


def _compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


# -- fork ---------------------------------------------------------------------------------


def _held(tree: Any) -> Any:
    """A stored tree with its handles held (written back as the same handles) and the
    stored escape of a literal ``$CRED{`` undone (it is escaped again when written)."""
    t = type(tree)
    if t is str:
        return hold_text(tree)
    if t is list:
        return [_held(v) for v in tree]
    if t is dict:
        return {hold_text(k): _held(v) for k, v in tree.items()}
    return tree


class _TreeSerializer(Serializer):
    """Hands stored trees through: what it encodes is a tree already, what it decodes stays one."""

    def encode(self, value: Any, *, path: str = "value") -> Any:
        return value

    def decode(self, tree: Any, *, path: str = "value", plain: bool = False) -> Any:
        return _held(tree)


class _TreeCodec(Codec):
    """The store's codec (compression, redaction, its handle key) over stored trees, not values:
    a fork made by it writes the state exactly as it was stored, without reviving a class."""

    @classmethod
    def like(cls, codec: Codec) -> _TreeCodec:
        serializer = copy.copy(codec.serializer)
        serializer.__class__ = _TreeSerializer
        return cls(serializer, compress_threshold=codec.compress_threshold,
                   compress_level=codec.compress_level, redactor=codec.redactor)

    def encode(self, value: Any, path: str = "value") -> Any:
        return value

    def decode(
        self, tree: Any, path: str = "value", *, reveal: bool | None = None, plain: bool = False, live: bool = False
    ) -> Any:
        return _held(tree)  # a stored tree handed through (its encode is the identity): never a live one


def _json_object(text: str | None, flag: str) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"{flag} is not JSON ({exc}): give an object, e.g. '{{\"draft\": null}}'") from exc
    if not isinstance(value, dict):
        raise ConfigurationError(f"{flag} must be a JSON object (channel names to values), got {type(value).__name__}")
    return value


def _fork(ns: argparse.Namespace, out: Output) -> int:
    if ns.to is not None:
        try:
            check_thread_id(ns.to, "--to")
        except ConfigurationError as exc:
            ns.parser.error(scrub(str(exc)))
    update = _json_object(ns.update, "--update")
    metadata = _json_object(ns.metadata, "--metadata")
    with open_store(resolve_url(ns.url)) as store:
        require_thread(store, ns.thread, ns.namespace)
        if ns.checkpoint is not None:
            _record(store, ns.thread, ns.checkpoint, ns.namespace)  # a clear not-found first
        at = store.get_checkpoint(ns.thread, ns.checkpoint, namespace=ns.namespace)
        unknown = sorted(set(update or ()) - set(at.channels))
        if unknown and at.schema is not None:  # a pk.State class: its fields are all there is
            ns.parser.error(
                f"--update {', '.join(unknown)}: the state of thread {ns.thread!r} is the class "
                f"{at.schema[0]!r}, which has no such field (its fields: {', '.join(at.channels)}); "
                "the fork could not be resumed"
            )
        own = store.codec
        trees = None if update is None else {k: own.encode(v, f"update.{k}") for k, v in update.items()}
        meta = None if metadata is None else own.encode(metadata, "metadata")
        store.codec = _TreeCodec.like(own)
        cp = store.fork(ns.thread, ns.checkpoint, new_thread_id=ns.to, update=trees, metadata=meta,
                        namespace=ns.namespace)
    source = cp.forked_from or (ns.thread, "")
    if out.as_json:
        out.value({"thread_id": cp.thread_id, "namespace": cp.namespace, "checkpoint_id": cp.checkpoint_id,
                   "forked_from": _source(*source)})
    else:
        out.line(f"forked {source[0]} at {source[1]} into {cp.thread_id} (checkpoint {cp.checkpoint_id})")
    return 0
