"""The wire forms of the standard library's value types in the tagged JSON (``_serde``).

These tags stand for a fixed stdlib type and hold no other value inside, so
they need neither the class registry nor the recursion of
:class:`~persistkit.codec._serde.Serializer`: big ints (``i``), nan/inf (``f``),
bytes (``b``, ``ba``), datetimes and times with their timezones (``dt``,
``tm``), dates (``da``), timedeltas (``td``), UUIDs (``u``), decimals
(``dec``) and paths (``pa``). ``_serde`` merges :data:`ENCODERS` and
:data:`DECODERS` into its dispatch tables; its docstring is the table of every
tag. A decoder raises ``ValueError`` on a malformed node, which the
serializer reports with the node's path.
"""

from __future__ import annotations

import base64
import decimal
import pathlib
import uuid
from collections.abc import Callable
from datetime import date, datetime, time, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

__all__ = ["DECODERS", "ENCODERS", "NO_TZ", "TAG", "payload", "payload_bytes", "tz_spec"]

TAG = "__pk__"
_DEC_CTX = decimal.Context(traps=[decimal.InvalidOperation])  # malformed strings raise, not NaN
_PATHS: dict[str, type[pathlib.PurePath]] = {
    c.__name__: c
    for c in (
        pathlib.PurePosixPath,
        pathlib.PureWindowsPath,
        pathlib.PosixPath,
        pathlib.WindowsPath,
    )
}

# (serializer, value, depth) -> tree and (serializer, node, depth) -> value, as in _serde's
# tables; these leaves use neither the serializer nor the depth.
_Enc = Callable[[Any, Any, int], Any]
_Dec = Callable[[Any, dict[str, Any], int], Any]

NO_TZ = object()
"""What :func:`tz_spec` returns for a tzinfo that has no wire form."""


def tz_spec(tz: Any) -> Any:
    if tz is None:
        return None
    if type(tz) is timezone:
        off = tz.utcoffset(None)
        spec: list[Any] = ["o", off.days * 86400 + off.seconds, off.microseconds]
        args = tz.__getinitargs__()  # type: ignore[attr-defined]  # (offset,) or (offset, name)
        if len(args) > 1:
            spec.append(args[1])
        return spec
    if type(tz) is ZoneInfo and tz.key is not None:
        return ["z", tz.key]
    return NO_TZ


def _tz_from(spec: Any) -> Any:
    match spec:
        case None:
            return None
        case ["z", str(key)]:
            return ZoneInfo(key)
        case ["o", int(seconds), int(micro), *name] if all(type(n) is str for n in name):
            return timezone(timedelta(seconds=seconds, microseconds=micro), *name)
    raise ValueError(f"bad timezone {spec!r:.60}")


def payload(node: dict[str, Any], want: type | tuple[type, ...], with_class: bool = False) -> Any:
    """The tagged node's "v", checked for shape and type."""
    if len(node) != (3 if with_class else 2) or "v" not in node:
        raise ValueError("unexpected keys " + repr(sorted(node)))
    v = node["v"]
    if not isinstance(v, want) or type(v) is bool:
        raise ValueError(f"payload is {type(v).__name__}")
    return v


def payload_bytes(node: dict[str, Any]) -> bytes:
    return base64.b64decode(payload(node, str), validate=True)


def _dec_float(self: Any, node: dict[str, Any], depth: int) -> float:
    v = payload(node, str)
    if v not in ("nan", "inf", "-inf"):
        raise ValueError(f"{v!r:.20} is not nan, inf or -inf")
    return float(v)


def _dec_int(self: Any, node: dict[str, Any], depth: int) -> int:
    return int(payload(node, str), 16)


def _dec_datetime(self: Any, node: dict[str, Any], depth: int) -> Any:
    cls = datetime if node[TAG] == "dt" else time
    match payload(node, (str, list)):
        case str(iso):
            return cls.fromisoformat(iso)
        case [str(iso), tz, 0 | 1 as fold]:
            return cls.fromisoformat(iso).replace(tzinfo=_tz_from(tz), fold=int(fold))
    raise ValueError("expected an iso string or [iso, tz, fold]")


def _dec_timedelta(self: Any, node: dict[str, Any], depth: int) -> timedelta:
    match payload(node, list):
        case [int(days), int(seconds), int(micro)]:
            return timedelta(days=days, seconds=seconds, microseconds=micro)
    raise ValueError("expected [days, seconds, microseconds]")


def _dec_path(self: Any, node: dict[str, Any], depth: int) -> pathlib.PurePath:
    match payload(node, list):
        case [str(kind), str(path)] if kind in _PATHS:
            return _PATHS[kind](path)
    raise ValueError("expected [path class, path]")


# Datetimes and times are encoded by the serializer (a tzinfo without a wire form
# falls back to pickle or fails there); big ints and nan/inf inline in its hot path.
ENCODERS: dict[type, _Enc] = {
    bytes: lambda s, v, d: {TAG: "b", "v": base64.b64encode(v).decode("ascii")},
    bytearray: lambda s, v, d: {TAG: "ba", "v": base64.b64encode(v).decode("ascii")},
    date: lambda s, v, d: {TAG: "da", "v": v.isoformat()},
    timedelta: lambda s, v, d: {TAG: "td", "v": [v.days, v.seconds, v.microseconds]},
    uuid.UUID: lambda s, v, d: {TAG: "u", "v": str(v)},
    decimal.Decimal: lambda s, v, d: {TAG: "dec", "v": str(v)},
    **{c: (lambda s, v, d: {TAG: "pa", "v": [type(v).__name__, str(v)]}) for c in _PATHS.values()},
}

DECODERS: dict[str, _Dec] = {
    "i": _dec_int,
    "f": _dec_float,
    "b": lambda s, n, d: payload_bytes(n),
    "ba": lambda s, n, d: bytearray(payload_bytes(n)),
    "dt": _dec_datetime,
    "tm": _dec_datetime,
    "da": lambda s, n, d: date.fromisoformat(payload(n, str)),
    "td": _dec_timedelta,
    "u": lambda s, n, d: uuid.UUID(payload(n, str)),
    "dec": lambda s, n, d: decimal.Decimal(payload(n, str), _DEC_CTX),
    "pa": _dec_path,
}
