"""Where code runs: the context variable holding the engine's frame (``_api._Frame``).

Below ``_api`` so that the layers' engine modules (``_outbox``, ...) that a ``Run`` method
delegates to can read the frame without importing ``_api`` (which imports ``Run``).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

__all__ = ["CURRENT"]

#: The frame of the innermost ``resume`` block or step (an ``_api._Frame``), or None.
CURRENT: ContextVar[Any] = ContextVar("persistkit_frame", default=None)
