"""Runs that outlive a process, on one store (docs/long-runs.md): every long-run suite in one class.

``LongRunsConformance`` mixes the four suites a store runs for issue 21's guarantees:
``SuspendConformance`` (``pk.suspend``/``store.answer``, ``pk.sleep``/``store.due``),
``SagaConformance`` (``pk.compensate``, rollback), ``OutboxConformance``
(``pk.after_commit``, ``store.drain_outbox``) and ``PatchConformance`` (``pk.patched``,
``store.check_replay``). Subclass it and provide a ``persistkit_url`` fixture; checks that
need the lease primitives skip (or narrow) on a store without them.
"""

from __future__ import annotations

from .outbox_suite import OutboxConformance
from .patch_suite import PatchConformance
from .saga_suite import SagaConformance
from .suspend_suite import SuspendConformance

__all__ = ["LongRunsConformance"]


class LongRunsConformance(SuspendConformance, SagaConformance, OutboxConformance, PatchConformance):
    """Every long-run check (suspend, timers, sagas, after-commit effects, patches, the replay check)."""
