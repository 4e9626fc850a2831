"""Which classes persistkit may revive from storage.

A class is revivable when it is registered (``pk.register``), named in a
step's signature or a ``State`` field (``register_type_hints``), encoded by
this process, or defined in an allowlisted module (``register_module``,
``connect(allow_modules=...)``). Decoding never imports anything else.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import typing
from enum import Enum
from typing import Any

from .._errors import ConfigurationError

if typing.TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["class_name", "register", "register_module", "register_type_hints"]

_MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")


class _NoModel:
    """Stands for ``pydantic.BaseModel`` while pydantic is not imported: no value is one."""


def _base_model() -> type[BaseModel] | type[_NoModel]:
    # A value can only be a pydantic model if pydantic was imported first, so
    # ``import persistkit`` does not import pydantic (it costs ~100 ms).
    module = sys.modules.get("pydantic")
    return _NoModel if module is None else module.BaseModel


# Process-wide registry: "module:qualname" -> class, and allowlisted module prefixes.
_REGISTRY: dict[str, type] = {}
_MODULES: set[str] = set()


def class_name(cls: type) -> str:
    """The stable name a class is stored under: ``"module:qualname"``."""
    return f"{cls.__module__}:{cls.__qualname__}"


def register(cls: type) -> None:
    """Make ``cls`` revivable on decode. The public ``pk.register`` (with ``version=``) is
    ``_versions.register``, which calls this."""
    if not isinstance(cls, type):
        raise ConfigurationError(f"persistkit.register() takes a class, got {cls!r}")
    _REGISTRY[class_name(cls)] = cls


def register_module(name: str) -> None:
    """Allow decoding to import ``name`` (or any ``name.*`` submodule) and revive its classes."""
    if not isinstance(name, str) or not _MODULE_RE.match(name):
        raise ConfigurationError(f"register_module() takes a dotted module name, got {name!r}")
    _MODULES.add(name)


def register_type_hints(tp: Any) -> None:
    """Register every pydantic model, dataclass, namedtuple and Enum reachable from annotation ``tp``.

    Never raises: parts of an annotation it cannot understand are skipped.
    """
    _walk_hints(tp, {})


def _walk_hints(tp: Any, seen: dict[int, Any]) -> None:
    if id(tp) in seen or tp is None or isinstance(tp, (str, bytes, int, float)):
        return
    seen[id(tp)] = tp  # keeps tp alive so its id cannot be reused during the walk
    # An annotation may be anything (strings, TypeVars, user objects with odd
    # __getattr__); the contract is "register what you can, never raise".
    try:
        if isinstance(tp, (list, tuple)):
            for item in tp:
                _walk_hints(item, seen)
            return
        if isinstance(tp, type):
            _walk_class(tp, seen)
            return
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is typing.Literal:
            for a in args:
                if isinstance(a, Enum):
                    _walk_hints(type(a), seen)
        elif origin is typing.Annotated:
            _walk_hints(args[0], seen)
        else:
            if isinstance(origin, type):
                _walk_class(origin, seen)
            _walk_hints(args, seen)
        if isinstance(tp, typing.TypeVar):
            _walk_hints(tp.__bound__, seen)
            _walk_hints(tp.__constraints__, seen)
        for attr in ("__supertype__", "__value__"):  # NewType, `type X = ...` aliases
            if attr in getattr(tp, "__dict__", ()):
                _walk_hints(getattr(tp, attr), seen)
    except Exception:  # the contract: parts we cannot understand are skipped
        return


def _walk_class(cls: type, seen: dict[int, Any]) -> None:
    if issubclass(cls, Enum):
        register(cls)
    elif issubclass(cls, _base_model()):
        register(cls)
        for f in cls.model_fields.values():  # type: ignore[union-attr]
            _walk_hints(f.annotation, seen)
    elif dataclasses.is_dataclass(cls) or _is_namedtuple(cls):
        register(cls)
        try:
            hints: Any = typing.get_type_hints(cls, include_extras=True).values()
        except Exception:  # unresolvable string annotations: use what is already evaluated
            hints = (
                [f.type for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
            )
        _walk_hints(list(hints), seen)


def _is_namedtuple(cls: type) -> bool:
    return issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple)
