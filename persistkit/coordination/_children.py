"""Child runs: ``pk.start`` starts a run on another thread, the parent waits for its end.

The user functions (``pk.start``, ``handle.result``, ``pk.gather``, ``pk.run_child``) are
``engine/_children.py``: they find the run and the position in the engine's frame, and open
the child's ``pk.resume``. What they record, where the parent→child links live, how a child's
outcome is read and how a stop reaches every child is here (plans: no I/O).

**Starting is idempotent.** ``pk.start`` at position ``p`` of parent run ``R`` names the child's
run ``R:p@<d>`` (:func:`child_run_id`; ``d``: 12 hex digits of the parent's namespace and thread,
so that two parents of the same run id on different threads never name the same child) and,
unless given, its thread ``<parent thread>~<child run id>``: both are fixed by the parent's
record, never drawn at random (a replayed start takes them from its record, whatever persistkit
wrote it). It writes the link (below), records the
handle as the step ``pk.start`` at ``p``, then hands the child to the executor. A parent that
dies anywhere in between comes back to the same ``p`` and derives the same ids: a second
launch of ``R:p`` is a resume of the same run (the thread's lease lets one process run it; a
completed one replays, runs nothing), never a second child. On a resume the parent relaunches
a recorded child only when it is not finished and nobody holds its lease (:func:`needs_launch`:
its process died with the parent's, or the parent died before handing it over).

**Links.** Per parent thread one kv scope ``__pk_c.<digest>`` (as the inbox's ``__pk_i.``,
dropped with the thread by ``store.delete_thread``), one key per child:
``<digest(namespace, parent run, position)>`` → {``t`` child thread, ``r`` child run, ``n``
its namespace, ``a`` the agent's registered name, ``pr`` parent run, ``pn`` parent namespace,
``p`` position, ``c`` parent-close policy, ``s`` started at, ``x`` 1 once a stop was asked}.
``store.cancel`` (any process) and ``persistkit show`` find a run's children there.

**One parent thread per child thread.** A ``thread_id=`` named in ``pk.start`` is claimed for
the parent's thread (:func:`claim_plan`: key ``p.<digest(child namespace)>`` in the *child*
thread's own scope, so ``store.delete_thread`` of the child thread frees it): a start from
another parent thread is refused (``ConflictError``), so two supervisors never share a child
thread, whatever their run ids. Runs of the same parent thread (its next turns) may reuse it.
A named thread whose newest run is another, unfinished one that no live process holds
(:func:`blocked_plan`: it crashed, or it waits for an answer) is refused as well
(``ThreadBusyError``): the child would wait for it without bound.

**Outcome.** A child run is one step named ``pk.child`` at position ``0`` of its thread (the
agent's own steps nest under it): its record holds the agent's result or error. The parent's
``handle.result()`` takes a position (``pk.child.result``) and records the child's outcome
there, as ``pk.receive`` records a message: a resumed parent replays it and never reads again.
A child that is not finished is waited for in the process up to ``suspend_above`` seconds;
beyond, the parent suspends (a suspend record naming the child, ``q.ch``): ``store.pending()``
lists it (``kind == "child"``), ``store.due()`` once the child ended.

**Parent close.** ``on_parent_close="cancel"`` (default): when the parent run's end is final
(completed, cancelled, interrupted, rolled back, failed by ``run.abort()``; not suspended, not
crashed, not an ordinary failure its retry continues) its unfinished children are cancelled, and ``store.cancel`` of the parent reaches them (recursively: a child's
``store.cancel`` reaches its own). ``"abandon"``: the child is left to finish on its own.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import ConfigurationError, ConflictError, RunCancelledError, ThreadBusyError
from .._io import Plan, Sleep, call
from ..backends._protocol import KvEntry, KvOp
from ._lease import _State, unfinished_error
from ._suspend import SUSPENDED
from ._unfinished import ENDED

if TYPE_CHECKING:
    from ..codec._pipeline import Codec
    from ..state._records import Record

__all__ = [
    "CHILD",
    "DEFAULT_CHILD_SUSPEND_ABOVE",
    "POLICIES",
    "RESULT",
    "START",
    "Child",
    "ChildInfo",
    "blocked_plan",
    "child_run_id",
    "children_plan",
    "children_scope",
    "claim_plan",
    "link_plan",
    "mark_cancelled_plan",
    "needs_launch",
    "outcome_plan",
    "status_plan",
    "wait_plan",
]

#: The step names: the parent's start and result records, and the child's one top step.
START, RESULT, CHILD = "pk.start", "pk.child.result", "pk.child"
#: The metadata key ``pk.run_child`` stores with a child run's records (its parent's run id).
MARK = "pk.child"
#: ``on_parent_close=`` values.
POLICIES = ("cancel", "abandon")
#: ``handle.result()`` waits in the process for at most this many seconds; longer, the parent suspends.
DEFAULT_CHILD_SUSPEND_ABOVE = 60.0

_SCOPE = "__pk_c."
#: The key prefix of a child thread's claim (:func:`claim_plan`) in its own scope; link keys are hex.
_OWNER = "p."
_POLL_MIN, _POLL_MAX = 0.002, 0.05
#: Child statuses that are final (the outcome is known): a run's end statuses.
FINAL = ("completed", "failed", "compensated", *ENDED)


def _digest(*parts: str) -> str:
    return hashlib.blake2b(
        "\x00".join(parts).encode("utf-8", "surrogatepass"), digest_size=16
    ).hexdigest()


def children_scope(thread_id: str) -> str:
    """The kv scope of the links of ``thread_id``'s children (every namespace and run of it)."""
    return _SCOPE + _digest(thread_id)


def child_run_id(parent_run_id: str, position: str, parent_thread_id: str, parent_namespace: str) -> str:
    """The run id of the child started at ``position`` of ``parent_run_id`` on ``parent_thread_id``
    (``<parent run id>:<position>@<12 hex digits of the parent's namespace and thread>``): fixed,
    so a resumed parent names the same run and never starts a second one, and another parent's
    run of the same id (on another thread) names another one. Records written before the digest
    (``R:p``) keep their run id: a replayed start reads it from its record."""
    return f"{parent_run_id}:{position}@{_digest(parent_namespace, parent_thread_id)[:12]}"


@dataclass(frozen=True, slots=True)
class Child:
    """Who a child run is: its thread and run, the agent's registered name, and its parent."""

    thread_id: str
    run_id: str
    namespace: str
    agent: str
    parent_thread_id: str
    parent_run_id: str
    parent_namespace: str
    position: str
    on_parent_close: str
    #: The threads above the child, root first, as ``[namespace, thread]`` pairs (``an``).
    ancestors: tuple[tuple[str, str], ...] = ()
    #: ``pk.start(lease_ttl=)``: the child's lease TTL (``l``), None for the default.
    lease_ttl: float | None = None

    def tree(self) -> dict[str, Any]:
        """The record's (and the link's) form: short keys, plain strings."""
        extra: dict[str, Any] = {}
        if self.ancestors:
            extra["an"] = [list(a) for a in self.ancestors]
        if self.lease_ttl is not None:
            extra["l"] = self.lease_ttl
        return {**extra,
            "t": self.thread_id,
            "r": self.run_id,
            "n": self.namespace,
            "a": self.agent,
            "pt": self.parent_thread_id,
            "pr": self.parent_run_id,
            "pn": self.parent_namespace,
            "p": self.position,
            "c": self.on_parent_close,
        }

    @classmethod
    def of(cls, tree: Any, where: str) -> Child:
        try:
            return cls(
                str(tree["t"]),
                str(tree["r"]),
                str(tree["n"]),
                str(tree["a"]),
                str(tree["pt"]),
                str(tree["pr"]),
                str(tree["pn"]),
                str(tree["p"]),
                str(tree["c"]),
                tuple((str(a[0]), str(a[1])) for a in tree.get("an") or ()),
                None if tree.get("l") is None else float(tree["l"]),
            )
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            raise ConfigurationError(
                f"{where} is not a child handle persistkit recorded ({exc!r})"
            ) from None

    def spec(self, args: Any) -> dict[str, Any]:
        """What an executor gets: plain JSON data for ``pk.run_child(spec, store=...)`` in any
        process. ``args``: :func:`encode_args`'s tree (the store's codec: type-tagged JSON)."""
        spec = {
            "agent": self.agent,
            "args": args[0],
            "kwargs": args[1],
            "thread_id": self.thread_id,
            "run_id": self.run_id,
            "namespace": self.namespace,
            "on_parent_close": self.on_parent_close,
            "parent": {
                "thread_id": self.parent_thread_id,
                "run_id": self.parent_run_id,
                "namespace": self.parent_namespace,
                "position": self.position,
            },
            "ancestors": [list(a) for a in self.ancestors],
        }
        if self.lease_ttl is not None:
            spec["lease_ttl"] = self.lease_ttl
        return spec


def encode_args(codec: Codec, args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> list[Any]:
    """``[args, kwargs]`` as the store's codec encodes them (tuples, sets, bytes, datetimes keep
    their type across a JSON hop); an argument it cannot encode raises ``SerializationError``."""
    return [codec.encode(list(args), f"{what} args"), codec.encode(dict(kwargs), f"{what} kwargs")]


def decode_args(codec: Codec, spec: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    where = f"child run {spec.get('run_id')}"
    return list(codec.decode(spec["args"], f"{where} args")), dict(
        codec.decode(spec["kwargs"], f"{where} kwargs")
    )


@dataclass(frozen=True, slots=True)
class ChildInfo:
    """One child run as ``store.children()`` and ``persistkit show`` list it: who it is and its
    status (``pending``: not started yet; ``running``; ``suspended``; or its end status;
    ``cancelled`` too for one not started whose stop was asked: if it is delivered later, it
    runs nothing)."""

    child: Child
    status: str
    started_at: float
    cancel_asked: bool
    #: The child's arguments as the link keeps them (encoded), for :meth:`spec`.
    args: Any = None

    def spec(self) -> dict[str, Any]:
        """The spec ``pk.start`` gave the executor, rebuilt from the link: continue a child with
        ``pk.run_child(info.spec(), store=...)`` (a suspended child of a parent that ended, say)."""
        if self.args is None:
            raise ConfigurationError(
                f"child run {self.child.run_id}: its link keeps no arguments (it was started by an "
                "older persistkit); rebuild its spec from the arguments its parent passed to pk.start"
            )
        return self.child.spec(self.args)


def _link_key(child: Child) -> str:
    return _digest(child.parent_namespace, child.parent_run_id, child.position)


def link_plan(codec: Codec, child: Child, args: Any, named: bool = False, what: str = "pk.start") -> Plan[None]:
    """Write ``child``'s link under its parent's thread (once: a link written before stays),
    with its encoded arguments (``g``). A thread the caller ``named`` is first claimed for the
    parent's thread (:func:`claim_plan`) and refused while another run blocks it
    (:func:`blocked_plan`): both raise before anything of the child is written but the claim."""
    if named:
        yield from claim_plan(codec, child, what)
        blocked = yield from blocked_plan(codec, child)
        if blocked is not None:
            raise _blocked_error(child, blocked[0], blocked[1], what)
    scope, key = children_scope(child.parent_thread_id), _link_key(child)
    found: KvEntry | None = yield call("kv_get", scope, key)
    if found is not None and found.value is not None:
        return
    data = codec.pack_tree({**child.tree(), "g": args, "s": time.time()})
    try:
        yield call("kv_write", scope, [KvOp(key, 0, data)], keep=1)
    except ConflictError:  # another launcher of the same parent position wrote it first
        return


def claim_plan(codec: Codec, child: Child, what: str) -> Plan[None]:
    """Claim ``child``'s (named) thread for its parent's thread, or raise ``ConflictError`` when
    another parent thread claimed it: two parents sharing a child thread would share child runs
    (a run id names a run within its thread) and wait on each other's. Once per start; the
    claim stays with the child thread (``store.delete_thread`` of it drops it)."""
    scope, key = children_scope(child.thread_id), _OWNER + _digest(child.namespace)
    mine = (child.parent_namespace, child.parent_thread_id)
    while True:
        found: KvEntry | None = yield call("kv_get", scope, key)
        if found is not None and found.value is not None:
            tree = codec.unpack_tree(found.value, f"the parent claim of thread {child.thread_id!r}")
            theirs = (str(tree.get("pn")), str(tree.get("pt")))
            if theirs == mine:
                return
            where = f" (namespace {child.namespace!r})" if child.namespace else ""
            their_ns = f" (namespace {theirs[0]!r})" if theirs[0] != child.parent_namespace else ""
            raise ConflictError(
                f"{what}(thread_id={child.thread_id!r}){where}: that thread holds child runs of another "
                f"parent: thread {theirs[1]!r}{their_ns} started child run {tree.get('r')} "
                f"there, and this is run {child.parent_run_id} of thread {child.parent_thread_id!r}. A child "
                "thread belongs to one parent thread, so that two supervisors never share (and adopt) each "
                "other's child runs. Name a thread of this parent's own (one per parent: e.g. "
                f"'{child.parent_thread_id}/<role>'), leave thread_id out (default: '<parent thread>~<child "
                f"run id>'), or, if the other parent is gone, delete the old child thread first "
                f"(store.delete_thread({child.thread_id!r})). Nothing was recorded",
                thread_id=child.thread_id,
                namespace=child.namespace,
            )
        data = codec.pack_tree({"pn": mine[0], "pt": mine[1], "r": child.run_id, "s": time.time()})
        try:
            yield call("kv_write", scope, [KvOp(key, found.version if found else 0, data)], keep=1)
        except ConflictError:  # another parent's start claimed it first: look again
            continue
        return


def _blocked_error(child: Child, other: str, status: str, what: str) -> ThreadBusyError:
    return unfinished_error(
        child.thread_id,
        other,
        f"Its last record says {status}, and no live process holds the thread, so a child run started there by {what} (position "
        f"{child.position} of run {child.parent_run_id} of thread {child.parent_thread_id!r}) would wait "
        "for it without bound: nothing was recorded, retry once that run is continued or given up, or "
        "start the child on a thread of its own (leave thread_id out)",
    )


def blocked_plan(codec: Codec, child: Child) -> Plan[tuple[str, str] | None]:
    """``(run id, status)`` of the run that keeps ``child`` from ever opening its (named) thread:
    the thread's newest run is another one, unfinished (it crashed, or it is suspended), and no
    live process holds the thread's lease (one that does will end it, and the child waits in
    line); else None."""
    from ..state._records import Record

    found = yield call("head_row", child.thread_id, child.namespace)
    if found is None:
        return None
    head = Record.decode(codec, found[1])
    other = head.row.run_id
    if head.kind != "step" or not other or other == child.run_id or head.run_status not in (
        "running", SUSPENDED, "compensating"
    ):
        return None
    lease = yield call("lease_get", child.thread_id, child.namespace)
    if _State.load(lease).held(time.time()):
        return None
    return str(other), _status(head)


def _links(codec: Codec, parent_thread_id: str) -> Plan[list[tuple[KvEntry, dict[str, Any]]]]:
    page: list[KvEntry] = yield call("kv_list", children_scope(parent_thread_id), prefix="")
    out = []
    for e in page:
        if e.value is None or e.key.startswith(_OWNER):  # the thread's own parent claim, no link
            continue
        out.append(
            (e, codec.unpack_tree(e.value, f"child link {e.key} of thread {parent_thread_id!r}"))
        )
    return out


def mark_cancelled_plan(codec: Codec, child: Child) -> Plan[None]:
    """Set the link's ``x``: a child that has not taken its lease yet stops when it opens."""
    scope, key = children_scope(child.parent_thread_id), _link_key(child)
    while True:
        found: KvEntry | None = yield call("kv_get", scope, key)
        tree = (
            codec.unpack_tree(found.value, "child link")
            if found is not None and found.value
            else child.tree()
        )
        if tree.get("x"):
            return
        tree["x"] = 1
        tree.setdefault("s", time.time())
        try:
            yield call(
                "kv_write",
                scope,
                [KvOp(key, found.version if found else 0, codec.pack_tree(tree))],
                keep=1,
            )
        except ConflictError:
            continue
        return


def read_link_plan(codec: Codec, child: Child) -> Plan[dict[str, Any] | None]:
    """``child``'s link as its parent wrote it, or None (``pk.run_child`` looks, holding the lease:
    whether a stop was asked, ``x``, and what the parent started, ``a`` and ``g``)."""
    found: KvEntry | None = yield call(
        "kv_get", children_scope(child.parent_thread_id), _link_key(child)
    )
    if found is None or found.value is None:
        return None
    tree: dict[str, Any] = codec.unpack_tree(found.value, "child link")
    return tree


def cancel_asked_plan(codec: Codec, child: Child) -> Plan[bool]:
    """Whether a stop was asked of ``child`` through its link."""
    tree = yield from read_link_plan(codec, child)
    return bool(tree and tree.get("x"))


def _newest(codec: Codec, child: Child) -> Plan[Record | None]:
    from ..state._records import Record

    rows = yield call("list", child.thread_id, child.namespace, run_id=child.run_id, limit=1)
    return Record.decode(codec, rows[0]) if rows else None


def status_plan(codec: Codec, child: Child) -> Plan[str]:
    """The child run's status: ``pending`` (not started: nothing recorded, nobody holds its lease),
    ``running``, ``suspended`` or its end status."""
    rec = yield from _newest(codec, child)
    if rec is None:  # it may be in its first step already: a live holder of its thread's lease
        lease = yield call("lease_get", child.thread_id, child.namespace)
        return "running" if _State.load(lease).held(time.time()) else "pending"
    return _status(rec)


def _status(rec: Record | None) -> str:
    if rec is None:
        return "pending"
    if rec.kind == "end":
        return str(rec.run_status)
    return SUSPENDED if rec.body.get("s") == SUSPENDED else "running"


def needs_launch(codec: Codec, child: Child) -> Plan[bool]:
    """Whether a resumed parent must hand ``child`` to its executor again: it is not finished and
    no live process holds its thread's lease (it died with the parent, or was never launched)."""
    newest = yield from _newest(codec, child)
    status = "pending" if newest is None else _status(newest)
    if status in FINAL or (status == SUSPENDED and not _wait_over(newest)):
        return False  # a suspended child is handed over again once its own wait ended
    rec = yield call("lease_get", child.thread_id, child.namespace)
    return not _State.load(rec).held(time.time())


class _Outcome:
    __slots__ = ("error", "value")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error


#: What :func:`outcome_plan` returns while the child is not finished.
NOT_YET: Any = None


def outcome_plan(codec: Codec, child: Child) -> Plan[_Outcome | None]:
    """The child's result or error once it finished, else None."""
    from ..state._records import read_rows

    newest = yield from _newest(codec, child)
    status = _status(newest)
    if status not in FINAL:
        return None
    where = f"child run {child.run_id} of thread {child.thread_id!r}"
    if status in ENDED:
        return _Outcome(
            error=RunCancelledError(
                f"{where} (started at position {child.position} of run {child.parent_run_id}) ended {status}: "
                "it has no result. Its committed steps stay in its thread (`persistkit show`)",
                thread_id=child.thread_id,
                run_id=child.run_id,
                status=status,
            )
        )
    rows = yield from read_rows(codec, child.thread_id, child.namespace, child.run_id)
    top = next(
        (
            r
            for r in reversed(rows)
            if r.kind == "step" and r.body.get("p") == "0" and r.body.get("n") == CHILD
        ),
        None,
    )
    if top is None:
        return _Outcome(
            error=RunCancelledError(
                f"{where} ended {status} before its agent returned (it recorded no {CHILD!r} step)",
                thread_id=child.thread_id,
                run_id=child.run_id,
                status=status,
            )
        )
    at = f"{where}: result of {child.agent}"
    if top.body.get("s") == "failed":
        return _Outcome(error=codec.decode_exception(top.body.get("e"), at))
    if "rb" in top.body:
        blobs = yield call("get_blobs", child.thread_id, [top.body["rb"]])
        return _Outcome(codec.decode(codec.unpack_tree(blobs[top.body["rb"]], at), at))
    return _Outcome(codec.decode(top.body.get("r"), at))


def wait_plan(codec: Codec, child: Child, until: float) -> Plan[_Outcome | None]:
    """:func:`outcome_plan`, polled (a few ms at first, then up to ``_POLL_MAX`` s apart) until
    ``until`` (epoch s); None if the child did not finish by then."""
    delay = _POLL_MIN
    while True:
        got = yield from outcome_plan(codec, child)
        if got is not None:
            return got
        left = until - time.time()
        if left <= 0:
            return None
        yield Sleep(min(delay, left))
        delay = min(delay * 1.5, _POLL_MAX)


def _wait_over(rec: Record | None) -> bool:
    """Whether a child's newest record ends a wait: an answer nobody resumed it with yet, or a
    suspension whose questions are answered or past their deadline (a ``pk.sleep`` timer due)."""
    from ._suspend import MISSING, is_answered, is_suspension, ready

    if rec is None:
        return False
    return is_answered(rec) or (is_suspension(rec) and ready(rec, time.time()) is not MISSING)


def done_plan(codec: Codec, rec: Record, depth: int = 0) -> Plan[bool]:
    """Whether suspend record ``rec`` waits on a child that has ended, or whose own wait ended
    (it was answered, its timer is due, or its own child ended: its parent's resume hands it
    over again), for ``store.due``."""
    from ._suspend import items

    qs = items(rec)
    tree = qs[0].get("ch") if qs else None
    if not isinstance(tree, dict):
        return False
    child = Child.of(tree, "a suspend record's child")
    newest = yield from _newest(codec, child)
    if newest is None:
        return False
    status = _status(newest)
    if status in FINAL or _wait_over(newest):
        return True
    if status == SUSPENDED and depth < 32:  # waiting on a child of its own: due when that one is
        below: bool = yield from done_plan(codec, newest, depth + 1)
        return below
    return False


def marked(rec: Record) -> bool:
    """Whether ``rec`` was written by a child run (``pk.run_child`` marks its records' metadata)."""
    m = rec.body.get("m")
    return isinstance(m, dict) and MARK in m


def children_plan(
    codec: Codec, thread_id: str, namespace: str | None, run_id: str | None
) -> Plan[list[ChildInfo]]:
    """The children started by runs of ``thread_id`` (of ``run_id`` only, when given), in start order."""
    links = yield from _links(codec, thread_id)
    out = []
    for _entry, tree in links:
        child = Child.of(tree, f"a child link of thread {thread_id!r}")
        if (namespace is not None and child.parent_namespace != namespace) or (
            run_id is not None and child.parent_run_id != run_id
        ):
            continue
        status = yield from status_plan(codec, child)
        if status == "pending" and tree.get("x"):  # never started, and it never will run anything
            status = "cancelled"
        out.append(
            ChildInfo(child, status, float(tree.get("s") or 0.0), bool(tree.get("x")), tree.get("g"))
        )
    out.sort(key=lambda c: (c.started_at, c.child.position))
    return out


def to_stop(infos: list[ChildInfo], everyone: bool = False) -> list[Child]:
    """The children a parent's end (or its cancel) stops: unfinished, with policy ``cancel``."""
    return [
        i.child
        for i in infos
        if i.status not in FINAL and (everyone or i.child.on_parent_close == "cancel")
    ]


def check_policy(value: object, what: str) -> str:
    if value not in POLICIES:
        raise ConfigurationError(
            f"{what}(on_parent_close=) must be one of {', '.join(map(repr, POLICIES))} (cancel: the child is "
            f"cancelled when the parent run ends; abandon: it finishes on its own), got {value!r}"
        )
    return str(value)


Executor = Callable[[dict[str, Any]], Any]


def tree_plan(codec: Codec, thread_id: str, namespace: str | None, run_id: str | None = None, depth: int = 4
              ) -> Plan[list[dict[str, Any]]]:
    """The children of ``thread_id`` (of ``run_id``), each with its own children, ``depth`` levels
    down, as plain data: what ``persistkit show`` and the timeline draw."""
    infos = yield from children_plan(codec, thread_id, namespace, run_id)
    out = []
    for info in infos:
        c = info.child
        below: list[dict[str, Any]] = []
        if depth > 1:
            below = yield from tree_plan(codec, c.thread_id, c.namespace, c.run_id, depth - 1)
        out.append({
            "thread_id": c.thread_id, "run_id": c.run_id, "namespace": c.namespace, "agent": c.agent,
            "parent_run_id": c.parent_run_id, "position": c.position, "on_parent_close": c.on_parent_close,
            "status": info.status, "cancel_asked": info.cancel_asked, "children": below,
        })
    return out
