"""``pk.compensate``: register the undo of the step being executed (the logic is
``coordination/_saga.py``; the rollback's loops are ``coordination/_rollback.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._errors import ConfigurationError
from .._retry import Retry
from ..coordination._saga import function_name, register
from ._api import _CURRENT

__all__ = ["compensate"]


def compensate(fn: Callable[..., Any], /, *args: Any, retry: Retry | None = None, **kwargs: Any) -> None:
    """Register ``fn(*args, **kwargs)`` as the undo of the step being executed.

    It is recorded with the step's checkpoint, so it exists once the step completed (a step
    that fails, or an attempt a retry replaces, leaves none). If the run then fails for good
    (an exception escapes its block, or ``run.abort()``), the compensations of its completed
    steps run in reverse order, each once, as a recorded step: the rollback a crash
    interrupts is finished by the next resume of the run. ``fn`` must be a module-level
    function registered with ``@pk.register`` (it is stored by name, and a stored record may
    call only registered functions); the arguments are stored like
    any value. ``retry`` is its policy (default: 5 attempts over up to 5 minutes).
    Outside a ``resume`` block (a step called as a plain function) it does nothing.
    """
    frame = _CURRENT.get()
    if frame is None:
        function_name(fn, "pk.compensate()")  # still refuse what could never be stored
        return
    if frame.name is None:
        raise ConfigurationError(
            "pk.compensate() was called in a resume block but outside a @pk.checkpointed step: a "
            "compensation undoes a step and is recorded with it. Call it inside the step whose "
            "effect it undoes"
        )
    register(frame.run, frame.path, frame.attempt, fn, args, kwargs, retry)
