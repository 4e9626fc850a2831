"""With ``ttl``, Redis's thread index expires and forgets expired threads."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import persistkit as pk


@pytest.fixture
def prefixed(redis_url: str) -> Iterator[tuple[str, Any]]:
    import redis

    admin = redis.Redis.from_url(redis_url)
    prefix = f"pktest:ttlidx-{uuid.uuid4().hex[:12]}:"
    yield prefix, admin
    keys = list(admin.scan_iter(match=prefix + "*", count=1000))
    if keys:
        admin.delete(*keys)
    admin.close()


def test_expired_threads_leave_the_index(redis_url: str, prefixed: tuple[str, Any]) -> None:
    prefix, admin = prefixed
    index = (prefix + "threads").encode()
    store = pk.connect(f"{redis_url}?volatile=true&prefix={prefix}", ttl=60)
    for tid in ("a", "b", "c"):
        with pk.resume(tid, store=store) as run:
            run.state["n"] = tid
    assert 0 < admin.pttl(index) <= 60_000  # the index expires too (it never did)
    assert store.threads() == ["a", "b", "c"]
    # Threads "a" and "b" expire (their keys go; the index lives on while "c" is written).
    for key in admin.scan_iter(match=prefix + "*", count=1000):
        # keep "c" ({base64url("c")}: "Yw"), and the store's identity (it has no ttl: _redis_guard.py)
        if key not in (index, f"{prefix}store".encode()) and not key.startswith(f"{prefix}{{Yw".encode()):
            admin.pexpire(key, 1)
    time.sleep(0.05)
    assert store.threads() == ["c"]
    assert admin.zcard(index) == 1  # the stale ids are gone, not only filtered
    with pk.resume("a", store=store) as run:  # written again: listed again
        run.state["n"] = "again"
    assert store.threads() == ["a", "c"]
    store.close()
