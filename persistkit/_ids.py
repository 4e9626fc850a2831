"""Identifiers: time-ordered checkpoint ids and random run ids.

A checkpoint id is 24 lowercase hex digits: 12 for the Unix time in
milliseconds, 12 for a per-process counter seeded at random. Ids sort in
creation order within a process; across processes a thread's order comes
from its parent links, and :func:`next_checkpoint_id` makes every new id
sort after its parent's, so listing a thread by id is listing it in order.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time

__all__ = ["is_checkpoint_id", "new_run_id", "next_checkpoint_id"]

_WIDTH = 24
_RE = re.compile(r"^[0-9a-f]{24}$")
_MASK = (1 << (4 * _WIDTH)) - 1
_FORMAT = f"0{_WIDTH}x"
_lock = threading.Lock()
_last = 0
_last_text = ""  # _last as an id: the usual parent, which then needs no parsing


def next_checkpoint_id(parent: str | None = None) -> str:
    """A new checkpoint id, greater than ``parent`` and than any id made before in this process."""
    global _last, _last_text
    # Random low bits keep ids of different processes apart within a millisecond;
    # they are not secrets (ids are visible in every listing).
    now = (_time_ns() // 1_000_000 << 48) | (_getrandbits(32) << 8)
    with _lock:
        value = now if now > _last else _last + 1
        if parent is not None and parent != _last_text and _RE.match(parent):
            value = max(value, int(parent, 16) + 1)
        _last = value
        _last_text = text = format(value & _MASK, _FORMAT)
    return text


_time_ns = time.time_ns
_getrandbits = random.getrandbits  # the module's shared generator, as random.getrandbits is


def is_checkpoint_id(value: object) -> bool:
    return isinstance(value, str) and _RE.match(value) is not None


def checkpoint_time(checkpoint_id: str) -> float:
    """The creation time encoded in a checkpoint id, in seconds since the epoch."""
    return (int(checkpoint_id, 16) >> 48) / 1000.0


def new_run_id() -> str:
    return os.urandom(16).hex()


