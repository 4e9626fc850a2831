"""Versions and migrations of stored values of any registered class (not only ``pk.State``).

``pk.register(Msg, version=2)`` stamps the version on every stored ``Msg``
(``"r": 2`` in its type tag, see ``_serde``); ``@pk.migration(Msg,
from_version=1)`` upgrades a stored ``Msg``'s fields, handed over as a plain
dict, to the next version. A value stored without a stamp is version 1, as
an unversioned ``pk.State`` is: the first ``pk.register(Msg, version=2)``
needs exactly one migration, from 1. A state stored as a plain dict (no
schema) stays version 0 of a ``pk.State``; values have no version 0.

Migrations work on *plain data*: a stored model or dataclass nested in what a
migration is handed is a :class:`Plain` dict of its fields (at any depth, in
lists, dicts and tuples), already upgraded by its own class's chain. After
the migration, the nodes it left as they were are revived as their class
(:func:`revive`); a dict it built in their place is validated by the
annotation of the field that holds it.

This module owns the registry and the rules; ``_serde`` calls it only for a
class that has a version or migrations, so a value of any other class costs
one dict lookup at decode time and nothing at encode time.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any

from .._errors import ConfigurationError
from ._functions import register_function
from ._registry import _base_model, _is_namedtuple, class_name
from ._registry import register as _register_class

__all__ = [
    "Plain",
    "ShapeError",
    "chain",
    "code_version",
    "register",
    "register_version",
    "revive",
    "validate",
]

MigrationFn = Callable[[dict[str, Any]], dict[str, Any]]

#: class -> the version its stored values are stamped with (only classes given one, > 1 or not).
VERSIONS: dict[type, int] = {}
#: (class, from_version) -> the function upgrading a stored value to from_version + 1.
MIGRATIONS: dict[tuple[type, int], MigrationFn] = {}
_LOCK = threading.Lock()
#: Called with a class whose version changed (``_serde`` drops its cached encoder).
ON_CHANGE: list[Callable[[type], None]] = []


class ShapeError(Exception):
    """Internal: a stored value does not fit its class, or its chain cannot run.

    ``render(path)`` makes the message once the serializer knows where the value
    sits (e.g. ``state.messages[3]``); ``loc`` is the field inside it, if known.
    """

    def __init__(self, render: Callable[[str], str]) -> None:
        super().__init__("stored value does not fit its class")
        self.render = render


class Plain(dict[str, Any]):
    """A stored model or dataclass handed to a migration as the dict of its fields.

    It is a ``dict`` for the migration; ``pk_class`` (None if the class is not
    revivable in this process) lets :func:`revive` make the object again when the
    migration leaves it in place.
    """

    __slots__ = ("pk_class", "pk_name")

    def __init__(self, fields: dict[str, Any], cls: type | None, name: str) -> None:
        super().__init__(fields)
        self.pk_class = cls
        self.pk_name = name


def _label(cls: type) -> str:
    return cls.__name__  # as the user's code names it in the decorator lines we suggest


def versionable(cls: type) -> bool:
    """Whether values of ``cls`` can carry a version: pydantic models and dataclasses."""
    return issubclass(cls, _base_model()) or dataclasses.is_dataclass(cls)


_C = typing.TypeVar("_C", bound=type)


_F = typing.TypeVar("_F", bound=Callable[..., Any])


@typing.overload
def register(cls: _C, *, version: int | None = None) -> _C: ...
@typing.overload
def register(cls: _F) -> _F: ...
@typing.overload
def register(cls: None = None, *, version: int | None = None) -> Callable[[_C], _C]: ...
def register(cls: Any = None, *, version: int | None = None) -> Any:
    """Make ``cls`` revivable on decode: ``pk.register(Msg)``, ``@pk.register``.

    On a function (``@pk.register`` above ``def post_reply(...)``): let a stored record call
    it, as an after-commit effect or a compensation. A stored record calls no other function
    (docs/security.md), so register each where it is defined: the process that runs it
    after a crash (a resume, a drain, a rollback) registers it by importing that module.

    ``version=n`` (pydantic models and dataclasses) stamps ``n`` on every stored
    value of the class; ``@pk.migration(cls, from_version=v)`` upgrades older
    ones on load. A value stored without a stamp is version 1. Without
    ``version=``, a version given before is kept. ``@pk.register(version=2)``
    is the decorator form.
    """
    if cls is None:
        return lambda c: register(c, version=version)
    if not isinstance(cls, type) and (inspect.isfunction(cls) or isinstance(cls, staticmethod)):
        if version is not None:
            raise ConfigurationError(f"persistkit.register({cls!r}, version=...): a function has no version")
        register_function(cls, "persistkit.register()")
        return cls
    if not isinstance(cls, type):
        raise ConfigurationError(f"persistkit.register() takes a class, got {cls!r}")
    if version is not None:
        register_version(cls, version)
    _register_class(cls)
    return cls


def register_version(cls: type, version: Any) -> None:
    """Set the version ``cls``'s values are stored with (``pk.register(cls, version=n)``)."""
    name = _label(cls)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ConfigurationError(
            f"persistkit.register({name}, version={version!r}): version must be an int >= 1"
        )
    if hasattr(cls, "__pk_schema__") and issubclass(cls, _base_model()):
        raise ConfigurationError(
            f"persistkit.register({name}, version={version}): {name} is a pk.State; declare its "
            f"version on the class: class {name}(pk.State, version={version})"
        )
    if not versionable(cls):
        kind = "an Enum" if issubclass(cls, Enum) else ("a namedtuple" if _is_namedtuple(cls) else "neither")
        raise ConfigurationError(
            f"persistkit.register({name}, version={version}): only pydantic models and dataclasses "
            f"carry a version; {name} is {kind}. Register it without version=, and convert its "
            "stored values in the migration of the model or state that holds them"
        )
    with _LOCK:
        below = [v for (c, v) in MIGRATIONS if c is cls and v >= version]
        if below:
            raise ConfigurationError(
                f"persistkit.register({name}, version={version}): a migration from "
                f"version {max(below)} is registered, so the version must be at least {max(below) + 1}"
            )
        VERSIONS[cls] = version
    for fn in ON_CHANGE:
        fn(cls)


def register_migration(cls: type, from_version: Any) -> Callable[[MigrationFn], MigrationFn]:
    """``@pk.migration(cls, from_version=v)`` for a class registered with a version."""
    name = _label(cls)
    version = VERSIONS.get(cls)
    if version is None:
        what = "a pydantic model or dataclass" if versionable(cls) else "not a pydantic model or dataclass"
        raise ConfigurationError(
            f"@pk.migration({name}, from_version={from_version!r}): {name} ({what}) has no version. "
            f"Give it one first: pk.register({name}, version=2) (or @pk.register(version=2) on the "
            "class), then register the migration from version 1 (a value stored without a version)"
        )
    if (
        not isinstance(from_version, int)
        or isinstance(from_version, bool)
        or not 1 <= from_version < version
    ):
        raise ConfigurationError(
            f"@pk.migration({name}, from_version={from_version!r}): from_version must be between 1 "
            f"(values stored before the class had a version) and {version - 1} ({name} is version "
            f"{version}: pk.register({name}, version={version}))"
        )

    def add(fn: MigrationFn) -> MigrationFn:
        if not callable(fn):
            raise ConfigurationError(f"@pk.migration decorates a function, got {fn!r}")
        with _LOCK:
            key = (cls, from_version)
            if key in MIGRATIONS and MIGRATIONS[key] is not fn:
                raise ConfigurationError(
                    f"a migration of {name} from version {from_version} is already registered"
                )
            MIGRATIONS[key] = fn
        return fn

    return add


def code_version(cls: type) -> int:
    return VERSIONS.get(cls, 1)


def described(cls: type, v: int) -> str:
    fn = MIGRATIONS[(cls, v)]
    return (
        f"migration {getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))} "
        f"(@pk.migration({_label(cls)}, from_version={v}))"
    )


_OLD_CODE = "or finish the runs that stored it with the code that stored it"


_ran = threading.local()


def migrations_ran() -> int:
    """How many class-migration chains this thread has run (compared before and after a decode)."""
    n: int = getattr(_ran, "n", 0)
    return n


def chain(cls: type, stored: int, data: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``data`` (plain fields of a value stored at ``stored``) upgraded to the code's version of
    ``cls``, and the last migration that ran ("" if none). Raises :class:`ShapeError`."""
    code = VERSIONS.get(cls, 1)
    label = _label(cls)
    if stored > code:
        raise ShapeError(
            lambda at: f"{at}: the stored {label} ({class_name(cls)}) is version {stored}, newer than "
            f"the code's version {code}. Deploy the code that stored it (pk.register({label}, "
            f"version={stored}) and its migrations), or fork the thread from an older checkpoint"
        )
    missing = [v for v in range(stored, code) if (cls, v) not in MIGRATIONS]
    if missing:
        add = " and ".join(f"@pk.migration({label}, from_version={v})" for v in missing)
        raise ShapeError(
            lambda at: f"{at}: the stored {label} ({class_name(cls)}) is version {stored}, the code "
            f"registers version {code}, and no migration from version {missing[0]} to "
            f"{missing[0] + 1} is registered. Nothing was written. Add {add} (each takes the stored "
            f"fields as a dict and returns them upgraded), {_OLD_CODE}"
        )
    last = ""
    for v in range(stored, code):
        what = described(cls, v)
        try:
            out = MIGRATIONS[(cls, v)](data)
        except Exception as exc:
            raise ShapeError(_at(
                f"{what} failed on the stored {label}: {type(exc).__name__}: {exc}. "
                "Nothing was written; fix the migration and resume again"
            )) from exc
        if not isinstance(out, dict):
            raise ShapeError(_at(
                f"{what} returned {type(out).__name__}, not the dict of fields. "
                "Nothing was written; return the dict and resume again"
            ))
        data, last = out, what
    if stored < code:
        _ran.n = migrations_ran() + 1
    return data, last


def _at(text: str) -> Callable[[str], str]:
    return lambda at: f"{at}: {text}"


def _remedy(cls: type) -> str:
    label, v = _label(cls), VERSIONS.get(cls, 1)
    return (
        f"Either upgrade the stored values with a migration: pk.register({label}, version={v + 1}) "
        f"and @pk.migration({label}, from_version={v}) def upgrade(data: dict) -> dict: ...; "
        f"return data — {_OLD_CODE}"
    )


def _unfit(cls: type, stored: int, ran: str, loc: str, detail: str) -> ShapeError:
    label = _label(cls)

    def render(at: str) -> str:
        where = f"{at}.{loc}" if loc else at
        if ran:
            return (
                f"{where}: after {ran} the value does not validate as {label} version "
                f"{VERSIONS.get(cls, 1)} ({detail}). Nothing was written; fix the migration and resume again"
            )
        return (
            f"{where}: the stored {label} ({class_name(cls)}, version {stored}) does not fit the "
            f"class any more ({detail}): its fields changed since the value was stored. Nothing was "
            f"written. {_remedy(cls)}"
        )

    return ShapeError(render)


#: Per class, what decoding one of its values needs, found once: a model's
#: (field names or None if it keeps extras, whether it is a RootModel, validate
#: keywords); a dataclass's ({field: init?}, required init fields).
_PLANS: dict[type, Any] = {}


def _plan(cls: Any) -> Any:
    if issubclass(cls, _base_model()):
        from pydantic import RootModel

        known = None if cls.model_config.get("extra") == "allow" else frozenset(cls.model_fields)
        plan: Any = (known, issubclass(cls, RootModel), validate_kw())
    else:
        fields = dataclasses.fields(cls)
        required = frozenset(
            f.name for f in fields
            if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )
        plan = ({f.name: f.init for f in fields}, required)
    if len(_PLANS) > 4096:
        _PLANS.clear()
    _PLANS[cls] = plan
    return plan


def validate(cls: Any, data: dict[str, Any], stored: int = 1, ran: str = "") -> Any:
    """A ``cls`` (model or dataclass) from its stored fields: unknown, missing or invalid
    fields are a :class:`ShapeError`."""
    if issubclass(cls, _base_model()):
        return validate_model(cls, data, stored, ran)
    return validate_dataclass(cls, data, stored, ran)


def validate_model(cls: Any, data: dict[str, Any], stored: int = 1, ran: str = "") -> Any:
    known, root, kw = _PLANS.get(cls) or _plan(cls)
    if root:
        try:
            return cls.model_validate(data["root"], **kw)
        except (ValueError, KeyError) as exc:  # pydantic's ValidationError is a ValueError
            raise _unfit(cls, stored, ran, "root", _detail(exc)) from exc
    if known is not None and not known.issuperset(data):
        unknown = sorted(set(data) - known)
        missing = sorted(n for n, f in cls.model_fields.items() if f.is_required() and n not in data)
        lacks = f", and lacks required field(s) {missing}" if missing else ""
        raise _unfit(
            cls, stored, ran, unknown[0],
            f"stored field(s) {unknown} that {_label(cls)} does not declare{lacks}; loading "
            f"would drop their data (its fields: {sorted(known)})",
        )
    try:
        return cls.model_validate(data, **kw)
    except ValueError as exc:  # pydantic's ValidationError (also a validator's own ValueError)
        errors = exc.errors(include_url=False) if hasattr(exc, "errors") else []
        loc = _loc(errors[0].get("loc")) if errors else ""
        raise _unfit(cls, stored, ran, loc, _detail(exc)) from exc


def validate_dataclass(cls: Any, data: dict[str, Any], stored: int = 1, ran: str = "") -> Any:
    fields, required = _PLANS.get(cls) or _plan(cls)
    if not fields.keys() >= data.keys():
        unknown = sorted(set(data) - set(fields))
        raise _unfit(
            cls, stored, ran, unknown[0],
            f"stored field(s) {unknown} that {_label(cls)} does not declare; loading would drop "
            f"their data (its fields: {sorted(fields)})",
        )
    if not required <= data.keys():
        missing = sorted(required - data.keys())
        raise _unfit(cls, stored, ran, missing[0], f"required field(s) {missing} were not stored")
    try:
        obj = cls(**{k: v for k, v in data.items() if fields[k]})
    except Exception as exc:  # the class's own checks (__post_init__) refusing the stored fields
        raise _unfit(cls, stored, ran, "", f"{_label(cls)}(...) raised {type(exc).__name__}: {exc}") from exc
    for k, v in data.items():
        if not fields[k]:
            object.__setattr__(obj, k, v)  # non-init fields, also on frozen dataclasses
    return obj


def _loc(loc: Any) -> str:
    """A pydantic error location as a path: ``items[0].name``."""
    out = ""
    for x in loc or ():
        out += f"[{x}]" if isinstance(x, int) else (f".{x}" if out else str(x))
    return out


def _detail(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if errors is None:
        return f"{type(exc).__name__}: {exc}"
    parts = errors(include_url=False)
    text = "; ".join(
        f"{_loc(e.get('loc')) or '(value)'}: {e.get('msg')}" for e in parts[:3]
    )
    return text + (f"; and {len(parts) - 3} more" if len(parts) > 3 else "")


def revive(value: Any, path: str = "") -> Any:
    """``value`` with every :class:`Plain` node a migration left in place made its class again
    (innermost first). A failure is a :class:`ShapeError` whose ``render(at)`` gets the
    path of ``value``; ``path`` is the path below it."""
    t = type(value)
    if t is Plain:
        fields = {k: revive(v, f"{path}.{k}") for k, v in value.items()}
        cls = value.pk_class
        if cls is None:
            name = value.pk_name
            raise ShapeError(
                lambda at: f"{at}{path}: cannot revive {name}: it is not registered in this process. "
                f"Register it with persistkit.register(...), or have the migration replace it with plain data"
            )
        try:
            return validate(cls, fields)
        except ShapeError as exc:
            render = exc.render
            raise ShapeError(lambda at: render(at + path)) from exc.__cause__
    if isinstance(value, dict):
        return {k: revive(v, f"{path}[{k!r}]") for k, v in value.items()}
    if isinstance(value, list):
        out = [revive(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return out if t is list else t(out)
    if isinstance(value, tuple):
        items = [revive(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return t(*items) if _is_namedtuple(t) else t(items)
    return value


@functools.cache
def validate_kw() -> dict[str, bool]:
    # pydantic >= 2.11 validates by field name explicitly; older versions do so by default.
    import inspect

    from pydantic import BaseModel

    if "by_name" in inspect.signature(BaseModel.model_validate).parameters:
        return {"by_alias": False, "by_name": True}
    return {}
