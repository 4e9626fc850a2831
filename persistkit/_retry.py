"""Retry policies for steps, built on tenacity.

A retried attempt of a step re-enters it at the same position: its finished
child steps replay from the store and only the failed part runs again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._errors import ConfigurationError, PersistkitError

__all__ = ["Retry", "set_testing", "testing_enabled"]

_TESTING = False


def set_testing(enabled: bool = True) -> None:
    """Turn retry waits off (for your test suites). Attempts still happen; only sleeps are skipped."""
    global _TESTING
    _TESTING = bool(enabled)


def testing_enabled() -> bool:
    return _TESTING


@dataclass(frozen=True, kw_only=True)
class Retry:
    """How a step is retried when it raises.

    ``attempts`` and ``timeout`` (seconds, over all attempts) both bound the
    retrying; waits grow exponentially from ``wait_initial`` up to
    ``wait_max`` with up to ``wait_jitter`` seconds of random jitter. Only
    exceptions that are instances of ``on`` are retried (or, if ``on`` is a
    callable, those it returns True for). persistkit's own errors
    (conflicts, non-determinism, ...) are never retried by a step policy.
    """

    attempts: int = 3
    timeout: float | None = 60.0
    on: type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool] = (
        Exception
    )
    wait_initial: float = 0.1
    wait_max: float = 10.0
    wait_jitter: float = 1.0
    _predicate: Callable[[BaseException], bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool) or self.attempts < 1:
            raise ConfigurationError(f"Retry(attempts={self.attempts!r}): must be an int >= 1")
        if self.attempts > 1000:
            raise ConfigurationError(f"Retry(attempts={self.attempts!r}): at most 1000")
        if self.timeout is not None and not (
            isinstance(self.timeout, int | float) and self.timeout > 0 and math.isfinite(self.timeout)
        ):
            raise ConfigurationError(
                f"Retry(timeout={self.timeout!r}): must be a positive number of seconds or None"
            )
        for name in ("wait_initial", "wait_max", "wait_jitter"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or v < 0 or not math.isfinite(v):
                raise ConfigurationError(f"Retry({name}={v!r}): must be a finite number >= 0")
        on = self.on
        if isinstance(on, type) and issubclass(on, BaseException):
            types: tuple[type[BaseException], ...] = (on,)
            pred = _type_predicate(types)
        elif isinstance(on, tuple) and on and all(
            isinstance(t, type) and issubclass(t, BaseException) for t in on
        ):
            pred = _type_predicate(on)
        elif callable(on) and not isinstance(on, type | tuple):
            pred = on
        else:
            raise ConfigurationError(
                f"Retry(on={on!r}): expected an exception class, a non-empty tuple of them, "
                "or a callable(exception) -> bool"
            )

        def predicate(exc: BaseException) -> bool:
            return not isinstance(exc, PersistkitError) and bool(pred(exc))

        object.__setattr__(self, "_predicate", predicate)

    def should_retry(self, exc: BaseException) -> bool:
        return self._predicate(exc)

    def tenacity_kwargs(self) -> dict[str, Any]:
        """Arguments for ``tenacity.Retrying`` / ``AsyncRetrying``."""
        import tenacity  # only steps with a retry policy pay for importing it

        stop: Any = tenacity.stop_after_attempt(self.attempts)
        if self.timeout is not None:
            stop = stop | tenacity.stop_after_delay(self.timeout)
        wait: Any
        if _TESTING:
            wait = tenacity.wait_none()
        else:
            wait = tenacity.wait_exponential_jitter(
                initial=self.wait_initial, max=self.wait_max, jitter=self.wait_jitter
            )
        return {
            "stop": stop,
            "wait": wait,
            "retry": tenacity.retry_if_exception(self._predicate),
            "reraise": True,
        }


def _type_predicate(types: tuple[type[BaseException], ...]) -> Callable[[BaseException], bool]:
    def pred(exc: BaseException) -> bool:
        return isinstance(exc, types)

    return pred
