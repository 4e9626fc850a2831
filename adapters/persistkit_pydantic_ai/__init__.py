"""persistkit for Pydantic AI (``pip install persistkit[pydantic-ai]``).

* :class:`PersistkitDurability` — a capability,
  ``Agent(..., capabilities=[PersistkitDurability()])``: inside ``pk.resume`` every model
  request, function-tool call and MCP call is a persistkit step, for ``run``,
  ``run_sync``, ``run_stream``, ``iter`` and event stream handlers; a deferred tool call
  suspends the run until ``store.answer`` (from any process), which checks the answer
  against the pending call ids (:class:`DeferredAnswer`, :class:`DeferredAnswerError`).
* :func:`durable_run` — one turn of a thread: ``pk.resume`` + the thread's message
  history loaded + the turn's new messages appended (:func:`load_history`,
  :func:`save_messages` for ``run_stream`` / ``iter``).

Built only on the public ``persistkit`` API.
"""

from __future__ import annotations

from ._durability import (
    DeferredAnswer,
    DeferredAnswerError,
    PersistkitDurability,
    deferred_results,
    pending_requests,
)
from ._memory import MESSAGES_CHANNEL as MESSAGES_CHANNEL
from ._memory import durable_run, load_history, save_messages

__all__ = [
    "DeferredAnswer",
    "DeferredAnswerError",
    "PersistkitDurability",
    "deferred_results",
    "durable_run",
    "load_history",
    "pending_requests",
    "save_messages",
]
