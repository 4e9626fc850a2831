"""Large values: a warning once per step above :data:`LARGE_VALUE_BYTES`, and the store's
``max_value_bytes=`` limit (``pk.connect``), refused before anything of the value is written.

Sizes are those of the serialized JSON, which the commit makes anyway: the step path pays
one comparison per value (``size > codec.value_alarm``) and nothing more until a value is
large. Step results, state channels and items appended to a list are measured.
"""

from __future__ import annotations

import warnings
from typing import Any

from .._errors import ValueTooLargeError

__all__ = ["LARGE_VALUE_BYTES", "NO_ALARM", "LargeValueWarning", "alarm", "large_value"]

#: Above this many serialized bytes a value is warned about once per step (or channel) and
#: process, unless the store offloads large values (``blobs=``): 1 MiB.
LARGE_VALUE_BYTES = 1024 * 1024

#: A size no value reaches: no warning, no limit.
NO_ALARM = 1 << 62

_warned: set[str] = set()


class LargeValueWarning(UserWarning):
    """A step stored a value larger than 1 MiB serialized (``LARGE_VALUE_BYTES``). Shown
    once per step and process; ``warnings.simplefilter("error", pk.LargeValueWarning)`` makes
    it an error, ``pk.connect(max_value_bytes=...)`` a limit of the store."""


def alarm(max_value_bytes: int | None, warn: bool) -> int:
    """The size above which a value needs a look: the limit, or the warning's size."""
    return min(max_value_bytes or NO_ALARM, LARGE_VALUE_BYTES if warn else NO_ALARM)


def large_value(codec: Any, size: int, what: str, key: str) -> None:
    """``size`` (serialized bytes of ``what``) passed the codec's alarm: refuse it above the
    store's ``max_value_bytes``, else warn once per ``key`` (a step's or a channel's name)."""
    limit: int | None = codec.max_value_bytes
    if limit is not None and size > limit:
        raise ValueTooLargeError(
            f"{what} is {_shown(size)} serialized, more than the store's max_value_bytes={limit}: "
            "refused, and nothing of it was written. Keep large data out of steps and state: write "
            "it elsewhere (a file, an object store) and return or keep a reference to it; or, if it "
            "belongs in the store, raise max_value_bytes= and offload large values with "
            "pk.connect(url, blobs='s3://bucket/prefix')",
            path="", size=size, limit=limit,
        )
    if size > LARGE_VALUE_BYTES and key not in _warned:
        _warned.add(key)
        warnings.warn(
            LargeValueWarning(
                f"{what} is {_shown(size)} serialized (more than {_shown(LARGE_VALUE_BYTES)}): every "
                "write and every resume of it moves that much. Offload large values to a blob store "
                "with pk.connect(url, blobs='s3://bucket/prefix'), or keep a reference to the data "
                "instead of the data; pk.connect(max_value_bytes=...) refuses values above a size. "
                "(Shown once per step.)"
            ),
            stacklevel=2,
        )


def _shown(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB" if size >= 1024 * 1024 else f"{size} bytes"
