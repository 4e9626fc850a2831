"""Graph-state versions and migrations for :class:`PersistkitSaver`.

LangGraph loads only the channels the running graph declares: a stored
channel whose field was renamed or removed is dropped without a word, and a
pydantic value (a LangChain message included) whose class changed shape is
built with ``model_construct`` (no validation) when its stored fields no longer
fit. The saver refuses both with a ``pk.SchemaVersionError`` unless a
migration handles them:

* every checkpoint is stamped with the saver's graph-state ``version``
  (persistkit run metadata ``langgraph_version``; none stored = 1);
* ``@saver.migration(from_version=n)`` registers ``fn(channels) -> channels``,
  run on the decoded channel values of a checkpoint stamped ``n`` (and on each
  pending write as a one-channel dict), in a chain up to the saver's version;
* a pydantic value that no longer validates as its class reaches a migration
  as the ``dict`` of its stored fields; without a migration to run it is an
  error naming the class, the field, the channel and the thread;
* a stored state channel the graph does not declare is an error once the
  saver knows the graph's channels (``durable_invoke`` passes them in the
  config under :data:`CHANNELS_KEY`).

LangGraph's serializer encodes channel values itself (its type tags carry no
persistkit class version), so per-class versions (``pk.register(Cls,
version=n)``) do not apply inside channels: the graph-state migration is the
one place where channel values are converted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import persistkit as pk

from ._values import MsgpackExt

__all__ = ["CHANNELS_KEY", "VERSION_KEY", "Migrations", "ModelCheck", "migrate_checkpoint", "remedy", "state_channel"]

#: ``config["configurable"]`` key under which ``durable_invoke`` hands the saver the graph's channel names.
CHANNELS_KEY = "__persistkit_channels"
#: persistkit run-metadata key of the graph-state version a checkpoint was written with.
VERSION_KEY = "langgraph_version"
_PYDANTIC_V2 = 5  # LangGraph's msgpack extension code for a pydantic v2 model (module, class, fields, method)

Migration = Callable[[dict[str, Any]], dict[str, Any]]


def state_channel(name: str) -> bool:
    """Whether ``name`` is a state field's channel: fields are identifiers, LangGraph's own
    channels are dunder names (``__start__``, ``__pregel_tasks``) or hold a colon (``branch:to:x``)."""
    return name.isidentifier() and not name.startswith("__")


def remedy(version: int) -> str:
    return (
        f"Either bump the graph-state version and convert the stored channels in a migration: "
        f"PersistkitSaver(store, version={version + 1}) and @saver.migration(from_version={version}) "
        "def upgrade(channels: dict) -> dict: ... (rename a key, convert a value; see "
        "docs/adapters-langgraph.md#migrating-graph-state) — or finish the thread's runs with the "
        "code that stored them"
    )


class Migrations:
    """The saver's graph-state version and its chain of migrations."""

    def __init__(self, version: Any) -> None:
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise pk.ConfigurationError(f"PersistkitSaver(version={version!r}): version must be an int >= 1")
        self.version = version
        self.fns: dict[int, Migration] = {}

    def register(self, from_version: Any) -> Callable[[Migration], Migration]:
        if (
            not isinstance(from_version, int)
            or isinstance(from_version, bool)
            or not 1 <= from_version < self.version
        ):
            raise pk.ConfigurationError(
                f"@saver.migration(from_version={from_version!r}): from_version must be between 1 "
                f"(checkpoints written before the graph state had a version) and {self.version - 1} "
                f"(the saver is version {self.version}: PersistkitSaver(..., version={self.version}))"
            )

        def add(fn: Migration) -> Migration:
            if not callable(fn):
                raise pk.ConfigurationError(f"@saver.migration decorates a function, got {fn!r}")
            if from_version in self.fns and self.fns[from_version] is not fn:
                raise pk.ConfigurationError(f"a graph-state migration from version {from_version} is already registered")
            self.fns[from_version] = fn
            return fn

        return add

    def plan(self, stored: int, where: str) -> list[tuple[int, Migration]]:
        """The migrations a checkpoint stamped ``stored`` needs, or a SchemaVersionError."""
        if stored > self.version:
            raise pk.SchemaVersionError(
                f"{where}: the checkpoint was written with graph-state version {stored}, newer than "
                f"this saver's version {self.version}. Nothing was loaded. Deploy the code that wrote "
                "it (its PersistkitSaver(version=...) and migrations), or fork the thread from an older checkpoint"
            )
        missing = [v for v in range(stored, self.version) if v not in self.fns]
        if missing:
            add = " and ".join(f"@saver.migration(from_version={v})" for v in missing)
            raise pk.SchemaVersionError(
                f"{where}: the checkpoint was written with graph-state version {stored}, the saver is "
                f"version {self.version}, and no migration from version {missing[0]} to {missing[0] + 1} "
                f"is registered. Nothing was loaded. Add {add} (each takes the checkpoint's channel "
                "values as a dict and returns them upgraded), or finish the thread's runs with the code that stored them"
            )
        return [(v, self.fns[v]) for v in range(stored, self.version)]

    def run(self, steps: list[tuple[int, Migration]], channels: dict[str, Any], where: str) -> dict[str, Any]:
        for v, fn in steps:
            name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
            try:
                out = fn(dict(channels))
            except Exception as exc:
                raise pk.SchemaVersionError(
                    f"{where}: graph-state migration {name} (from version {v}) failed: "
                    f"{type(exc).__name__}: {exc}. Nothing was loaded; fix the migration and resume again"
                ) from exc
            if not isinstance(out, dict):
                raise pk.SchemaVersionError(
                    f"{where}: graph-state migration {name} (from version {v}) returned "
                    f"{type(out).__name__}, not the dict of channel values. Nothing was loaded"
                )
            channels = out
        return channels

    def unknown(self, names: Any, known: frozenset[str] | None, where: str) -> None:
        """Refuse stored state channels the graph does not declare (LangGraph would drop them)."""
        if known is None:
            return
        stale = sorted({n for n in names if state_channel(n) and n not in known})
        if stale:
            fields = sorted(n for n in known if state_channel(n))
            raise pk.SchemaVersionError(
                f"{where}: stored state channel(s) {stale} are not channels of this graph (its state "
                f"fields: {fields}); loading would silently drop their data (a field renamed or "
                f"removed since the run was stored). Nothing was loaded. {remedy(self.version)}"
            )


def migrate_checkpoint(
    migrations: Migrations, checkpoint: Any, values: dict[str, Any], writes: list[tuple[str, str, Any]],
    steps: list[tuple[int, Migration]], where: str,
) -> tuple[dict[str, Any], list[tuple[str, str, Any]]]:
    """Run the graph-state migrations on a checkpoint's channel values and on each pending
    write to a state channel (as a one-channel dict); keep LangGraph's channel versions in step."""
    new = migrations.run(steps, values, where)
    versions, seen = checkpoint["channel_versions"], checkpoint["versions_seen"]
    removed, added = sorted(set(values) - set(new)), sorted(set(new) - set(values))
    for name in added:
        if len(removed) == 1 and len(added) == 1:  # a rename keeps the version (and what nodes saw of it)
            versions[name] = versions[removed[0]]
            for node_seen in seen.values():
                if removed[0] in node_seen:
                    node_seen[name] = node_seen[removed[0]]
        elif versions:  # a new channel counts as written at the checkpoint's latest version
            versions[name] = max(versions.values())
    for name in removed:
        versions.pop(name, None)
    migrated: list[tuple[str, str, Any]] = []
    for task, channel, value in writes:
        if not state_channel(channel):
            migrated.append((task, channel, value))
            continue
        out = migrations.run(steps, {channel: value}, f"{where} pending write of task {task}")
        migrated.extend((task, c, v) for c, v in out.items())
    return new, migrated


def _signature(node: Any) -> Any:
    """The shape of a stored tree: what decides whether its model validates (not its text)."""
    t = type(node)
    if t is dict:
        return ("d", tuple((k, _signature(v)) for k, v in node.items()))
    if t is list:
        return ("l", tuple(_signature(v) for v in node))
    if t is MsgpackExt:
        v = node.value
        if node.code == _PYDANTIC_V2 and node.nested and type(v) is list and len(v) == 4:
            return ("m", v[0], v[1], _signature(v[2]))
        return ("x", node.code)
    return t


class ModelCheck:
    """Finds the pydantic values of a stored tree that no longer fit their class.

    ``decode(tree)`` is the saver's serializer reading a msgpack tree (it builds the
    nested values the model is validated with). Results are cached by class and the
    stored value's shape, so a long conversation validates each message shape once.
    """

    def __init__(self, decode: Callable[[Any], Any]) -> None:
        self.decode = decode
        self._fits: dict[Any, str | None] = {}

    def _problem(self, cls: type, fields: Any) -> str | None:
        key = (cls, _signature(fields))
        if key in self._fits:
            return self._fits[key]
        problem: str | None = None
        declared = getattr(cls, "model_fields", None)
        if type(fields) is not dict or declared is None:
            problem = None  # not a pydantic v2 model's field map: LangGraph's own fallback applies
        elif cls.model_config.get("extra") != "allow" and not set(fields) <= set(declared):  # type: ignore[attr-defined]
            unknown = sorted(set(fields) - set(declared))
            problem = f"stored field(s) {unknown} that it does not declare (its fields: {sorted(declared)})"
        else:
            from pydantic import ValidationError

            try:
                cls.model_validate(self.decode(fields))  # type: ignore[attr-defined]
            except ValidationError as exc:
                errs = exc.errors(include_url=False)[:3]
                problem = "; ".join(f"{'.'.join(map(str, e.get('loc') or ())) or '(value)'}: {e['msg']}" for e in errs)
        if len(self._fits) > 4096:
            self._fits.clear()
        self._fits[key] = problem
        return problem

    def walk(self, node: Any, path: str, plain: bool, fail: Callable[[str, str], Exception]) -> Any:
        """``node`` with each model that no longer fits its class replaced by the dict of its
        stored fields (``plain``: a migration will see it), or ``fail(path, problem)`` raised.
        Inner values first; unchanged subtrees are returned as they are (trees are shared)."""
        t = type(node)
        if t is list:
            items = [self.walk(v, f"{path}[{i}]", plain, fail) for i, v in enumerate(node)]
            return node if all(a is b for a, b in zip(items, node, strict=True)) else items
        if t is dict:
            vals = {k: self.walk(v, f"{path}.{k}", plain, fail) for k, v in node.items()}
            return node if all(vals[k] is node[k] for k in node) else vals
        if t is not MsgpackExt or not node.nested:
            return node
        value = node.value
        if node.code == _PYDANTIC_V2 and type(value) is list and len(value) == 4:
            module, name, fields, method = value
            inner = self.walk(fields, path, plain, fail)
            cls = getattr(sys.modules.get(module), name, None) if isinstance(module, str) else None
            problem = self._problem(cls, inner) if isinstance(cls, type) else None
            if problem is not None:
                if plain:
                    return inner
                raise fail(path, f"the stored {name} ({module}.{name}) does not fit the class any more: {problem}")
            return node if inner is fields else MsgpackExt(node.code, [module, name, inner, method], True)
        inner = self.walk(value, path, plain, fail)
        return node if inner is value else MsgpackExt(node.code, inner, True)
