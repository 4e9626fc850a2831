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
ex    exception (c)                              {"args": [...], "str": ..., "notes": [...]}
sec   pk.Secret, pydantic SecretStr/SecretBytes  handle name (``v``) and kind (``k``): never the value
x     pickled object (only with allow_pickle)    base64 of pickle protocol 5
====  =========================================  ==================================

A model or dataclass of a class registered with a version above 1
(``pk.register(Msg, version=2)``) also carries ``"r": 2``; no ``"r"`` means
version 1. Decoding an older one runs its class's migrations (``_versions``).

A tz is null, ``["o", seconds, microseconds(, name)]`` for ``datetime.timezone``
or ``["z", key]`` for ``zoneinfo.ZoneInfo``. Decoding never imports a module
unless it is allowlisted, and revives a class only if it is registered.

This module walks trees and revives classes; the wire forms of the stdlib
value types (i f b ba dt tm da td u dec pa) are in ``_stdtypes``.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import functools
import json
import sys
import typing
from collections.abc import Callable, Sequence
from datetime import datetime, time
from enum import Enum
from typing import Any

if typing.TYPE_CHECKING:
    pass

from .._errors import (
    ConfigurationError,
    SchemaVersionError,
    SecretResolutionError,
    SerializationError,
    StepFailedError,
)
from ..secrets._redact import Redactor, Secret, default_redactor
from . import _names
from ._registry import (
    _REGISTRY,
    _base_model,
    _is_namedtuple,
    class_name,
    register_module,
    register_type_hints,
)
from ._stdtypes import DECODERS, ENCODERS, NO_TZ, TAG, payload, payload_bytes, tz_spec
from ._versions import (
    ON_CHANGE,
    VERSIONS,
    Plain,
    ShapeError,
    chain,
    register,
    revive,
    validate_dataclass,
    validate_model,
)

__all__ = [
    "Serializer",
    "class_name",
    "register",
    "register_module",
    "register_type_hints",
]

MAX_DEPTH = 500  # JSON nesting levels; also keeps us well inside Python's recursion limit
_BIG = 1 << 2000  # ints beyond this could exceed sys.get_int_max_str_digits() (min 640 digits)
_INF = float("inf")


_JSON_OUT = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
)
# Fallback for strings holding lone surrogates, which UTF-8 cannot carry unescaped.
_JSON_OUT_ASCII = json.JSONEncoder(separators=(",", ":"), allow_nan=False, check_circular=False)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_JSON_IN = json.JSONDecoder(parse_constant=_reject_constant)

class _Fail(Exception):
    """Internal: carries a message and the path segments collected while unwinding."""

    def __init__(
        self, msg: str, *, too_deep: bool = False, render: Callable[[str], str] | None = None
    ) -> None:
        super().__init__(msg)
        self.msg = msg
        self.too_deep = too_deep
        self.render = render  # a value that does not fit its class: a SchemaVersionError
        self.parts: list[str] = []

    def error(self, root: str) -> SerializationError | SchemaVersionError:
        below = "".join(reversed(self.parts))
        if self.render is not None:  # the root names thread, run and step: keep it whole
            return SchemaVersionError(self.render(root + (below if len(below) <= 200 else below[:200] + "...")))
        path = root + below
        if len(path) > 200:
            path = path[:200] + "..."
        return SerializationError(self.msg, path=path)


def _key_seg(key: Any) -> str:
    text = json.dumps(key, ensure_ascii=False) if type(key) is str else repr(key)
    return f"[{text if len(text) <= 60 else text[:57] + '...'}]"


#: Modules whose classes can never be made storable (functions, locks, sockets, files, generators...).
_LIVE_MODULES = frozenset(sys.stdlib_module_names) | {"builtins"}


def _type_name(cls: type) -> str:
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _too_deep() -> _Fail:
    return _Fail(f"nested more than {MAX_DEPTH} levels deep", too_deep=True)


def _has_cycle(value: Any, on_path: set[int], done: set[int], depth: int = 0) -> bool:
    """Whether ``value`` contains itself (run only after the depth limit was hit)."""
    if isinstance(value, dict):
        children: Any = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple, set, frozenset)):
        children = value
    elif isinstance(value, _base_model()) or dataclasses.is_dataclass(value):
        children = list(getattr(value, "__dict__", {}).values())
    else:
        return False
    if id(value) in on_path or id(value) in done or depth > MAX_DEPTH:
        return id(value) in on_path
    on_path.add(id(value))
    found = False
    for c in children:  # a loop, not any(genexpr): one stack frame per level
        if _has_cycle(c, on_path, done, depth + 1):
            found = True
            break
    on_path.discard(id(value))
    done.add(id(value))  # shared (DAG) parts are explored once
    return found


def _auto_register(cls: type) -> str:
    """Classes this process encodes are trusted: remember them so decoding can revive them."""
    name = _cached_name(cls)
    if _REGISTRY.get(name) is not cls:
        _REGISTRY[name] = cls
    return name


_cached_name = functools.lru_cache(maxsize=4096)(class_name)


@functools.lru_cache(maxsize=4096)
def _dc_fields(cls: type) -> tuple[tuple[str, bool], ...]:
    """(name, init) of each dataclass field."""
    return tuple((f.name, f.init) for f in dataclasses.fields(cls))


def _items(fn: Callable[[Any, int], Any], seq: Any, depth: int) -> list[Any]:
    """``fn`` (encode or decode) over a sequence; a failure gets its index on the path."""
    items: list[Any] = []
    try:
        for v in seq:
            items.append(fn(v, depth))
    except _Fail as fail:
        fail.parts.append(f"[{len(items)}]")
        raise
    return items


def _fields(fn: Callable[[Any, int], Any], pairs: Any, depth: int) -> dict[str, Any]:
    """``fn`` over (attribute name, value) pairs; a failure gets ``.name`` on the path."""
    out: dict[str, Any] = {}
    try:
        for k, v in pairs:
            out[k] = fn(v, depth)
    except _Fail as fail:
        fail.parts.append(f".{k}")
        raise
    return out


_EncFn = Callable[["Serializer", Any, int], Any]
_DecFn = Callable[["Serializer", dict[str, Any], int], Any]
_KINDS: dict[type, _EncFn] = {}


class Serializer:
    """Encodes values to tagged JSON and back; safe to share between threads."""

    def __init__(self, *, allow_pickle: bool = False, allow_modules: Sequence[str] = ()) -> None:
        if isinstance(allow_modules, str):
            allow_modules = (allow_modules,)
        for m in allow_modules:
            if not isinstance(m, str) or _names.parse(f"{m}:x") is None:
                raise ConfigurationError(f"allow_modules takes dotted module names, got {m!r}")
            if _names.is_stdlib(m):
                raise ConfigurationError(
                    f"allow_modules={m!r}: a module of Python's standard library cannot be allowlisted "
                    "(a stored record could then name its code). Allow only your application's modules"
                )
        self.allow_pickle = bool(allow_pickle)
        self.allow_modules = tuple(allow_modules)
        self._resolved: dict[str, type] = {}
        self.secrets: Redactor | None = None  # names and resolves pk.Secret / SecretStr handles
        self.reveal: Callable[[str], str] | None = None  # resolves handles in decoded strings
        #: Decode models and dataclasses as :class:`Plain` dicts (what migrations are handed).
        self.plain = False
        self._plain_twin: Serializer | None = None
        # What decodes set items, dict keys and exception arguments: never Plain (they
        # must be hashable, or nothing revives them), so objects even in plain mode.
        self._solid = self

    # -- public API ---------------------------------------------------------

    def dumps(self, value: Any, *, path: str = "value") -> bytes:
        """UTF-8 compact JSON for ``value``; equal values built the same way give equal bytes."""
        tree = self.encode(value, path=path)
        try:
            text = _JSON_OUT.encode(tree)
        except RecursionError as exc:
            raise SerializationError("value is nested too deeply to write", path=path) from exc
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            return _JSON_OUT_ASCII.encode(tree).encode("ascii")

    def loads(self, data: bytes | bytearray | memoryview, *, path: str = "value") -> Any:
        """The value ``dumps`` was given; malformed input raises SerializationError."""
        try:
            tree = _JSON_IN.decode(str(data, "utf-8"))
        except (ValueError, TypeError, BufferError, RecursionError) as exc:
            # JSONDecodeError and UnicodeDecodeError are ValueErrors.
            raise SerializationError(
                f"stored bytes are not valid UTF-8 JSON ({exc})", path=path
            ) from exc
        return self.decode(tree, path=path)

    def encode(self, value: Any, *, path: str = "value") -> Any:
        """``value`` as a tree of JSON-native objects (fresh containers, never the caller's)."""
        try:
            return self._enc(value, 0)
        except _Fail as fail:
            if fail.too_deep and _has_cycle(value, set(), set()):
                fail = _Fail(
                    "contains a reference cycle (a container that contains itself); "
                    "persistkit stores trees, not graphs"
                )
            raise fail.error(path) from fail.__cause__
        except RecursionError as exc:
            raise SerializationError("value is nested too deeply", path=path) from exc

    def decode(self, tree: Any, *, path: str = "value", plain: bool = False) -> Any:
        """The value a tree from ``encode`` stands for; malformed trees raise SerializationError,
        a value that no longer fits its class SchemaVersionError.

        ``plain``: models and dataclasses (at any depth) become :class:`Plain` dicts of
        their fields, upgraded by their class's migrations: what a migration is handed."""
        try:
            return (self._twin() if plain else self)._dec(tree, 0)
        except _Fail as fail:
            raise fail.error(path) from fail.__cause__
        except RecursionError as exc:
            raise SerializationError("stored value is nested too deeply", path=path) from exc

    def encode_exception(self, exc: BaseException) -> Any:
        """A tree recording ``exc``: class name, args (repr() for unencodable ones), str, notes."""
        return self._enc_exception(exc, 0)

    def decode_exception(self, tree: Any, *, path: str = "exception") -> BaseException:
        """The recorded exception, or a StepFailedError describing it if it cannot be revived.

        A malformed tree raises SerializationError; a value in its arguments that no
        longer fits its class, SchemaVersionError.
        """
        if type(tree) is not dict or tree.get(TAG) != "ex":
            raise SerializationError("not a recorded exception", path=path)
        try:
            return self._dec_exception(tree, 0)
        except _Fail as fail:
            raise fail.error(path) from fail.__cause__
        except (ValueError, TypeError, RecursionError) as exc:
            raise SerializationError(f"malformed recorded exception ({exc})", path=path) from exc

    def _twin(self) -> Serializer:
        twin = self._plain_twin
        if twin is None:
            twin = copy.copy(self)
            twin.plain = True
            twin._plain_twin = twin
            twin._solid = self
            self._plain_twin = twin
        return twin

    # -- encoding -----------------------------------------------------------

    def _enc(self, value: Any, depth: int) -> Any:
        # Hot path: exact-type checks for JSON-native values, one frame per level,
        # and no path bookkeeping unless something fails.
        t = type(value)
        if t is str or value is None or t is bool:
            return value
        if t is int:
            return value if -_BIG < value < _BIG else {TAG: "i", "v": hex(value)}
        if t is float:
            if -_INF < value < _INF:
                return value
            return {TAG: "f", "v": "nan" if value != value else ("inf" if value > 0 else "-inf")}
        if depth >= MAX_DEPTH:
            raise _too_deep()
        enc = self._enc
        d = depth + 1
        if t is dict:
            out: dict[str, Any] = {}
            try:
                for k, v in value.items():
                    if type(k) is not str or k == TAG:
                        break
                    tv = type(v)  # strings, None and bools inline: no call for the commonest values
                    out[k] = v if tv is str or v is None or tv is bool else enc(v, d)
                else:
                    return out
            except _Fail as fail:
                fail.parts.append(_key_seg(k))
                raise
            return self._enc_pairs(value, depth)
        if t is list:
            items: list[Any] = []
            append = items.append
            try:
                for v in value:
                    tv = type(v)
                    append(v if tv is str or v is None or tv is bool else enc(v, d))
            except _Fail as fail:
                fail.parts.append(f"[{len(items)}]")
                raise
            return items
        handler = _ENCODERS.get(t) or _KINDS.get(t) or _classify(t)
        return handler(self, value, depth)

    def _enc_pairs(self, value: dict[Any, Any], depth: int) -> Any:
        enc = self._enc
        d = depth + 3
        pairs: list[Any] = []
        try:
            for k, v in value.items():
                key_ok = False
                ek = enc(k, d)
                key_ok = True
                pairs.append([ek, enc(v, d)])
        except _Fail as fail:
            fail.parts.append(_key_seg(k) if key_ok else f"[<key {k!r:.40}>]")
            raise
        return {TAG: "d", "v": pairs}

    def _enc_tuple(self, value: Any, depth: int) -> Any:
        return {TAG: "t", "v": _items(self._enc, value, depth + 2)}

    def _enc_set(self, value: Any, depth: int) -> Any:
        # Sorting by JSON text makes the bytes independent of hash seeds and insertion order.
        try:
            items = sorted(_items(self._enc, value, depth + 2), key=_JSON_OUT.encode)
        except _Fail as fail:
            fail.parts[-1] = "{" + fail.parts[-1][1:-1] + "}"  # "[i]" -> "{i}": i-th element
            raise
        return {TAG: "s" if type(value) is set else "fs", "v": items}

    def _enc_datetime(self, value: Any, depth: int) -> Any:
        tag = "dt" if type(value) is datetime else "tm"
        if value.tzinfo is None and not value.fold:
            return {TAG: tag, "v": value.isoformat()}
        spec = tz_spec(value.tzinfo)
        if spec is NO_TZ:
            return self._fallback(
                value,
                f"its tzinfo {_type_name(type(value.tzinfo))} is not "
                "supported; use zoneinfo.ZoneInfo or datetime.timezone",
            )
        return {TAG: tag, "v": [value.replace(tzinfo=None).isoformat(), spec, value.fold]}

    def _enc_enum(self, value: Any, depth: int) -> Any:
        name = _auto_register(type(value))
        try:
            v = self._enc(value._value_, depth + 1)
        except _Fail as fail:
            fail.parts.append(".value")
            raise
        return {TAG: "e", "c": name, "v": v}

    def _enc_model(self, value: Any, depth: int) -> Any:
        name = _auto_register(type(value))
        out = _fields(self._enc, value.__dict__.items(), depth + 2)
        extra = value.__pydantic_extra__
        if extra:
            out.update(_fields(self._enc, extra.items(), depth + 2))
        return {TAG: "m", "c": name, "v": out}

    def _enc_versioned(self, value: Any, depth: int) -> Any:
        # Only classes registered with a version > 1 come here (_classify): the stamp
        # costs the others nothing. Absent means version 1.
        node = (self._enc_model if isinstance(value, _base_model()) else self._enc_dataclass)(value, depth)
        return {TAG: node[TAG], "c": node["c"], "r": VERSIONS.get(type(value), 1), "v": node["v"]}

    def _enc_dataclass(self, value: Any, depth: int) -> Any:
        cls: type = type(value)
        name = _auto_register(cls)
        missing = object()
        pairs = [(f, getattr(value, f, missing)) for f, _ in _dc_fields(cls)]
        # A non-init field with no default may never have been set: leave it out.
        out = _fields(self._enc, [p for p in pairs if p[1] is not missing], depth + 2)
        return {TAG: "dc", "c": name, "v": out}

    def _enc_namedtuple(self, value: Any, depth: int) -> Any:
        return {
            TAG: "nt",
            "c": _auto_register(type(value)),
            "v": _items(self._enc, value, depth + 2),
        }

    def _enc_exception(self, exc: BaseException, depth: int) -> Any:
        args: list[Any] = []
        for a in exc.args:
            try:
                args.append(self._enc(a, depth + 3))
            except (_Fail, RecursionError):
                args.append(_safe_repr(a))
        try:
            text = str(exc)
        except Exception:  # a broken __str__ must not stop the failure from being recorded
            text = _safe_repr(exc)
        v: dict[str, Any] = {"args": args, "str": text}
        notes = getattr(exc, "__notes__", None)
        if isinstance(notes, list) and notes:
            v["notes"] = [n if type(n) is str else _safe_repr(n) for n in notes]
        name = class_name(type(exc))
        _names.warn_unrevivable(name, type(exc), self.allow_modules)
        return {TAG: "ex", "c": name, "v": v}

    def _enc_subclass(self, value: Any, depth: int) -> Any:
        # Storing it as the base type would silently change its type on replay.
        base = next(b for b in (str, int, float) if isinstance(value, b)).__name__
        return self._fallback(
            value,
            f"{_type_name(type(value))} is a subclass of {base} and would come back as a plain "
            f"{base}; convert it with {base}(...) first",
        )

    def _enc_list_like(self, value: Any, depth: int) -> Any:
        # list/dict subclasses (change tracking, OrderedDict) are stored as plain ones.
        return self._enc(dict(value) if isinstance(value, dict) else list(value), depth)

    def _enc_unknown(self, value: Any, depth: int) -> Any:
        # No suggestion to register the class or to pickle (the README promises no pickle):
        # neither makes a function, a lock or an arbitrary class storable.
        cls = type(value)
        stored = "JSON-like data, pydantic models, dataclasses, namedtuples and enums"
        if _REGISTRY.get(class_name(cls)) is cls:
            why = f"{_type_name(cls)} is registered, but persistkit stores only {stored}; make it one of those"
        elif cls.__module__.partition(".")[0] in _LIVE_MODULES:
            why = (
                f"cannot serialize an object of type {_type_name(cls)}: persistkit stores {stored}, and a "
                f"{_type_name(cls)} (a function, lock, client or other object of Python's own) is none of "
                "those. Keep it out of run.state and step results, and store the data it stands for"
            )
        else:
            why = (
                f"cannot serialize an object of type {_type_name(cls)}: persistkit stores {stored}; "
                "make the class one of those, or convert the object to one before storing it"
            )
        return self._fallback(value, why)

    def _fallback(self, value: Any, why: str) -> Any:
        if not self.allow_pickle:
            raise _Fail(why)
        try:
            import pickle  # only with allow_pickle: not paid by every import

            data = pickle.dumps(value, protocol=5)
        except Exception as exc:
            raise _Fail(f"cannot pickle a {_type_name(type(value))}: {exc}") from exc
        return {TAG: "x", "v": base64.b64encode(data).decode("ascii")}

    # -- decoding -----------------------------------------------------------

    def _dec(self, node: Any, depth: int) -> Any:
        t = type(node)
        if t is str:
            return node if self.reveal is None or "$CRED{" not in node else self.reveal(node)
        if t is int or node is None or t is bool or t is float:
            return node
        if depth >= MAX_DEPTH:
            raise _too_deep()
        dec = self._dec
        d = depth + 1
        if t is dict:
            if TAG in node:
                return self._dec_tagged(node, depth)
            out: dict[str, Any] = {}
            reveal = self.reveal
            try:
                for k, v in node.items():
                    # a key is text too: its handles (and escaped literal "$CRED{") come back as values do
                    out[k if reveal is None or "$CRED{" not in k else reveal(k)] = dec(v, d)
            except _Fail as fail:
                fail.parts.append(_key_seg(k))
                raise
            return out
        if t is list:
            return _items(self._dec, node, d)
        raise _Fail(f"a {t.__name__} is not a valid serialized value")

    def _dec_tagged(self, node: dict[str, Any], depth: int) -> Any:
        tag = node[TAG]
        handler = _DECODERS.get(tag) if type(tag) is str else None
        if handler is None:
            raise _Fail(f"unknown tag {tag!r:.40}; the data is corrupt or from a newer persistkit")
        try:
            return handler(self, node, depth)
        except (_Fail, SecretResolutionError):  # a handle no resolver knows is not malformed data
            raise
        except ShapeError as exc:  # well-formed, but no longer fits its class (or its chain failed)
            raise _Fail("does not fit its class", render=exc.render) from exc.__cause__
        except Exception as exc:
            # The single boundary where stdlib parsers and revived classes' own
            # constructors/validators fail on bad data; the path is added on unwind.
            raise _Fail(f"malformed {tag!r} value: {type(exc).__name__}: {exc}") from exc

    def _resolve(self, node: dict[str, Any], check: Callable[[type], bool], kind: str) -> type:
        name = node.get("c")
        if type(name) is not str:
            raise _Fail(f"a {kind} without a class name")
        cls = _REGISTRY.get(name) or self._resolved.get(name)
        if cls is None:
            cls = self._import_class(name, kind)
        if not check(cls):
            raise _Fail(f"class {name} is not a {kind}")
        return cls

    def _import_class(self, name: str, kind: str) -> type:
        """The class defined under exactly ``name`` in an allowlisted module (``_names``)."""
        parsed = _names.parse(name)
        trusted = parsed is not None and _names.trusted(parsed[0], self.allow_modules)
        if parsed is None or not trusted:
            fix = (
                f"register it with persistkit.register({name.replace(':', '.')}), annotate the step's "
                f"return type with it, or allow your module with pk.connect(..., allow_modules="
                f"[{name.partition(':')[0]!r}])"
            )
            head = f"cannot revive {kind} class {name}: it is not registered in this process"
            raise _Fail(_names.refusal(name, f"a {kind} class", fix, head=head))
        try:
            obj: Any = _names.defined(*parsed)
        except Exception as exc:
            raise _Fail(f"cannot find class {name} ({type(exc).__name__}: {exc})") from exc
        if not isinstance(obj, type):
            raise _Fail(
                f"cannot revive {kind} class: {name} is no class defined under that name in its "
                "module (renamed or removed? a stored name never reaches what a module imported "
                "from elsewhere; if your code did not write it, the record may be forged)"
            )
        self._resolved[name] = obj
        return obj

    def _dec_exception(self, node: dict[str, Any], depth: int) -> BaseException:
        v = payload(node, dict, with_class=True)
        name, args, text = node["c"], v.get("args"), v.get("str")
        notes = v.get("notes", [])
        if type(name) is not str or type(args) is not list or type(text) is not str:
            raise ValueError("exception record needs a class name, args and str")
        if type(notes) is not list or any(type(n) is not str for n in notes):
            raise ValueError("exception notes must be strings")
        type_name = name.replace(":", ".").removeprefix("builtins.")
        try:
            cls = _find_exception(self, name)
            exc = cls(*_items(self._solid._dec, args, depth + 3))
        except Exception as why:
            if isinstance(why, _Fail) and why.render is not None:
                why.parts.append(".args")
                raise  # a recorded value whose class changed shape: a migration can fix it
            reason = why.msg if isinstance(why, _Fail) else f"{type(why).__name__}: {why}"
            return StepFailedError(
                f"step failed with {type_name}: {text} (the exception could not be revived: "
                f"{reason})",
                type_name=type_name,
                original_message=text,
            )
        for n in notes:
            exc.add_note(n)
        return exc

    def _dec_model(self, node: dict[str, Any], depth: int) -> Any:
        return self._dec_object(node, depth, _is_model, "pydantic model", validate_model)

    def _dec_dataclass(self, node: dict[str, Any], depth: int) -> Any:
        return self._dec_object(node, depth, dataclasses.is_dataclass, "dataclass", validate_dataclass)

    def _dec_object(
        self, node: dict[str, Any], depth: int, check: Callable[[Any], bool], kind: str, make: Callable[..., Any]
    ) -> Any:
        """A stored model or dataclass, upgraded by its class's migrations if it is older."""
        stored = _stamp(node)
        fields = payload(node, dict, True) if len(node) == 3 else node["v"]
        if type(fields) is not dict:
            raise ValueError(f"payload is {type(fields).__name__}")
        if self.plain:
            data = _fields(self._dec, fields.items(), depth + 2)
            try:
                cls: Any = self._resolve(node, check, kind)
            except _Fail:
                cls = None  # not revivable here: the migration may replace it, else revive() says so
            if cls is not None and stored != VERSIONS.get(cls, 1):
                data = chain(cls, stored, data)[0]
            return Plain(data, cls, str(node.get("c")))
        cls = self._resolve(node, check, kind)
        if stored == VERSIONS.get(cls, 1):  # the commonest case: one dict lookup more than before
            return make(cls, _fields(self._dec, fields.items(), depth + 2))
        # Older (or newer: chain() refuses it): the migrations get plain data, nested
        # values already at their classes' versions; what they leave in place is revived.
        data = _fields(self._twin()._dec, fields.items(), depth + 2)
        data, ran = chain(cls, stored, data)
        return make(cls, revive(data), stored, ran)


def _is_model(cls: Any) -> bool:
    return issubclass(cls, _base_model())


def _stamp(node: dict[str, Any]) -> int:
    """The version stamped on a model or dataclass node (``"r"``); 1 when absent."""
    if len(node) == 3:
        return 1
    r = node.get("r")
    if len(node) != 4 or type(r) is not int or r < 1 or "v" not in node or "c" not in node:
        raise ValueError("unexpected keys " + repr(sorted(node)))
    return r


def _safe_repr(obj: Any) -> str:
    try:
        return repr(obj)
    except Exception:  # repr of a user object may raise; the record must still be written
        return f"<{type(obj).__qualname__} object>"


def _find_exception(ser: Serializer, name: str) -> type[BaseException]:
    """A recorded error's class (:func:`exception_class`), or a ``_Fail`` that makes it a
    ``StepFailedError`` carrying the class name and the message as data."""
    cls = ser._resolved.get(name) or _names.exception_class(name, ser.allow_modules)
    if cls is None or not issubclass(cls, BaseException):
        raise _Fail(f"{name} is not an exception class this process may revive (not registered, "
                    "built in, or defined in an allowlisted module)")
    ser._resolved[name] = cls
    return cls


def _classify(t: type) -> _EncFn:
    """Pick (and cache) the encoder for a type that is not in the exact-type table."""
    if VERSIONS.get(t, 1) > 1:
        fn: _EncFn = Serializer._enc_versioned
    elif issubclass(t, Enum):
        fn = Serializer._enc_enum
    elif issubclass(t, _base_model()):
        fn = Serializer._enc_model
    elif dataclasses.is_dataclass(t):
        fn = Serializer._enc_dataclass
    elif issubclass(t, BaseException):
        fn = Serializer._enc_exception
    elif _is_namedtuple(t):
        fn = Serializer._enc_namedtuple
    elif any(b.__module__.startswith("pydantic") and b.__name__ in ("SecretStr", "SecretBytes") for b in t.__mro__):
        fn = _enc_secret  # pydantic's classes and subclasses (a lazily resolved one read back, too)
    elif issubclass(t, (list, dict)):
        fn = Serializer._enc_list_like
    elif issubclass(t, (str, int, float)):
        fn = Serializer._enc_subclass
    else:
        fn = Serializer._enc_unknown
    if len(_KINDS) > 4096:
        _KINDS.clear()
    _KINDS[t] = fn
    return fn


def _dec_pairs(self: Serializer, node: dict[str, Any], depth: int) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for i, pair in enumerate(payload(node, list)):
        if type(pair) is not list or len(pair) != 2:
            raise ValueError(f"item {i} is not a [key, value] pair")
        try:
            k = self._solid._dec(pair[0], depth + 3)  # a key must be hashable: never a Plain dict
            out[k] = self._dec(pair[1], depth + 3)
        except _Fail as fail:
            fail.parts.append(f"[<pair {i}>]")
            raise
    return out


def _dec_set(self: Serializer, node: dict[str, Any], depth: int) -> Any:
    items = _items(self._solid._dec, payload(node, list), depth + 2)  # hashable: never a Plain dict
    return set(items) if node[TAG] == "s" else frozenset(items)


def _dec_enum(self: Serializer, node: dict[str, Any], depth: int) -> Any:
    cls: Any = self._resolve(node, lambda c: issubclass(c, Enum), "Enum")
    if "v" not in node or len(node) != 3:
        raise ValueError("expected c and v")
    return cls(self._dec(node["v"], depth + 1))


def _dec_namedtuple(self: Serializer, node: dict[str, Any], depth: int) -> Any:
    cls: Any = self._resolve(node, _is_namedtuple, "namedtuple")
    return cls(*_items(self._dec, payload(node, list, True), depth + 2))


def _dec_pickle(self: Serializer, node: dict[str, Any], depth: int) -> Any:
    if not self.allow_pickle:
        raise _Fail(
            "the stored value is pickled; decode it with Serializer(allow_pickle=True) "
            "only if you trust the store"
        )
    import pickle

    return pickle.loads(payload_bytes(node))


def _enc_secret(self: Serializer, value: Any, depth: int) -> Any:
    return (self.secrets or default_redactor()).encode_secret(value)


_ENCODERS: dict[type, _EncFn] = {
    **ENCODERS,
    Secret: _enc_secret,
    tuple: Serializer._enc_tuple,
    set: Serializer._enc_set,
    frozenset: Serializer._enc_set,
    datetime: Serializer._enc_datetime,
    time: Serializer._enc_datetime,
}

_DECODERS: dict[str, _DecFn] = {
    **DECODERS,
    "t": lambda s, n, d: tuple(_items(s._dec, payload(n, list), d + 2)),
    "s": _dec_set,
    "fs": _dec_set,
    "d": _dec_pairs,
    "e": _dec_enum,
    "m": Serializer._dec_model,
    "dc": Serializer._dec_dataclass,
    "nt": _dec_namedtuple,
    "ex": Serializer._dec_exception,
    "x": _dec_pickle,
    "sec": lambda s, n, d: (s.secrets or default_redactor()).decode_secret(n),
}


def _forget(cls: type) -> None:
    _KINDS.pop(cls, None)  # its encoder is chosen again, with or without the version stamp


ON_CHANGE.append(_forget)
