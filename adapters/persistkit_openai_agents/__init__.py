"""persistkit for the OpenAI Agents SDK (``pip install persistkit[openai-agents]``).

* :class:`PersistkitSession` — the SDK's ``Session`` over any persistkit store:
  ``Runner.run(agent, input, session=PersistkitSession("thread-1", store))``.
* :func:`durable_run` — ``Runner.run`` in which every model turn and every
  function-tool call is a persistkit step: a crashed run, run again with the
  same input, replays its finished turns and tool calls from the store.
* :func:`load_run_state` — a run that stopped for tool approval stored its
  ``RunState`` on the thread; a later process loads it, approves or rejects,
  and passes it back to :func:`durable_run`.

Built only on the public ``persistkit`` API.
"""

from __future__ import annotations

from ._durable import DurableModel, durable
from ._run import RUN_STATE_CHANNEL as RUN_STATE_CHANNEL
from ._run import durable_run, load_run_state
from ._session import (
    SESSION_NAMESPACE as SESSION_NAMESPACE,
)
from ._session import (
    PersistkitSession,
    SessionSettingsError,
    UnserializableItemError,
)

__all__ = [
    "DurableModel",
    "PersistkitSession",
    "SessionSettingsError",
    "UnserializableItemError",
    "durable",
    "durable_run",
    "load_run_state",
]
