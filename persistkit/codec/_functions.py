"""Functions stored by name: a saga's compensations, after-commit effects.

A record may name a function another process calls later (after a crash, a rollback, a
drain). It is stored as ``module:qualname``, and only a module-level function (or a
class's static method) can be: a lambda, a closure, a bound method, a ``functools.partial``
or a decorated stand-in could not be found again, so :func:`stored_name` refuses them
when they are registered, not when a crash has already stranded them. :func:`find` looks
a stored name up again, importing only from the modules class revival trusts
(``_registry``: the modules of ``@checkpointed`` functions and ``State`` classes,
``pk.connect(allow_modules=...)``): a stored record never makes persistkit import
anything else. Each layer wraps :class:`NotFound` in its own error.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
import sys
from collections.abc import Callable
from typing import Any

from .._errors import ConfigurationError
from ._registry import _MODULE_RE, _MODULES

__all__ = ["NotFound", "allowed", "find", "stored_name", "walk"]

_QUALNAME_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")


class NotFound(Exception):
    """A stored name this process cannot call: ``kind`` is ``not allowed`` (its module is not
    allowlisted), ``no import`` (the module fails to import) or ``gone`` (no such function)."""

    def __init__(self, kind: str, name: str, detail: str = "") -> None:
        self.kind, self.name, self.detail = kind, name, detail
        super().__init__(f"{kind}: {name} {detail}".strip())


def stored_name(fn: Any, what: str, later: str) -> str:
    """``module:qualname`` of ``fn``, checked to name exactly this function, or a
    ``ConfigurationError`` that starts with ``what`` and says why ``later`` (the process that
    calls it after a crash) could not find it."""
    target = fn.__func__ if isinstance(fn, staticmethod) else fn
    if not callable(target) or inspect.isclass(target):
        raise ConfigurationError(f"{what}: expected a function, got {fn!r}")
    if inspect.ismethod(target) or isinstance(target, functools.partial):
        raise ConfigurationError(
            f"{what}: a bound method or a functools.partial cannot be stored ({later} could not "
            "rebuild its object). Pass a module-level function and the data it needs as arguments"
        )
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise ConfigurationError(
            f"{what}: {fn!r} has no module and qualified name (a callable object?); pass a "
            "module-level function and the data it needs as arguments"
        )
    if "<" in qualname or not _QUALNAME_RE.match(qualname) or not _MODULE_RE.match(module):
        kind = "a lambda" if "<lambda>" in qualname else "a function defined inside another function"
        raise ConfigurationError(
            f"{what}: {module}.{qualname} is {kind}: {later} must find it by its module and name. "
            "Define it at the top level of a module and pass what it captured as arguments"
        )
    if walk(sys.modules.get(module), qualname) is not target:
        raise ConfigurationError(
            f"{what}: {module}:{qualname} does not name this function in its module (it is decorated "
            f"or replaced there), so {later} would call something else. Pass the function its module defines"
        )
    return f"{module}:{qualname}"


def find(name: str, allow_modules: tuple[str, ...]) -> Callable[..., Any]:
    """The function stored as ``name``, imported only from an allowlisted module (``allow_modules``
    of the store's codec, plus the modules trusted in this process); :class:`NotFound` otherwise."""
    module, _, qualname = name.partition(":")
    if not allowed(module, allow_modules) or not _QUALNAME_RE.match(qualname):
        raise NotFound("not allowed", name)
    try:
        fn = walk(importlib.import_module(module), qualname)
    except Exception as exc:
        raise NotFound("no import", name, f"({type(exc).__name__}: {exc})") from exc
    if fn is None or not callable(fn) or inspect.isclass(fn):
        raise NotFound("gone", name)
    return fn  # type: ignore[no-any-return]


def allowed(module: str, allow_modules: tuple[str, ...]) -> bool:
    """Whether code of ``module`` may be imported for a stored name (see the module docstring)."""
    trusted = tuple(allow_modules) + tuple(_MODULES)
    return bool(_MODULE_RE.match(module)) and any(module == m or module.startswith(m + ".") for m in trusted)


def walk(obj: Any, qualname: str) -> Any:
    """``qualname`` looked up in ``obj`` (a module) through ``vars``, or None."""
    for part in qualname.split("."):
        try:
            obj = vars(obj)[part]  # vars(), not getattr(): no module __getattr__ hooks
        except (TypeError, KeyError):
            return None
    return obj.__func__ if isinstance(obj, staticmethod) else obj
