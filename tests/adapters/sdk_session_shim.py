"""pytest plugin: the OpenAI Agents SDK's own session tests with ``PersistkitSession``.

Loaded with ``-p sdk_session_shim`` into a pytest run of the SDK's
``tests/memory/test_session.py`` and ``test_session_limit.py`` (taken from the
sdist of the installed release, see ``test_openai_agents_sdk_suite.py``).
Before the SDK's test modules are imported it replaces ``agents.SQLiteSession``
by :class:`SQLiteShaped`, a ``PersistkitSession`` with ``SQLiteSession``'s
constructor: the tests then run unchanged against persistkit. A database path
becomes a persistkit SQLite store in that file (sessions given one path share
it, as ``SQLiteSession``'s do); ``":memory:"`` becomes a memory store.

The tests in :data:`EXCLUDED` read ``SQLiteSession``'s own tables, connections
and locks; they are deselected, and docs/adapters-openai-agents.md lists them.
The plugin writes what it did to ``$PK_SDK_SUITE_REPORT`` (JSON) so the
harness can check that every exclusion still names a test of the suite and
that the sessions the tests built were ours.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import persistkit as pk
from persistkit_openai_agents import PersistkitSession

#: Tests of the SDK's suite that inspect SQLiteSession's implementation, with the reason.
EXCLUDED: dict[str, str] = {
    "test_sqlite_session_close_closes_worker_thread_connections": "reads session._connections",
    "test_sqlite_session_closed_rejects_empty_add_items": "expects SQLiteSession's 'SQLiteSession is closed' error after close()",
    "test_sqlite_session_pop_item_skips_corrupt_most_recent": "writes a corrupt row through session._locked_connection()",
    "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows": "writes a corrupt row through session._locked_connection()",
    "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows": "writes a corrupt row through session._locked_connection()",
    "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows": "writes a corrupt row through session._locked_connection()",
    "test_sqlite_session_file_lock_is_shared_across_instances": "reads SQLiteSession._lock and _file_lock_counts",
    "test_sqlite_session_failed_add_items_releases_write_lock": "probes SQLite's write lock and the agent_sessions table (its TypeError part is tested in test_openai_agents.py)",
    "test_sqlite_session_failed_clear_session_rolls_back": "drops SQLiteSession's tables and reads session._connections",
    "test_sqlite_session_failed_pop_item_releases_write_lock": "drops SQLiteSession's tables and reads session._connections",
    "test_sqlite_session_rollback_failure_evicts_connection": "replaces session._get_connection",
    "test_sqlite_session_close_retries_quarantined_connection": "replaces session._get_connection",
    "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome": "replaces session._get_connection",
}

_created: list[str] = []
_excluded_seen: set[str] = set()
_collected: list[str] = []


class SQLiteShaped(PersistkitSession):
    """``SQLiteSession(session_id, db_path=":memory:", sessions_table=..., messages_table=...,
    session_settings=None)`` built on persistkit."""

    def __init__(
        self,
        session_id: str,
        db_path: str | Path = ":memory:",
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        session_settings: Any = None,
    ) -> None:
        url = "memory://" if str(db_path) == ":memory:" else f"sqlite:///{Path(db_path).resolve()}"
        super().__init__(session_id, pk.connect(url), session_settings=session_settings)
        _created.append(type(self).__mro__[1].__name__)

    def close(self) -> None:
        self.store.close()


def pytest_configure(config: pytest.Config) -> None:
    # Before collection: the test modules' `from agents import SQLiteSession` picks this up.
    import agents

    agents.SQLiteSession = SQLiteShaped  # type: ignore[misc,assignment]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    for item in items:
        name = getattr(item, "originalname", item.name)
        _collected.append(item.nodeid)
        if name in EXCLUDED:
            _excluded_seen.add(name)
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def pytest_unconfigure(config: pytest.Config) -> None:
    report = os.environ.get("PK_SDK_SUITE_REPORT")
    if report:
        Path(report).write_text(json.dumps({
            "sessions_created": len(_created),
            "session_classes": sorted(set(_created)),
            "excluded_seen": sorted(_excluded_seen),
            "collected": _collected,
        }))
