"""``PersistkitSession``: the OpenAI Agents SDK's ``Session`` over any persistkit store."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Mapping
from typing import Annotated, Any

from agents import TResponseInputItem
from agents.memory import SessionSettings
from pydantic import ValidationError

import persistkit as pk

#: Namespace of session threads, so a session and a durable run may share a thread id.
SESSION_NAMESPACE = "openai-agents.session"
_CAS_ATTEMPTS = 64


# -- Session -------------------------------------------------------------------------------


class _Edit:
    """One session edit, applied by the ``items`` reducer inside ``update_state``'s
    read-compare-and-swap, so concurrent writers never lose each other's items."""

    def __init__(self, op: str, items: list[Any] | None = None) -> None:
        self.op, self.items, self.popped = op, items or [], None

    def __call__(self, old: Any, _: Any = None) -> Any:
        items = old if old is not None else pk.TrackedList()
        if self.op == "add":
            items.extend(self.items)  # appending: the checkpoint stores only the new items
        elif self.op == "pop":
            self.popped = items.pop() if items else None
        else:
            items.clear()
        return items


_edit = pk.Reducer(lambda old, edit: edit(old), "session_edit")


class _Conversation(pk.State, name="persistkit_openai_agents.session"):
    items: Annotated[list[Any], _edit] = []


class SessionSettingsError(pk.ConfigurationError, TypeError):
    """``session_settings`` is neither a ``SessionSettings`` nor a dict of its fields.

    Also a ``TypeError``: the SDK's own sessions raise ``TypeError`` for it."""


class UnserializableItemError(pk.SerializationError, TypeError):
    """An item given to ``add_items`` cannot be stored (nothing of the call was written).

    Also a ``TypeError``: the SDK's own sessions raise ``TypeError`` for it."""


_SETTINGS_FIELDS = frozenset(f.name for f in dataclasses.fields(SessionSettings) if f.init)


def _session_settings(value: Any) -> SessionSettings:
    """``value`` as a ``SessionSettings``: None is the default, a dict is checked field by field."""
    if value is None:
        return SessionSettings()
    if isinstance(value, SessionSettings):
        return value
    if not isinstance(value, Mapping):
        raise SessionSettingsError(
            f"session_settings must be a SessionSettings or a dict, got {type(value).__name__}: "
            "pass SessionSettings(limit=...) or {'limit': ...}"
        )
    unknown = sorted(str(k) for k in value if k not in _SETTINGS_FIELDS)
    if unknown:
        # The SDK's own wording, so code written against SQLiteSession matches it too.
        raise SessionSettingsError(
            f"Unknown session settings: {', '.join(unknown)} "
            f"(SessionSettings accepts {', '.join(sorted(_SETTINGS_FIELDS))})"
        )
    try:
        return SessionSettings(**value)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise SessionSettingsError(f"invalid session_settings {dict(value)!r}: {problems}") from None


class PersistkitSession:
    """Conversation items of ``session_id`` kept in a persistkit store (any backend).

    Each change is one checkpoint of the thread ``session_id`` (namespace
    ``openai-agents.session``); adding items writes only the new items.
    Concurrent writers are serialized by the store's compare-and-swap and retried.
    ``clear_session`` empties the list but keeps the thread's history (time travel);
    ``store.delete_thread(session_id)`` erases it.

    ``session_settings`` (a ``SessionSettings`` or a dict of its fields, as the SDK's
    sessions take it) is normalized to a ``SessionSettings``; its ``limit`` is what
    ``get_items()`` returns when called without one.
    """

    def __init__(
        self,
        session_id: str,
        store: pk.Store,
        *,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> None:
        self.session_id = session_id
        self.store = store
        self.session_settings = session_settings  # normalized by the setter

    @property
    def session_settings(self) -> SessionSettings:
        return self._session_settings

    @session_settings.setter
    def session_settings(self, value: SessionSettings | Mapping[str, Any] | None) -> None:
        # The Runner reads .limit of whatever is here: a dict kept as a dict breaks Runner.run.
        self._session_settings = _session_settings(value)

    async def _all_items(self) -> list[TResponseInputItem]:
        try:
            state = await self.store.aget_state(
                self.session_id, state=_Conversation, namespace=SESSION_NAMESPACE
            )
        except pk.NotFoundError:
            return []
        return list(state.items)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The newest ``limit`` items, oldest first; without ``limit``, ``session_settings.limit``
        of them (all items when that is None too)."""
        items = _window(await self._all_items(), limit if limit is not None else self.session_settings.limit)
        # Read back from the store, the items hold secrets as handles. The Runner sends what
        # get_items returns to the model, so a handle nothing resolves here is refused
        # (SecretResolutionError naming what to configure), never sent as text; reading a
        # session with handles shown is store.get_state(session_id, namespace=SESSION_NAMESPACE).
        live: list[TResponseInputItem] = pk.secrets.live(items, where=f"session {self.session_id!r}: items for the model")
        return live

    async def _edit(self, edit: _Edit) -> _Edit:
        for attempt in range(1, _CAS_ATTEMPTS + 1):
            try:
                await self.store.aupdate_state(
                    self.session_id, {"items": edit}, state=_Conversation, namespace=SESSION_NAMESPACE
                )
                break
            except pk.ConflictError:  # another writer moved the head: re-read and re-apply
                if attempt == _CAS_ATTEMPTS:
                    raise
                await asyncio.sleep(random.random() * 0.002 * attempt)  # spread out contenders
        return edit

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        if not items:
            return
        try:
            await self._edit(_Edit("add", list(items)))
        except pk.SerializationError as exc:
            if isinstance(exc, TypeError):
                raise
            raise UnserializableItemError(
                f"session {self.session_id!r}: an item cannot be stored, none of the "
                f"{len(items)} given was added: {exc}. Items must be JSON-like data "
                "(the SDK's TResponseInputItem dicts)",
                path=exc.path,
            ) from exc

    async def pop_item(self) -> TResponseInputItem | None:
        popped: TResponseInputItem | None = (await self._edit(_Edit("pop"))).popped
        return popped

    async def clear_session(self) -> None:
        await self._edit(_Edit("clear"))


def _window(items: list[TResponseInputItem], limit: int | None) -> list[TResponseInputItem]:
    if limit is None or limit < 0:  # SQLiteSession: a negative limit is no limit (SQLite's LIMIT -1)
        return items
    return items[-limit:] if limit > 0 else []
