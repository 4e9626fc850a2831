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
_LOW = 1 << 48  # an id is 12 hex digits of milliseconds, then 12 of counter
_lock = threading.Lock()
# The last id as (milliseconds, counter): two small ints, where one 96-bit int
# made every id cost big-int arithmetic and formatting.
_last_ms = 0
_last_low = 0
_last_text = ""  # the last id's text: the usual parent, which then needs no parsing


def next_checkpoint_id(parent: str | None = None) -> str:
    """A new checkpoint id, greater than ``parent`` and than any id made before in this process."""
    global _last_ms, _last_low, _last_text
    # Random low bits keep ids of different processes apart within a millisecond;
    # they are not secrets (ids are visible in every listing).
    ms = _time_ns() // 1_000_000
    low = _getrandbits(32) << 8
    _acquire()  # not `with`: this runs on every step, and the method calls are cheaper
    try:
        if ms < _last_ms or (ms == _last_ms and low <= _last_low):
            ms, low = _last_ms, _last_low + 1
        if parent is not None and parent != _last_text and _RE.match(parent):
            p_ms, p_low = int(parent[:12], 16), int(parent[12:], 16)
            if p_ms > ms or (p_ms == ms and p_low >= low):
                ms, low = p_ms, p_low + 1
        if low >= _LOW:  # the counter carries into the milliseconds
            ms, low = ms + 1, 0
        ms &= _LOW - 1  # 12 hex digits (until the year 10889)
        _last_ms, _last_low = ms, low
        _last_text = text = ((ms << 48) | low).to_bytes(12, "big").hex()
    finally:
        _release()
    return text


# Bound once (the per-step path); tests that need fixed ids patch these two.
_time_ns = time.time_ns
_acquire, _release = _lock.acquire, _lock.release
_getrandbits = random.getrandbits  # the module's shared generator, as random.getrandbits is


def reset() -> None:
    """Forget the last id (tests that build a fixed corpus of ids)."""
    global _last_ms, _last_low, _last_text
    with _lock:
        _last_ms, _last_low, _last_text = 0, 0, ""


def is_checkpoint_id(value: object) -> bool:
    return isinstance(value, str) and _RE.match(value) is not None


def checkpoint_time(checkpoint_id: str) -> float:
    """The creation time encoded in a checkpoint id, in seconds since the epoch."""
    return (int(checkpoint_id, 16) >> 48) / 1000.0


def new_run_id() -> str:
    return os.urandom(16).hex()


