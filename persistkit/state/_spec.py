"""Run state: typed, versioned, made of top-level fields ("channels").

``run.state`` is a :class:`State` (a pydantic model) or a plain ``dict``.
Each top-level field is a channel, stored on its own so an unchanged channel
costs nothing on the next checkpoint. Fields may carry a reducer
(``Annotated[list[Msg], pk.append]``) that says how :meth:`Run.update` and
``fork(update=...)`` combine a new value with the old one.

List channels are held in a :class:`TrackedList`, a ``list`` that remembers
whether anything but appending happened to it, so the commit after a step
can tell "1 KB appended" from "list rewritten" without comparing 5 MB.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, SupportsIndex

from .._errors import ConfigurationError, SchemaVersionError
from ..codec import _serde
from ..codec._registry import _base_model
from ..codec._versions import ShapeError, register_migration, revive

if TYPE_CHECKING:
    from pydantic import BaseModel


__all__ = [
    "Reducer",
    "StateSpec",
    "TrackedList",
    "add",
    "append",
    "merge",
    "migration",
    "replace",
]


# -- reducers -----------------------------------------------------------------


class Reducer:
    """How an update combines with a channel's current value: ``fn(old, new) -> value``."""

    __slots__ = ("fn", "name")

    def __init__(self, fn: Callable[[Any, Any], Any], name: str | None = None) -> None:
        if not callable(fn):
            raise ConfigurationError(f"Reducer needs a callable(old, new), got {fn!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "reducer")

    def __call__(self, old: Any, new: Any) -> Any:
        return self.fn(old, new)

    def __repr__(self) -> str:
        return f"persistkit.{self.name}" if self.name in _BUILTIN_NAMES else f"Reducer({self.name})"


def _append(old: Any, new: Any) -> Any:
    items = list(new) if isinstance(new, list | tuple) else [new]
    if old is None:
        return TrackedList(items)
    old.extend(items)
    return old


def _add(old: Any, new: Any) -> Any:
    return new if old is None else old + new


def _merge(old: Any, new: Any) -> Any:
    if old is None:
        return dict(new)
    if not isinstance(new, dict):
        raise ConfigurationError(f"merge reducer needs a dict update, got {type(new).__name__}")
    old.update(new)
    return old


#: Appends the update (an item or a list of items) to the list.
append = Reducer(_append, "append")
#: Adds the update to the value (numbers, strings, lists).
add = Reducer(_add, "add")
#: Merges the update (a dict) into the dict.
merge = Reducer(_merge, "merge")
#: Replaces the value (the default for fields without a reducer).
replace = Reducer(lambda old, new: new, "replace")
_BUILTIN_NAMES = frozenset({"append", "add", "merge", "replace"})


# -- change-tracked lists -----------------------------------------------------


class TrackedList(list[Any]):
    """A ``list`` that notes any change other than appending (``append``, ``extend``, ``+=``).

    persistkit stores a list channel as segments of appended items; a list
    that was only appended to costs one small segment per checkpoint. Any
    other mutation sets ``_pk_dirty`` and the next checkpoint rewrites it.
    """

    __slots__ = ("_pk_dirty",)

    def __init__(self, items: Iterable[Any] = ()) -> None:
        super().__init__(items)
        self._pk_dirty = False

    def __setitem__(self, index: Any, value: Any) -> None:
        self._pk_dirty = True
        super().__setitem__(index, value)

    def __delitem__(self, index: SupportsIndex | slice) -> None:
        self._pk_dirty = True
        super().__delitem__(index)

    def __imul__(self, n: SupportsIndex) -> TrackedList:
        self._pk_dirty = True
        super().__imul__(n)
        return self

    def insert(self, index: SupportsIndex, value: Any) -> None:
        self._pk_dirty = True
        super().insert(index, value)

    def pop(self, index: SupportsIndex = -1) -> Any:
        self._pk_dirty = True
        return super().pop(index)

    def remove(self, value: Any) -> None:
        self._pk_dirty = True
        super().remove(value)

    def clear(self) -> None:
        self._pk_dirty = True
        super().clear()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self._pk_dirty = True
        super().sort(*args, **kwargs)

    def reverse(self) -> None:
        self._pk_dirty = True
        super().reverse()

    def _pk_reset(self, items: list[Any]) -> None:
        """Replace the contents in place (replay) without marking the list dirty."""
        list.__setitem__(self, slice(None), items)
        self._pk_dirty = False


def _is_model_class(obj: Any) -> bool:
    # _base_model() stands in a class nothing subclasses while pydantic is not imported.
    return isinstance(obj, type) and issubclass(obj, _base_model())


_MIGRATIONS: dict[tuple[type[Any], int], Callable[[dict[str, Any]], dict[str, Any]]] = {}
_MIGRATIONS_LOCK = threading.Lock()

MigrationFn = Callable[[dict[str, Any]], dict[str, Any]]

#: pydantic TypeAdapters per state class and (field, items?), made on first use (replay checks).
_ADAPTERS: weakref.WeakKeyDictionary[type[Any], dict[tuple[str, bool], Any]] = weakref.WeakKeyDictionary()


def migration(state: type[Any], *, from_version: int) -> Callable[[MigrationFn], MigrationFn]:
    """Register ``fn(data) -> data`` upgrading the stored fields of ``state`` (a ``pk.State``
    subclass, or any class given a version with ``pk.register(cls, version=n)``) from
    ``from_version`` to ``from_version + 1``.

    ``data`` is a dict of field name to value, as plain data: a model or dataclass
    nested in it (at any depth) is a dict of its fields, already at its own class's
    current version. ``from_version=0`` upgrades a state stored as a plain dict
    (``resume()`` without ``state=``, no schema stamp): it runs, then the chain from
    version 1, whenever such a state is loaded by ``state``. Its ``data`` holds
    whatever keys the run wrote. For a registered class, a value stored without a
    version is version 1."""
    from ._model import State

    if isinstance(state, type) and not issubclass(state, State):
        return register_migration(state, from_version)
    if not (isinstance(state, type) and issubclass(state, State)):
        raise ConfigurationError(
            f"@pk.migration needs a pk.State subclass, or a class registered with a version "
            f"(pk.register(cls, version=2)), got {state!r}"
        )
    if (
        not isinstance(from_version, int)
        or isinstance(from_version, bool)
        or not 0 <= from_version < state.__pk_version__
    ):
        raise ConfigurationError(
            f"@pk.migration({state.__qualname__}, from_version={from_version!r}): "
            f"from_version must be between 0 (a state stored as a plain dict) and "
            f"{state.__pk_version__ - 1} ({state.__qualname__} is version {state.__pk_version__})"
        )

    def register(fn: MigrationFn) -> MigrationFn:
        if not callable(fn):
            raise ConfigurationError(f"@pk.migration decorates a function, got {fn!r}")
        with _MIGRATIONS_LOCK:
            key = (state, from_version)
            if key in _MIGRATIONS and _MIGRATIONS[key] is not fn:
                raise ConfigurationError(
                    f"a migration of {state.__qualname__} from version {from_version} "
                    "is already registered"
                )
            _MIGRATIONS[key] = fn
        return fn

    return register


# -- StateSpec: one object that knows how to handle a state class or dicts ------


class StateSpec:
    """Everything the runtime needs to know about a run's state type."""

    def __init__(self, state: Any = None) -> None:
        self.initial: Any = None
        if isinstance(state, _base_model()):
            self.initial = state
            state = type(state)
        elif isinstance(state, dict):
            self.initial = state
            state = dict
        self.fields: tuple[str, ...] = ()  # a model's field names (read on every checkpoint)
        self.field_set: frozenset[str] = frozenset()
        self.is_state = False
        if state is None or state is dict:
            self.cls: type[BaseModel] | None = None
            self.name: str | None = None
            self.version = 1
            self.reducers: dict[str, Reducer] = {}
            return
        if not _is_model_class(state):
            raise ConfigurationError(
                f"state={state!r}: expected a pk.State subclass (or a pydantic model), "
                "an instance of one, a dict, or None"
            )
        from ._model import State

        self.cls = state
        self.is_state = issubclass(state, State)
        if self.is_state:
            self.name = state.__pk_schema__
            self.version = state.__pk_version__
        else:
            _serde.register(state)
            for field in state.model_fields.values():
                _serde.register_type_hints(field.annotation)
            self.name = state.__qualname__
            self.version = 1
        self.fields = tuple(state.model_fields)
        self.field_set = frozenset(self.fields)
        self.reducers = {}
        for fname, field in state.model_fields.items():
            for meta in field.metadata:
                if isinstance(meta, Reducer):
                    self.reducers[fname] = meta

    @property
    def schema(self) -> tuple[str, int] | None:
        return None if self.name is None else (self.name, self.version)

    # -- creating and reading -------------------------------------------------

    def empty(self) -> Any:
        """The state of a thread that has no checkpoint yet."""
        if self.initial is not None:
            value = self.initial.model_copy(deep=True) if self.cls is not None else _deep(self.initial)
            return self.track(value)
        if self.cls is None:
            return {}
        from pydantic import ValidationError

        try:
            return self.track(self.cls())
        except ValidationError as exc:
            raise ConfigurationError(
                f"state class {self.cls.__qualname__} cannot be created without arguments ({exc}); "
                "give every field a default, or pass an instance: resume(..., state=Chat(...))"
            ) from exc

    def channels(self, state: Any) -> dict[str, Any]:
        if self.cls is None:
            if not isinstance(state, dict):
                raise ConfigurationError(
                    f"run.state must stay a dict, it was replaced by a {type(state).__name__}"
                )
            return state
        d: dict[str, Any] = state.__dict__
        if d.keys() == self.field_set:  # a model's __dict__ is its fields: read it as it is
            return d
        return {name: d[name] for name in self.fields if name in d}

    def set_channel(self, state: Any, name: str, value: Any) -> None:
        if self.cls is None:
            state[name] = value
        else:
            state.__dict__[name] = value

    def del_channel(self, state: Any, name: str) -> None:
        if self.cls is None:
            state.pop(name, None)

    def build(self, channels: dict[str, Any], stored: tuple[str, int] | None, where: str) -> Any:
        """A state object from stored channel values, migrated to the code's version.

        Every load path goes through here (or :meth:`check_names` and :meth:`check_value`
        for a replayed step): a stored field the class does not declare, or a value that
        does not validate, is a :class:`SchemaVersionError`, never a silent drop.
        """
        if self.cls is None:
            return self.track(dict(channels))
        from pydantic import ValidationError

        data, ran = self.migrate(channels, stored, where)
        self.check_names(data, stored, where, ran)
        if self.plain(stored):
            data = self._revive(data, where, ran)
        try:
            obj = self.cls.model_validate(data)
        except ValidationError as exc:
            raise self._invalid(exc, stored, where, ran) from exc
        return self.track(obj)

    def plain(self, stored: tuple[str, int] | None) -> bool:
        """Whether a state stored under ``stored`` is loaded as plain data (``Loader.value(...,
        plain=True)``): its migrations get nested models and dataclasses as dicts."""
        return self.cls is not None and stored != self.schema

    def _revive(self, data: dict[str, Any], where: str, ran: Sequence[str]) -> dict[str, Any]:
        """The nested values the migrations left as they were, made their classes again."""
        out: dict[str, Any] = {}
        for name, value in data.items():
            try:
                out[name] = revive(value)
            except ShapeError as exc:
                after = f" (after {ran[-1]})" if ran else ""
                also = ". The state migration, which is handed the value as a dict, may convert it instead" if ran else ""
                raise SchemaVersionError(exc.render(f"{where}{after}: state.{name}") + also) from exc.__cause__
        return out

    def migrate(
        self, data: dict[str, Any], stored: tuple[str, int] | None, where: str
    ) -> tuple[dict[str, Any], list[str]]:
        """``data`` upgraded from the ``stored`` schema to the code's, and the migrations that ran.

        Migrations get a deep copy: stored values are shared with the loader's cache
        (a resumed run migrates every replayed step's state from the same items)."""
        assert self.cls is not None
        if stored is None:  # a dict state: version 0 if the class has a migration from it
            if (self.cls, 0) not in _MIGRATIONS:
                return data, []  # its keys are checked as they are (check_names)
            name, version = str(self.name), 0
            origin = "a dict (no schema, version 0)"
        else:
            name, version = stored
            origin = f"{name!r} version {version}"
        if name != self.name:
            raise SchemaVersionError(
                f"{where}: stored state is schema {name!r} version {version}, but the code uses "
                f"{self.name!r} version {self.version}. If the class was renamed, declare "
                f"class {self.cls.__name__}(pk.State, name={name!r})"
            )
        if version > self.version:
            raise SchemaVersionError(
                f"{where}: stored state is {name!r} version {version}, newer than the code's "
                f"version {self.version}. Deploy the newer code, or fork from an older checkpoint"
            )
        missing = self._missing(version)
        if missing:  # named all at once: adding the one named would not be enough
            raise SchemaVersionError(
                f"{where}: stored state is {origin}, the code is version {self.version}, "
                f"and no migration from version {missing[0]} to {missing[0] + 1} is registered: "
                f"add {self._decorators(missing, self.cls.__qualname__)}"
            )
        ran: list[str] = []  # the migrations that ran, described for error messages
        if version < self.version:
            data = copy.deepcopy(data)
        for v in range(version, self.version):
            fn = _MIGRATIONS[(self.cls, v)]
            described = (
                f"migration {getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))} "
                f"(@pk.migration({self.cls.__qualname__}, from_version={v}))"
            )
            try:
                out = fn(data)
            except Exception as exc:
                raise SchemaVersionError(
                    f"{where}: {described} failed on the stored state: {type(exc).__name__}: {exc}. "
                    "Nothing was written; fix the migration and resume again"
                ) from exc
            if not isinstance(out, dict):
                raise SchemaVersionError(
                    f"{where}: {described} returned {type(out).__name__}, not the dict of fields. "
                    "Nothing was written; return the dict and resume again"
                )
            ran.append(described)
            data = out
        return data, ran

    def check_names(
        self, names: Iterable[str], stored: tuple[str, int] | None, where: str, ran: Sequence[str] = ()
    ) -> None:
        """Refuse stored fields the class does not declare: loading would drop their data."""
        assert self.cls is not None
        unknown = [n for n in names if n not in self.field_set]
        if not unknown:
            return
        cls = self.cls.__qualname__
        if ran:
            raise SchemaVersionError(
                f"{where}: after {ran[-1]} the state has field(s) {sorted(unknown)} "
                f"that {cls} version {self.version} does not declare (its fields: {sorted(self.fields)}); "
                "loading it would drop their data. Nothing was written; make the migration rename "
                f"them (data['new_name'] = data.pop({unknown[0]!r})) or delete them (del data[{unknown[0]!r}])"
            )
        example = f"data[<new name>] = data.pop({unknown[0]!r}); "
        if stored is None:
            raise SchemaVersionError(
                f"{where}: the stored state (a dict, no schema) has field(s) {sorted(unknown)} that {cls} "
                f"does not declare (its fields: {sorted(self.fields)}); loading it would drop their "
                f"data. Nothing was written. {self._dict_hint(example)}"
            )
        raise SchemaVersionError(
            f"{where}: the stored state (schema {stored[0]!r} version {stored[1]}) has field(s) "
            f"{sorted(unknown)} that {cls} no longer declares (its fields: {sorted(self.fields)}); "
            f"loading it would drop their data. Nothing was written. If the field was renamed "
            f"or removed, {self._bump_hint(example)}"
        )

    def check_value(
        self, name: str, value: Any, stored: tuple[str, int] | None, where: str | Callable[[], str]
    ) -> Any:
        """``value`` of the stored field ``name`` validated as the class declares it (replay)."""
        from pydantic import ValidationError

        adapter = self._adapter(name, False)
        if adapter is None:
            return value
        try:
            return adapter.validate_python(value)
        except ValidationError as exc:
            raise self._invalid(exc, stored, where if isinstance(where, str) else where(), [], name) from exc

    def check_items(
        self, name: str, items: list[Any], start: int, stored: tuple[str, int] | None, where: str
    ) -> None:
        """Stored items ``items[start:]`` of the list field ``name`` validate as its item type
        (a ``list[X]`` field; else the whole list as the field's type). Checked, not
        replaced: the items are shared with the loader's cache."""
        from pydantic import ValidationError

        adapter = self._adapter(name, True)
        if adapter is None:
            return
        try:
            adapter.validate_python(items[start:] if self._itemwise(name) else items)
        except ValidationError as exc:
            raise self._invalid(exc, stored, where, [], name) from exc

    def _adapter(self, name: str, items: bool) -> Any:
        """A pydantic TypeAdapter for field ``name`` (or its items), or None where pydantic
        cannot make one for the bare annotation: that field is then checked only when a
        whole state is built (``model_validate``), as every base state is."""
        assert self.cls is not None
        adapters = _ADAPTERS.setdefault(self.cls, {})  # per class: a StateSpec is made per resume()
        key = (name, items)
        if key in adapters:
            return adapters[key]
        from typing import Annotated, get_args, get_origin

        from pydantic import TypeAdapter

        field = self.cls.model_fields[name]
        ann: Any = field.annotation
        if items and get_origin(ann) is list and get_args(ann):
            ann = list[get_args(ann)[0]]  # type: ignore[misc]  # without the list's own constraints
        else:
            ann = Annotated[ann, field]
        try:
            adapter = TypeAdapter(ann)
        except Exception:  # e.g. a forward reference only the model's namespace resolves
            adapter = None
        adapters[key] = adapter
        return adapter

    def _itemwise(self, name: str) -> bool:
        from typing import get_args, get_origin

        assert self.cls is not None
        ann = self.cls.model_fields[name].annotation
        return get_origin(ann) is list and bool(get_args(ann))

    def _invalid(
        self, exc: Any, stored: tuple[str, int] | None, where: str, ran: Sequence[str], name: str = ""
    ) -> SchemaVersionError:
        assert self.cls is not None
        errors = exc.errors(include_url=False)
        fields = [name] if name else sorted({str(e["loc"][0]) for e in errors if e.get("loc")})
        detail = "; ".join(
            f"{'.'.join(str(x) for x in ((name,) if name else ()) + tuple(e.get('loc') or ()))}: {e.get('msg')}"
            for e in errors[:3]
        )
        cls = f"{self.cls.__qualname__} version {self.version}"
        if ran:
            return SchemaVersionError(
                f"{where}: after {ran[-1]} the state does not validate as {cls} "
                f"(field(s) {fields}: {detail}). Nothing was written; fix the migration and resume again"
            )
        if stored is None:
            return SchemaVersionError(
                f"{where}: the stored value of field(s) {fields} (a dict state, no schema) does not "
                f"validate as {cls} ({detail}). Nothing was written. {self._dict_hint()}"
            )
        return SchemaVersionError(
            f"{where}: the stored value of field(s) {fields} does not validate as {cls} ({detail}); "
            f"the field's type changed without a version bump. Nothing was written; {self._bump_hint()}"
        )

    def _bump_hint(self, example: str = "...; ") -> str:
        assert self.cls is not None
        cls, v = self.cls.__name__, self.version
        named = "" if self.name == self.cls.__qualname__ else f", name={self.name!r}"
        base = "pk.State" if self.is_state else "pk.State (not a plain pydantic model)"
        return (
            f"bump the version — class {cls}({base}, version={v + 1}{named}) — and convert the stored "
            f"fields in a migration: @pk.migration({cls}, from_version={v}) def upgrade(data): {example}return data"
        )

    def _dict_hint(self, example: str = "...; ") -> str:
        """How to load a state stored as a plain dict whose fields do not fit the class:
        a migration from version 0 (the dict), at the class's current version."""
        assert self.cls is not None
        cls = self.cls.__name__
        declare = "" if self.is_state else f"make {cls} a pk.State subclass — class {cls}(pk.State) — and "
        then = self._missing(1)
        chain = f" (then the chain from version 1 runs: add {self._decorators(then, cls)} too)" if then else ""
        return (
            f"A state stored as a dict counts as version 0 of {cls}: {declare}convert its fields "
            f"in a migration: @pk.migration({cls}, from_version=0) def upgrade(data): {example}return data"
            f"{chain}"
        )

    def _missing(self, start: int) -> list[int]:
        """The versions from ``start`` up to the class's that have no migration registered."""
        return [v for v in range(start, self.version) if (self.cls, v) not in _MIGRATIONS]

    def _decorators(self, versions: Sequence[int], cls: str) -> str:
        return " and ".join(f"@pk.migration({cls}, from_version={v})" for v in versions)

    def track(self, state: Any) -> Any:
        """Swap top-level lists for :class:`TrackedList` (in place)."""
        for name, value in list(self.channels(state).items()):
            if isinstance(value, list) and not isinstance(value, TrackedList):
                self.set_channel(state, name, TrackedList(value))
        return state

    # -- updates ------------------------------------------------------------------

    def update(self, state: Any, changes: dict[str, Any]) -> None:
        """Apply ``changes`` through each channel's reducer (replace by default)."""
        current = self.channels(state)
        if self.cls is not None:
            unknown = set(changes) - set(self.cls.model_fields)
            if unknown:
                raise ConfigurationError(
                    f"update of {self.cls.__qualname__}: unknown field(s) {sorted(unknown)}; "
                    f"fields are {sorted(self.cls.model_fields)}"
                )
        for name, new in changes.items():
            reducer = self.reducers.get(name)
            old = current.get(name)
            if reducer is None:
                value = new
            elif reducer is append and old is not None and not isinstance(old, list):
                raise ConfigurationError(f"append reducer on {name!r}: the value is not a list")
            else:
                value = reducer(old, new)
            if isinstance(value, list) and not isinstance(value, TrackedList):
                value = TrackedList(value)
            self.set_channel(state, name, value)


def _deep(value: Any) -> Any:
    return copy.deepcopy(value)


