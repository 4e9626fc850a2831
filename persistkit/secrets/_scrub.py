"""Text that leaves the process beside the store (telemetry, logs), scrubbed as the store
scrubs it: an exception's text as a recorded error's record holds it, a step's name as its
record holds it (``ops/_telemetry``)."""

from __future__ import annotations

import functools

from ._redact import default_redactor
from ._registry import _env_sync, _generation
from ._scan import has_access_key_id

__all__ = ["scrub_error", "scrub_name"]


def scrub_error(text: str) -> str:
    """``text`` of an exception (its message, its traceback) scrubbed as a recorded error is
    stored: ``_redact.scrub``, plus random-looking tokens and, beside an AWS access key id, a bare
    AWS secret key. For what leaves the process beside the store (telemetry, logs)."""
    _env_sync()
    pair = has_access_key_id(text.encode("utf-8", "surrogatepass"))
    return default_redactor().redact_text(text, stable=True, escape=False, people=True, pair=pair)


def scrub_name(name: str) -> str:
    """A step's name as telemetry and logs show it: ``_redact.scrub``, remembered per name (a
    name repeats every turn; what redaction does changes rarely)."""
    _env_sync()
    return _scrub_name(name, _generation[0])


@functools.lru_cache(maxsize=1024)
def _scrub_name(name: str, generation: int) -> str:
    return default_redactor().redact_text(name, stable=True, escape=False)
