"""Names of code in stored records, and the one rule that turns a name back into code.

A record names a class (a step's result, a state field, a recorded error, a question's
answer type) or a function (an after-commit effect, a compensation) as ``module:qualname``,
for another process to revive or call later. Whoever can write the store can write such a
name (docs/security.md, "Who can write the store"), so a name is never looked up *through*
anything. It resolves only to

* a class or function registered in this process under exactly that name (``pk.register``,
  ``@checkpointed(compensate=...)``, a step's annotations, a ``State``'s fields); or
* a class *defined* under exactly that name in a trusted module (:func:`trusted`): the
  module is allowlisted, and the object's own ``__module__`` and ``__qualname__`` are the
  stored ones, each enclosing part a class defined there too (:func:`defined`).

So ``app:os.system`` (another module's globals), ``app:Helper`` where ``app`` imported
``Helper`` from elsewhere (a re-export), ``app:sub.Thing`` through a module attribute that
is a module, and ``app:pk._ids.os.system`` are refused: nothing in a stored record walks
from a trusted module into an untrusted one. Functions are never found by module at all
(``_functions``: only registered ones are called); recorded errors add the built-in,
standard-library and constructor-less exception classes (:func:`exception_class`).

The standard library and ``builtins`` are never trusted modules, whatever a caller passes,
and no refusal advises allowlisting one (:func:`refusal`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
import sys
from typing import Any

from . import _registry

__all__ = ["defined", "exception_class", "is_stdlib", "origin", "parse", "refusal", "trusted", "warn_unrevivable"]

_MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")
_QUALNAME_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")
_STDLIB = frozenset(sys.stdlib_module_names) | {"builtins", "__future__"}


def parse(name: object) -> tuple[str, str] | None:
    """``(module, qualname)`` of a well-formed stored name, else None."""
    if type(name) is not str:
        return None
    module, sep, qualname = name.partition(":")
    if not sep or not _MODULE_RE.match(module) or not _QUALNAME_RE.match(qualname):
        return None
    return module, qualname


def is_stdlib(module: str) -> bool:
    """Whether ``module`` belongs to Python's standard library (or is ``builtins``)."""
    return module.partition(".")[0] in _STDLIB


def trusted(module: str, allow: tuple[str, ...] | list[str] | set[str]) -> bool:
    """Whether code of ``module`` may be imported to revive a stored name: it is an entry of
    ``allow`` (a codec's ``allow_modules``) or of the modules this process trusts
    (``_registry._MODULES``: of ``@checkpointed`` functions and ``State`` classes), or below
    one (``app`` trusts ``app.models``), and not of the standard library."""
    return (
        bool(_MODULE_RE.match(module))
        and not is_stdlib(module)
        and any(module == m or module.startswith(m + ".") for m in (*allow, *_registry._MODULES))
    )


def defined(module: str, qualname: str, *, load: bool = True) -> Any:
    """The object defined in ``module`` under exactly ``qualname``, or None.

    Each part is read from ``vars()`` (no ``__getattr__`` hook runs), every enclosing part
    must be a class defined there under its own qualname, and the object's ``__module__``
    and ``__qualname__`` must be the stored ones: a name never reaches what a module merely
    imported. ``load=False`` looks only at an already imported module (never imports).
    The caller decides whether ``module`` may be imported (:func:`trusted`)."""
    mod = sys.modules.get(module)
    if mod is None:
        if not load:
            return None
        mod = importlib.import_module(module)  # the caller checked that it is trusted
    obj: Any = mod
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        try:
            obj = vars(obj)[part]
        except (TypeError, KeyError):
            return None
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        here = ".".join(parts[: i + 1])
        if i < len(parts) - 1 and not isinstance(obj, type):
            return None  # only a class encloses a name: never a module, a function or an object
        if getattr(obj, "__module__", None) != module or getattr(obj, "__qualname__", None) != here:
            return None
    return obj


def origin(module: str) -> str:
    """``"stdlib"``, ``"installed"`` (a third-party package in site-packages) or ``"app"``,
    found without importing ``module`` (only its top-level package's location is looked up)."""
    if is_stdlib(module):
        return "stdlib"
    top = module.partition(".")[0]
    found = sys.modules.get(top)
    where: str | None = getattr(found, "__file__", None) if found is not None else None
    if where is None and found is None:
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        where = spec.origin if spec is not None else None
    if where and ("site-packages" in where or "dist-packages" in where) and top != "persistkit":
        return "installed"
    return "app"


def refusal(name: str, what: str, fix: str, *, head: str | None = None) -> str:
    """The message for a stored ``name`` (of ``what``: "an effect function", "a result class",
    ...) this process will not revive. It says the record may be forged, and offers ``fix``
    (how a developer makes a name of their own code resolvable) only for a module that can
    be the application's own: never allowlisting the standard library or an installed package."""
    head = head or f"the stored name {name!r} ({what}) is not one this process may revive"
    forged = (
        "If your code did not write it, the record may be forged by someone who can write the "
        "store: see docs/security.md (integrity= refuses such records before any name is read)"
    )
    parsed = parse(name)
    if parsed is None:
        return f"{head}: it is not a module:qualname name. {forged}"
    kind = origin(parsed[0])
    if kind != "app":
        where = "Python's standard library" if kind == "stdlib" else "an installed package"
        return (
            f"{head}: {parsed[0]!r} is a module of {where}, and a stored record may name only "
            f"code of your application. {forged}. If your code stored it, wrap it in a function "
            "or class of your own module"
        )
    return f"{head}: {fix}. {forged}"


# -- recorded errors -------------------------------------------------------------------------


def exception_class(name: str, allow: tuple[str, ...]) -> type[BaseException] | None:
    """The exception class a record names, or None: registered (``pk.register``), built in,
    persistkit's own, defined in a standard-library module already imported, defined in an
    allowlisted module, or defined in any module already imported when reviving it runs no
    code of its own (:func:`_inert`). Each under exactly its name (``defined``): never
    through another module's globals. Imports only a trusted module (:func:`trusted`)."""
    cls: Any = _registry._REGISTRY.get(name)
    parsed = parse(name)
    if cls is None and parsed is not None:
        module, qualname = parsed
        if trusted(module, allow):
            try:
                cls = defined(module, qualname)
            except Exception:  # an allowlisted module that fails to import: not revivable
                cls = None
        else:
            cls = defined(module, qualname, load=False)
            if not (is_stdlib(module) or module == "persistkit._errors" or _inert(cls)):
                cls = None
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return cls
    return None


def _inert(cls: Any) -> bool:
    """Whether ``cls(*args)`` runs no code but the built-in exception's: no ``__init__`` or
    ``__new__`` of its own or of a base outside the standard library, and no metaclass. Such
    a class (``class Declined(Exception): pass``) revives from any imported module: a
    forged record can name it, but constructing it executes nothing."""
    if not (isinstance(cls, type) and issubclass(cls, Exception) and type(cls) is type):
        return False
    for base in cls.__mro__:
        if is_stdlib(base.__module__):
            continue
        if "__init__" in vars(base) or "__new__" in vars(base):
            return False
    return True


#: Exception classes already warned about (:func:`warn_unrevivable`): once each.
_WARNED: set[str] = set()
_log = logging.getLogger("persistkit")


def warn_unrevivable(name: str, cls: type, allow: tuple[str, ...]) -> None:
    """Log once per class that a step raised ``cls``, which a resumed run in another process
    would replay as ``pk.StepFailedError`` (not registered, not revivable by the rules above)."""
    if name in _WARNED or exception_class(name, allow) is cls:
        return
    _WARNED.add(name)
    _log.warning(
        "a step raised %s, which a resumed run in another process replays as "
        "pk.StepFailedError (class name and message kept as data): a recorded error's class "
        "with a constructor of its own is revived only if it is registered or defined in an "
        "allowlisted module. Register it with pk.register(%s) where it is defined if your code "
        "catches it", name.replace(":", "."), name.replace(":", "."),
    )
