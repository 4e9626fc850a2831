"""Type-tagged JSON serializer for step results, state and recorded errors.

JSON-native values stay plain JSON. Everything else becomes a tagged object
``{"__pk__": TAG, "v": PAYLOAD}``, plus ``"c": "module:qualname"`` for classes:

====  =========================================  ==================================
tag   type                                       payload
====  =========================================  ==================================
t     tuple                                      list
s fs  set, frozenset                             list, sorted by element JSON text
d     dict with non-str keys or a "__pk__" key   list of [key, value] pairs
i     int too long for plain JSON                hex string
f     nan, inf, -inf                             "nan" / "inf" / "-inf"
b ba  bytes, bytearray                           base64 string
dt    datetime                                   iso string, or [iso wall time, tz, fold]
da    date                                       iso string
tm    time                                       iso string, or [iso, tz, fold]
td    timedelta                                  [days, seconds, microseconds]
u     uuid.UUID                                  canonical string
dec   decimal.Decimal                            str(value)
pa    pathlib path                               [class name, str(path)]
e     Enum member (c)                            the member's value
m     pydantic model (c)                         {field: value} (fields + extras)
dc    dataclass (c)                              {field: value}
nt    namedtuple (c)                             list
sc    registered str/int/float subclass (c)      the base value
ex    exception (c)                              {"args": [...], "str": ..., "notes": [...]}
x     pickled object (only with allow_pickle)    base64 of pickle protocol 5
====  =========================================  ==================================

A tz is null, ``["o", seconds, microseconds(, name)]`` for ``datetime.timezone``
or ``["z", key]`` for ``zoneinfo.ZoneInfo``. Decoding never imports a module
unless it is allowlisted, and revives a class only if it is registered.
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import decimal
import importlib
import inspect
import json
import pathlib
import pickle
import re
import sys
import typing
import uuid
from collections.abc import Callable, Sequence
from datetime import date, datetime, time, timedelta, timezone
from enum import Enum
from typing import Any
from zoneinfo import ZoneInfo

from pydantic import BaseModel, RootModel

from ._errors import ConfigurationError, SerializationError, StepFailedError

__all__ = [
    "Serializer",
    "class_name",
    "register",
    "register_module",
    "register_type_hints",
]

TAG = "__pk__"
MAX_DEPTH = 500  # JSON nesting levels; also keeps us well inside Python's recursion limit
_BIG = 1 << 2000  # ints beyond this could exceed sys.get_int_max_str_digits() (min 640 digits)
_INF = float("inf")
_DEC_CTX = decimal.Context(traps=[decimal.InvalidOperation])  # malformed strings raise, not NaN
_MODULE_RE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")
_PATHS: dict[str, type[pathlib.PurePath]] = {
    c.__name__: c
    for c in (pathlib.PurePosixPath, pathlib.PureWindowsPath, pathlib.PosixPath, pathlib.WindowsPath)
}
# pydantic >= 2.11 validates by field name explicitly; older versions do so by default.
_VALIDATE_KW: dict[str, bool] = (
    {"by_alias": False, "by_name": True}
    if "by_name" in inspect.signature(BaseModel.model_validate).parameters
    else {}
)
_JSON_OUT = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
)
# Fallback for strings holding lone surrogates, which UTF-8 cannot carry unescaped.
_JSON_OUT_ASCII = json.JSONEncoder(separators=(",", ":"), allow_nan=False, check_circular=False)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_JSON_IN = json.JSONDecoder(parse_constant=_reject_constant)

# Process-wide registry: "module:qualname" -> class, and allowlisted module prefixes.
_REGISTRY: dict[str, type] = {}
_NAMES: dict[type, str] = {}
_MODULES: set[str] = set()


def class_name(cls: type) -> str:
    """The stable name a class is stored under: ``"module:qualname"``."""
    return f"{cls.__module__}:{cls.__qualname__}"


_C = typing.TypeVar("_C", bound=type)


def register(cls: _C) -> _C:
    """Make ``cls`` revivable on decode (usable as a decorator)."""
    if not isinstance(cls, type):
        raise ConfigurationError(f"persistkit.register() takes a class, got {cls!r}")
    _REGISTRY[class_name(cls)] = cls
    return cls
