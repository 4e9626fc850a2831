"""Where code runs: the context variable holding the engine's frame (``_api._Frame``).

Below ``_api`` so that the layers' engine modules (``_outbox``, ...) that a ``Run`` method
delegates to can read the frame without importing ``_api`` (which imports ``Run``).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

__all__ = ["CURRENT", "MATRIX"]

#: The frame of the innermost ``resume`` block or step (an ``_api._Frame``), or None.
CURRENT: ContextVar[Any] = ContextVar("persistkit_frame", default=None)

#: The crash matrix watching the agent it runs (``persistkit.testing.crash_matrix``), or None.
#: A process-wide value, not a context variable: a step called from a thread the context
#: did not follow is exactly what it must see. ``resume`` hands it each run as the run
#: opens (its ``opened(run, observer)`` returns the run's observer); a step called where no
#: run is current tells it ``plain(name)``. Read once per block and per plain call.
MATRIX: Any = None
