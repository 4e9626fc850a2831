"""A handle never reaches a live call as text: resolved where a value enters one, or refused.

Loading never needs a secret's value: a handle that nothing resolves when a value
is read back (a resume, a replayed step's result, an inspection) stays as its
text and is remembered as read back unresolved (``_redact._hold``). Where a
value enters a live call — a step's arguments and the run's state before its
body, an adapter's tool and model calls (:func:`live`) — such handles are
resolved now (the environment, a registration or a vault may know them by then)
or the call fails before it runs with ``SecretResolutionError`` naming the handle
and what to configure.

Only handles this process read back from a store count: a ``$CRED{…}`` typed by
a user or a model (escaped when stored) never resolves into a secret. The common
path costs one truth test of a set that stays empty in a process that never read
back an unresolved handle.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

from .._errors import IntegrityError, SecretResolutionError
from ._redact import _HANDLE_RE, Redactor, Secret, _unresolved, default_redactor
from ._redact import resolve as _resolve_one
from ._registry import _loaded

__all__ = ["held", "live", "pending", "resolve"]

_MAX_DEPTH = 100


def pending() -> bool:
    """Whether this process has read back a handle it could not resolve (else :func:`live` is a no-op)."""
    return bool(_loaded)


def live(value: Any, *, where: str = "", partial: bool = False, redactor: Redactor | None = None) -> Any:
    """``value`` with every handle read back from a store resolved, for a live call.

    Strings are rewritten; lists, tuples (named ones too), dicts, sets, pydantic
    models and dataclasses are copied where something inside them changed; the
    rest (and ``pk.Secret``, resolved at ``.reveal()``) is handed on as it is.
    Raises ``SecretResolutionError`` for a handle nothing resolves, with ``where``
    (what was about to run) in front of the reason; ``partial``: keeps it as
    handle text instead (a value on its way to a call that checks it again).
    """
    if not _loaded:
        return value
    return _walk(value, redactor or default_redactor(), where, 0, [] if partial else None)


def resolve(value: Any, *, redactor: Redactor | None = None, store: Any = None) -> Any:
    """Resolve explicitly: a ``Secret`` to its value, a text's handles to their values, and
    in a value read back from a store (``store.get_state(...)``: a dict, a model, a list,
    a dataclass) every handle it holds (copied where something changed).

    ``store``: with that store's vault and handle key too (``pk.connect(url, vault=...)``).
    Raises ``SecretResolutionError`` naming the first handle nothing knows.
    """
    if store is not None:
        redactor = store.codec.redactor
    if isinstance(value, list | tuple | dict | set | frozenset) or hasattr(value, "__pydantic_fields__") or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    ):
        return live(value, redactor=redactor)
    return _resolve_one(value, redactor=redactor)


def held(value: Any) -> list[str]:
    """The handles read back unresolved that ``value`` holds and that nothing resolves now."""
    if not _loaded:
        return []
    found: list[str] = []
    _walk(value, default_redactor(), "", 0, found)  # collecting: never raises
    return found


def _text(text: str, red: Redactor, where: str, found: list[str] | None) -> str:
    def sub(m: re.Match[str]) -> str:
        if m[0] not in _loaded:  # not read back from a store: text someone typed, kept as is
            return m[0]
        value = red.lookup(m[1])
        if value is None:
            if found is not None:
                found.append(m[0])
                return m[0]
            exc = _unresolved(m[1], red)
            if isinstance(exc, IntegrityError):
                raise IntegrityError(f"{where}: it was not run. {exc}" if where else str(exc)) from None
            raise SecretResolutionError(
                f"{where}: it was not run, because it would be handed the handle {m[0]} as text "
                f"instead of the secret it stands for. {exc}"
                if where
                else str(exc),
                handle=m[1],
            )
        return value if isinstance(value, str) else value.decode("utf-8", "replace")

    return _HANDLE_RE.sub(sub, text)


def _walk(v: Any, red: Redactor, where: str, depth: int, found: list[str] | None = None) -> Any:
    if isinstance(v, str):
        return _text(v, red, where, found) if "$CRED{" in v else v
    if depth > _MAX_DEPTH or v is None or isinstance(v, int | float | bytes | Secret):
        return v
    d = depth + 1
    if isinstance(v, list):
        items = [_walk(x, red, where, d, found) for x in v]
        return v if all(a is b for a, b in zip(items, v, strict=True)) else items
    if isinstance(v, tuple):
        items = [_walk(x, red, where, d, found) for x in v]
        if all(a is b for a, b in zip(items, v, strict=True)):
            return v
        return type(v)(*items) if hasattr(v, "_fields") else tuple(items)
    if isinstance(v, dict):
        pairs = [(_walk(k, red, where, d, found), _walk(x, red, where, d, found)) for k, x in v.items()]
        if all(a is k and b is x for (a, b), (k, x) in zip(pairs, v.items(), strict=True)):
            return v
        return dict(pairs)
    if isinstance(v, set | frozenset):
        items = [_walk(x, red, where, d, found) for x in v]
        return v if all(a is b for a, b in zip(items, v, strict=True)) else type(v)(items)
    fields = getattr(type(v), "__pydantic_fields__", None)
    if fields is not None and hasattr(v, "model_copy"):
        changes = {}
        for name in fields:
            old = getattr(v, name, None)
            new = _walk(old, red, where, d, found)
            if new is not old:
                changes[name] = new
        return v.model_copy(update=changes) if changes else v
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        changed = {}
        for f in dataclasses.fields(v):
            old = getattr(v, f.name, None)
            new = _walk(old, red, where, d, found)
            if new is not old:
                changed[f.name] = new
        if not changed:
            return v
        out = copy.copy(v)
        for name, new in changed.items():
            object.__setattr__(out, name, new)  # frozen dataclasses too
        return out
    return v
