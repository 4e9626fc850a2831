"""One copy of every store operation, driven by a blocking and an awaiting loop.

Operations on a store (resume, commit a step, history, fork, ...) are
written once as generators that yield :class:`Call` requests ("call the
backend's ``head``") and receive the results. :func:`run_sync` drives them
with a backend's sync methods, :func:`run_async` with its async twins —
the tenacity pattern: decision logic without I/O, two short loops.

Both loops retry :class:`~persistkit.BackendUnavailableError` with bounded
backoff. A ``write`` whose outcome is unknown (the connection died around
the commit) is resolved by reading the head before it is retried: if the
head is already our checkpoint the write happened; if it is still at the
version we wrote against, the write did not happen and is retried; if another
writer moved it, our row is looked up: found, the write happened (and the
other writer built on it), else that is a conflict and nothing was written.
"""

from __future__ import annotations

import random
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ._errors import BackendError, BackendUnavailableError, ConflictError, PersistkitError
from ._retry import testing_enabled
from .backends import Backend, CheckpointRow, Head

__all__ = ["Call", "Plan", "Sleep", "call", "call_async", "call_sync", "run_async", "run_sync"]

T = TypeVar("T")

#: Attempts for a transient backend failure before it is raised to the caller.
TRANSIENT_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sleep:
    """A plan's request to wait (lease plans poll): ``time.sleep`` or ``asyncio.sleep``."""

    seconds: float


Plan = Generator[Call | Sleep, Any, T]


def call(method: str, *args: Any, **kwargs: Any) -> Call:
    return Call(method, args, kwargs)


def _backoff(attempt: int) -> float:
    if testing_enabled():
        return 0.0
    return float(min(1.0, 0.05 * (2**attempt)) * (0.5 + random.random() / 2))


def _resolve_write(req: Call, head: Head | None, stored: bool | None = None) -> Head | None:
    """After an ambiguous write: the head our write made if it landed, None to retry
    it, or raise a conflict. ``stored``: whether our row exists, once the head has
    moved to someone else's checkpoint (None: not looked up yet, see :func:`_moved_on`)."""
    row: CheckpointRow = req.args[0]
    expected: int = req.args[2]
    if head is not None and head.checkpoint_id == row.checkpoint_id:
        return head
    found = head.version if head else 0
    if found == expected:
        return None
    if stored:
        # It landed, and another writer moved the head on top of it since.
        return Head(row.checkpoint_id, expected + 1)
    raise ConflictError(
        thread_id=row.thread_id,
        namespace=row.namespace,
        expected=expected,
        found=found,
        found_checkpoint=head.checkpoint_id if head else None,
    )


def _moved_on(req: Call, head: Head | None) -> bool:
    """Whether the head is neither our checkpoint nor the version we wrote against:
    then only reading our row tells whether the write landed (below the new head)."""
    row: CheckpointRow = req.args[0]
    return (head.version if head else 0) != req.args[2] and (head is None or head.checkpoint_id != row.checkpoint_id)


def _kv_landed(ops: Any, found: list[Any]) -> bool:
    """After an ambiguous ``kv_write`` (the connection died around the commit): whether it
    landed, judged by reading its keys back. A batch is atomic, so every key is at the version
    and value it wrote, or the write did not happen (a retry then writes it, or, if another
    writer moved a key since, raises the conflict it meets)."""
    return all(
        e is not None and e.version == op.expected + 1 and e.value == (None if op.value is None else bytes(op.value))
        for op, e in zip(ops, found, strict=True)
    )


def checked(method: str, exc: BaseException) -> BaseException:
    if isinstance(exc, PersistkitError):
        return exc
    return BackendError(f"store backend failed in {method}(): {type(exc).__name__}: {exc}")


def call_sync(backend: Backend, req: Call, failed: BackendUnavailableError | None = None) -> Any:
    """``req`` on the backend's blocking method, transient failures retried.

    ``failed``: the first attempt was made already and failed so (``Store.write_sync``).
    """
    last = failed
    if failed is not None:
        time.sleep(_backoff(0))
    for attempt in range(1 if failed is not None else 0, TRANSIENT_ATTEMPTS):
        try:
            if last is not None and req.method in ("write", "write_fenced"):
                row = req.args[0]
                head = backend.head(row.thread_id, row.namespace)
                stored = _moved_on(req, head) and backend.get(row.thread_id, row.namespace, row.checkpoint_id) is not None
                landed = _resolve_write(req, head, stored)
                if landed is not None:
                    return landed
            if last is not None and req.method == "kv_write":
                scope, ops = req.args[0], req.args[1]
                if _kv_landed(ops, [backend.kv_get(scope, op.key) for op in ops]):
                    return None
            return getattr(backend, req.method)(*req.args, **req.kwargs)
        except BackendUnavailableError as exc:
            last = exc
            time.sleep(_backoff(attempt))
        except PersistkitError:
            raise
        except Exception as exc:  # a backend that let a driver error escape
            raise checked(req.method, exc) from exc
    assert last is not None
    raise last


async def call_async(backend: Backend, req: Call, failed: BackendUnavailableError | None = None) -> Any:
    """``req`` on the backend's async twin, transient failures retried (``failed``: as in call_sync)."""
    last = failed
    if failed is not None:
        import asyncio

        await asyncio.sleep(_backoff(0))
    for attempt in range(1 if failed is not None else 0, TRANSIENT_ATTEMPTS):
        try:
            if last is not None and req.method in ("write", "write_fenced"):
                row = req.args[0]
                head = await backend.ahead(row.thread_id, row.namespace)
                stored = _moved_on(req, head) and await backend.aget(row.thread_id, row.namespace, row.checkpoint_id) is not None
                landed = _resolve_write(req, head, stored)
                if landed is not None:
                    return landed
            if last is not None and req.method == "kv_write":
                scope, ops = req.args[0], req.args[1]
                if _kv_landed(ops, [await backend.akv_get(scope, op.key) for op in ops]):
                    return None
            return await getattr(backend, "a" + req.method)(*req.args, **req.kwargs)
        except BackendUnavailableError as exc:
            last = exc
            import asyncio

            await asyncio.sleep(_backoff(attempt))
        except PersistkitError:
            raise
        except Exception as exc:
            raise checked(req.method, exc) from exc
    assert last is not None
    raise last


def run_sync(backend: Backend, plan: Plan[T]) -> T:
    """Drive ``plan`` with the backend's blocking methods."""
    try:
        req = next(plan)
        while True:
            if isinstance(req, Sleep):
                time.sleep(req.seconds)
                req = plan.send(None)
                continue
            try:
                result = call_sync(backend, req)
            except BaseException as exc:
                req = plan.throw(exc)
            else:
                req = plan.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def run_async(backend: Backend, plan: Plan[T]) -> T:
    """Drive ``plan`` with the backend's async twins."""
    import asyncio

    try:
        req = next(plan)
        while True:
            if isinstance(req, Sleep):
                await asyncio.sleep(req.seconds)
                req = plan.send(None)
                continue
            try:
                result = await call_async(backend, req)
            except BaseException as exc:
                req = plan.throw(exc)
            else:
                req = plan.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
