"""Conformance suites a store must pass (they need pytest).

``BackendConformance`` checks the byte-level primitives of a backend;
``StoreConformance`` checks the end-to-end contract (steps, replay, runs,
history, fork, conflicts) through ``pk.connect``; ``LeaseConformance`` the
lease primitives (``lease_get``/``lease_swap``/``lease_list``/``write_fenced``,
see docs/coordination.md); ``SuspendConformance`` suspended runs, answers and durable
timers (docs/long-runs.md); ``PatchConformance`` ``pk.patched`` and the replay
check (docs/long-runs.md); ``OutboxConformance`` after-commit effects (``run.after_commit``,
``store.drain_outbox``, docs/long-runs.md); ``SagaConformance`` compensations and the
rollback; ``LongRunsConformance`` all four of those; ``KvConformance`` and
``WatchConformance`` the ``kv`` and ``watch`` capabilities a store's board needs
(docs/shared-state.md); ``PruneConformance`` the ``prune`` capability retention needs and
``RetentionConformance`` ``store.prune`` end to end (docs/operations.md); ``BoardConformance`` the board itself (``store.board()``: versions,
cas, batches, TTL, claims, watches, scoped handles, validators, values through the
wrappers), sync and async; ``CombinationConformance`` every feature that touches
stored bytes in combination, crashed at every step position and resumed in a new
process (``persistkit.testing.combination``); ``StreamConformance`` durable streams
(``pk.emit``, ``store.read_stream``), crashed at every step position and read from every
offset (docs/streams.md); ``LimitsConformance`` shared rate limits (``store.limits``,
``limit=``, ``pk.limited``, ``pk.throttle``: docs/flow-control.md). Subclass any of them in your test suite and provide
a ``persistkit_url`` fixture; see docs/backends.md.

``crash_matrix(agent)`` (``persistkit.testing.crash_matrix``, and the pytest fixture of the
same name) proves that *your* agent survives a crash at every step: docs/testing.md.
"""

from .backend_suite import BackendConformance
from .board_suite import BoardConformance
from .combination_suite import CombinationConformance
from .crash_matrix import CrashMatrixResult, crash_matrix
from .kv_suite import KvConformance
from .lease_suite import LeaseConformance
from .limits_suite import LimitsConformance
from .long_runs_suite import LongRunsConformance
from .outbox_suite import OutboxConformance
from .patch_suite import PatchConformance
from .prune_suite import PruneConformance
from .retention_suite import RetentionConformance
from .saga_suite import SagaConformance
from .store_suite import StoreConformance
from .stream_suite import StreamConformance
from .suspend_suite import SuspendConformance
from .watch_suite import WatchConformance

__all__ = [
    "BackendConformance",
    "BoardConformance",
    "CombinationConformance",
    "CrashMatrixResult",
    "KvConformance",
    "LeaseConformance",
    "LimitsConformance",
    "LongRunsConformance",
    "OutboxConformance",
    "PatchConformance",
    "PruneConformance",
    "RetentionConformance",
    "SagaConformance",
    "StoreConformance",
    "StreamConformance",
    "SuspendConformance",
    "WatchConformance",
    "crash_matrix",
]
