"""Functions stored by name: a saga's compensations, after-commit effects.

A record may name a function another process calls later (after a crash, a rollback, a
drain). It is stored as ``module:qualname``, and only a module-level function (or a
class's static method) can be: a lambda, a closure, a bound method, a ``functools.partial``
or a decorated stand-in could not be found again, so :func:`stored_name` refuses them
when they are registered, not when a crash has already stranded them.

Whoever can write the store can write such a name, with arguments of their choosing, so a
stored name calls only a function *registered* for it (:func:`register_function`:
``@pk.register`` on the function, or ``@checkpointed(compensate=fn)``): never any other
function of a module, however trusted the module is (an agent's module holds its tools,
and a tool may run code). :func:`find` may import an allowlisted module so that its
registrations run (``_names.trusted``), and imports nothing else. Each layer wraps
:class:`NotFound` in its own error (the refusal's wording: ``_names.refusal``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from .._errors import ConfigurationError
from . import _names

__all__ = ["NotFound", "find", "register_function", "registered", "registered_name", "stored_name"]

#: "module:qualname" -> the function a stored record may call under that name.
_FUNCTIONS: dict[str, Callable[..., Any]] = {}


class NotFound(Exception):
    """A stored name this process cannot call: ``kind`` is ``not allowed`` (not registered, and
    its module is not allowlisted), ``no import`` (the module fails to import),
    ``unregistered`` (its module defines such a function, but it is not registered) or
    ``gone`` (no such function)."""

    def __init__(self, kind: str, name: str, detail: str = "") -> None:
        self.kind, self.name, self.detail = kind, name, detail
        super().__init__(f"{kind}: {name} {detail}".strip())


def stored_name(fn: Any, what: str, later: str, *, bound: bool = True) -> str:
    """``module:qualname`` of ``fn``, checked to name exactly this function, or a
    ``ConfigurationError`` that starts with ``what`` and says why ``later`` (the process that
    calls it after a crash) could not find it. ``bound=False`` (a decorator, which runs
    before its module binds the name) skips the check that the module holds ``fn`` there."""
    target = fn.__func__ if isinstance(fn, staticmethod) else fn
    if not callable(target) or inspect.isclass(target):
        raise ConfigurationError(f"{what}: expected a function, got {fn!r}")
    if inspect.ismethod(target) or isinstance(target, functools.partial):
        raise ConfigurationError(
            f"{what}: a bound method or a functools.partial cannot be stored ({later} could not "
            "rebuild its object). Pass a module-level function and the data it needs as arguments"
        )
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or not inspect.isfunction(target):
        raise ConfigurationError(
            f"{what}: {fn!r} is not a Python function of your code (a builtin, or a callable "
            "object?); pass a module-level function and the data it needs as arguments"
        )
    if "<" in qualname or _names.parse(f"{module}:{qualname}") is None:
        kind = "a lambda" if "<lambda>" in qualname else "a function defined inside another function"
        raise ConfigurationError(
            f"{what}: {module}.{qualname} is {kind}: {later} must find it by its module and name. "
            "Define it at the top level of a module and pass what it captured as arguments"
        )
    if _names.is_stdlib(module):
        raise ConfigurationError(
            f"{what}: {module}.{qualname} is a function of Python's standard library, which a "
            "stored record may not name (whoever can write the store could call it with any "
            "arguments). Wrap it in a function of your own module that does only what you mean"
        )
    if bound and _names.defined(module, qualname, load=False) is not target:
        raise ConfigurationError(
            f"{what}: {module}:{qualname} does not name this function in its module (it is decorated "
            f"or replaced there), so {later} would call something else. Pass the function its module defines"
        )
    return f"{module}:{qualname}"


def registered_name(fn: Any, what: str, later: str) -> str:
    """:func:`stored_name` of ``fn``, which must be registered (``@pk.register``): ``later``
    (the process that calls it after a crash) calls nothing else; a ``ConfigurationError``
    saying so otherwise, when it is registered, not when a crash stranded it."""
    name = stored_name(fn, what, later)
    if registered(fn) is None:
        raise ConfigurationError(
            f"{what}: {name} is not registered as a function a stored record may call. Put "
            f"@pk.register on it where it is defined (in {name.partition(':')[0]}), so that {later} "
            "can call it, and nothing else can be named in its place"
        )
    return name


def register_function(fn: Any, what: str = "persistkit.register()") -> str:
    """Let a stored record call ``fn`` (``@pk.register`` on a function): its stored name,
    checked as :func:`stored_name` checks it."""
    name = stored_name(fn, what, "a process that runs it after a crash", bound=False)
    _FUNCTIONS[name] = fn.__func__ if isinstance(fn, staticmethod) else fn
    return name


def registered(fn: Any) -> str | None:
    """``fn``'s stored name if it is registered, else None."""
    target = fn.__func__ if isinstance(fn, staticmethod) else fn
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    name = f"{module}:{qualname}"
    return name if _FUNCTIONS.get(name) is target else None


def find(name: str, allow_modules: tuple[str, ...]) -> Callable[..., Any]:
    """The function registered as ``name``; an allowlisted module not imported yet is imported
    first (its ``@pk.register`` lines run). :class:`NotFound` otherwise: ``not allowed`` (not
    registered, and no trusted module would register it), ``no import`` or ``gone``."""
    fn = _FUNCTIONS.get(name)
    if fn is not None:
        return fn
    parsed = _names.parse(name)
    if parsed is None:
        raise NotFound("not allowed", name)
    module = parsed[0]
    if not _names.trusted(module, allow_modules):
        raise NotFound("not allowed", name)
    try:
        importlib.import_module(module)
    except Exception as exc:
        raise NotFound("no import", name, f"({type(exc).__name__}: {exc})") from exc
    fn = _FUNCTIONS.get(name)
    if fn is None:
        there = _names.defined(*parsed, load=False)
        raise NotFound("unregistered" if inspect.isfunction(there) else "gone", name)
    return fn
