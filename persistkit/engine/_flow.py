"""``pk.limited``, ``pk.throttle`` and ``@pk.checkpointed(limit=)`` (docs/flow-control.md).

Here, in the engine's floor, only because they find the store of the current run; what a
draw does is ``persistkit/flow/_limits.py``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import TracebackType
from typing import Any

from .._errors import ConfigurationError
from ..flow._gcra import check_key, check_name
from ..flow._limits import LimitDraw, limits_of
from ._context import CURRENT

__all__ = ["athrottle", "limited", "limited_body", "throttle"]

#: ``limit=`` of a step: a name, or (name, key) where key is a str/int or a function of the step's arguments
LimitArg = str | tuple[str, Any]


def _store(store: Any) -> Any:
    if store is not None:
        return store
    frame = CURRENT.get()
    if frame is not None:
        return frame.run.store
    from ._store import default_store

    return default_store()


class limited:
    """Wait for capacity under the shared rate limit ``name`` (bucket ``key``), then run the
    block: ``with pk.limited("openai", key=tenant):`` or ``async with``. Draws ``tokens``
    (default the limit's ``tokens_per_call``), waiting at most ``timeout`` seconds (default the
    limit's), else ``pk.RateLimitedError``. ``store``: default the current run's, else
    ``pk.default_store()``. The ``as`` target is the ``LimitDraw`` (``.waited`` seconds)."""

    def __init__(
        self,
        name: str,
        *,
        key: object = None,
        tokens: float | None = None,
        timeout: float | None = None,
        store: Any = None,
    ) -> None:
        self.name = check_name(name)
        self.key = key
        self.tokens = tokens
        self.timeout = timeout
        self.store = store

    def __enter__(self) -> LimitDraw:
        return limits_of(_store(self.store)).acquire(
            self.name, key=self.key, tokens=self.tokens, timeout=self.timeout
        )

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    async def __aenter__(self) -> LimitDraw:
        lim = limits_of(_store(self.store))
        return await lim.aacquire(self.name, key=self.key, tokens=self.tokens, timeout=self.timeout)

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


def throttle(name: str, retry_after: float, *, key: object = None, store: Any = None) -> None:
    """A call under limit ``name`` got a 429 (or the like) whose reset is ``retry_after`` seconds
    away: every process's draws of that bucket wait until then (docs/flow-control.md)."""
    limits_of(_store(store)).throttle(name, retry_after, key=key)


async def athrottle(
    name: str, retry_after: float, *, key: object = None, store: Any = None
) -> None:
    """``pk.throttle`` for async callers."""
    await limits_of(_store(store)).athrottle(name, retry_after, key=key)


def limited_body(fn: Callable[..., Any], limit: LimitArg) -> Callable[..., Any]:
    """``fn`` drawing from ``limit`` before each call: the body a ``limit=`` step runs live.
    A replayed step never calls its body, so it never draws; each retried attempt draws."""
    if isinstance(limit, str):
        name, key = check_name(limit), None
    elif isinstance(limit, tuple) and len(limit) == 2 and isinstance(limit[0], str):
        name, key = check_name(limit[0]), limit[1]
        if not callable(key):
            check_key(key)
    else:
        raise ConfigurationError(
            f"@checkpointed(limit={limit!r}): expected a limit name ('openai') or (name, key), where key "
            "is a str or int, or a function of the step's arguments that returns one"
        )
    keyed: Callable[..., Any] | None = key if callable(key) else None

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def adrawn(*args: Any, **kwargs: Any) -> Any:
            k = keyed(*args, **kwargs) if keyed is not None else key
            await limits_of(_store(None)).aacquire(name, key=k)
            return await fn(*args, **kwargs)

        return adrawn

    @functools.wraps(fn)
    def drawn(*args: Any, **kwargs: Any) -> Any:
        k = keyed(*args, **kwargs) if keyed is not None else key
        limits_of(_store(None)).acquire(name, key=k)
        return fn(*args, **kwargs)

    return drawn
