"""The fields of a run, declared for the modules that make up ``Run`` (no behaviour)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from .._errors import (
    ConflictError,
    PersistkitError,
)
from ..backends import Head
from ..state._channels import Loader
from ..state._dedupe import Result
from ..state._records import Record
from ..state._spec import StateSpec
from ..state._tracker import Tracker

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from .._io import Plan
    from ..coordination import Lease
    from ..ops._telemetry import Observer


class RunFields:
    """What a run holds (every field ``Run.__init__`` sets), declared once for the modules
    that make up :class:`~persistkit.engine._run.Run`: ``_restore`` (restoring state),
    ``_cursor`` (the replay cursor), ``_commit`` (committing)."""

    store: Any
    codec: Any
    thread_id: str
    namespace: str
    spec: StateSpec
    metadata: dict[str, Any]
    run_id: str
    status: str
    state: Any
    replay_only: bool
    retry_failed: bool
    load_error: PersistkitError | None
    migrated: bool
    lease: Lease | None
    release_at_end: bool
    keeps_turns: bool
    observer: Observer | None
    refused: Callable[[Any, ConflictError], Plan[Any]] | None
    _events: list[tuple[str, str, bool, str]]
    _moved_on: tuple[str, Head | None, str | None, str | None] | None
    _failed_end: Record | None
    _lost: ConflictError | None
    _index: dict[str, Record]
    _settled: dict[str, list[str]]
    _max_child: dict[str, int]
    _escaped: set[str]
    _failures: dict[int, tuple[BaseException, str]]
    _head: Head | None
    _loader: Loader
    _tracker: Tracker
    _lock: threading.Lock
    _alocks: dict[int, asyncio.Lock]
    _schema: tuple[str, int] | None
    _result: Result | None
    _result_raw: bytes | None
    _result_tree: Any
    _marks: dict[str, dict[str, Any]]
    _attach: dict[str, Any]
    _patches: dict[str, bool]
    _questions: list[Any]
    _effects: dict[str, Any]
    _pending: list[Any]
    _streams: Any
