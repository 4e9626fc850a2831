"""A Redis that will lose data is refused unless the URL says ``?volatile=true``, and a store
that lost its data under a live process raises instead of running committed steps again.

The test Redis (like many a development one) runs without persistence; these tests read
its settings first, so each asserts what persistkit must do with the server they meet.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import persistkit as pk

redis = pytest.importorskip("redis")

from persistkit.backends._redis_guard import Guard, data_loss_settings  # noqa: E402


@pytest.fixture
def admin(redis_url: str) -> Iterator[Any]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def prefix(admin: Any) -> Iterator[str]:
    p = f"pktest:durable:{uuid.uuid4().hex[:10]}:"
    yield p
    _wipe(admin, p)


def _wipe(admin: Any, prefix: str) -> None:
    keys = list(admin.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        admin.delete(*keys)


def _persistent(admin: Any) -> bool:
    config = {**admin.config_get("appendonly"), **admin.config_get("save"), **admin.config_get("maxmemory-policy")}
    return not data_loss_settings(config["appendonly"], config["save"], config["maxmemory-policy"], ttl=False)


def test_a_server_that_will_lose_data_is_refused_unless_the_url_says_volatile(
    redis_url: str, admin: Any, prefix: str
) -> None:
    store = pk.connect(f"{redis_url}?prefix={prefix}")
    try:
        if _persistent(admin):
            assert store.threads() == []
        else:
            with pytest.raises(pk.ConfigurationError, match=r"will lose data: .*appendonly yes.*\?volatile=true") as info:
                store.threads()
            assert "maxmemory-policy" in str(info.value) or "save is empty" in str(info.value)
            with pytest.raises(pk.ConfigurationError):  # every time, not only the first
                store.threads()
            assert not list(admin.scan_iter(match=f"{prefix}*"))  # nothing was written
    finally:
        store.close()
    volatile = pk.connect(f"{redis_url}?volatile=true&prefix={prefix}")
    assert volatile.threads() == []
    volatile.close()


@pytest.mark.parametrize(
    ("appendonly", "save", "policy", "ttl", "found"),
    [
        ("no", "", "noeviction", False, ["no persistence"]),
        ("yes", "", "noeviction", False, []),
        ("no", "3600 1", "noeviction", False, []),
        ("yes", "", "allkeys-lru", False, ["maxmemory-policy is 'allkeys-lru'"]),
        ("yes", "", "volatile-lru", False, []),  # evicts only keys with a ttl: this store sets none
        ("yes", "", "volatile-lru", True, ["maxmemory-policy is 'volatile-lru'"]),
        ("no", "", "allkeys-random", False, ["no persistence", "maxmemory-policy is 'allkeys-random'"]),
        (None, None, None, False, []),  # CONFIG refused (a managed service): trusted
    ],
)
def test_the_settings_that_lose_data(
    appendonly: str | None, save: str | None, policy: str | None, ttl: bool, found: list[str]
) -> None:
    got = data_loss_settings(appendonly, save, policy, ttl)
    assert len(got) == len(found) and all(got[i].startswith(f) for i, f in enumerate(found))


def test_a_server_that_refuses_config_is_trusted() -> None:
    guard = Guard(b"p:store", "redis://managed:6379/0", volatile=False, ttl=False)
    refused = redis.exceptions.ResponseError("ERR unknown command 'CONFIG'")
    guard.judge([refused, refused, refused, None], None)  # no error: the settings cannot be seen
    noperm = redis.exceptions.NoPermissionError("NOPERM this user has no permissions to run the 'config' command")
    guard.judge([noperm, noperm, noperm, None], None)


def test_a_look_sent_before_the_first_write_and_judged_after_it_is_no_loss() -> None:
    # Eight threads open connections while one of them writes first (CI found it): a
    # connection's GET answered "nothing stored" before the identity was written, and was
    # judged after another thread recorded the identity.
    guard = Guard(b"p:store", "redis://h:6379/0", volatile=True, ttl=False)
    known = guard.identity  # the connection sends its GET now ...
    guard.written_identity([True, b"id-1"])  # ... another thread's first write lands ...
    guard.judge([None], known)  # ... and the empty answer is judged: no loss
    with pytest.raises(pk.StoreLostError, match="is gone"):
        guard.judge([None], guard.identity)  # a look sent after the write that finds nothing is one
    with pytest.raises(pk.StoreLostError, match="another one"):
        guard.judge([b"id-2"], None)


def _kill_connections(admin: Any, name: str) -> int:
    killed = 0
    for client in admin.client_list():
        if client.get("name") == name:
            killed += int(admin.client_kill_filter(_id=client["id"]))
    return killed


def test_a_store_that_lost_its_data_under_a_live_process_raises_instead_of_running_steps_again(
    redis_url: str, admin: Any, prefix: str
) -> None:
    name = f"pkloss{uuid.uuid4().hex[:8]}"
    store = pk.connect(f"{redis_url}?volatile=true&prefix={prefix}&client_name={name}")
    ran: list[str] = []

    @pk.checkpointed
    def charge(amount: int) -> str:
        ran.append("charge")
        return f"charged {amount}"

    with pk.resume("t-loss", store=store, run_id="r1"):
        charge(5)
    assert ran == ["charge"]
    # What a restart without persistence does: every key gone, every connection dropped.
    _wipe(admin, prefix)
    assert _kill_connections(admin, name) >= 1
    with pytest.raises(pk.StoreLostError, match="lost its data while this process had it open") as info, \
            pk.resume("t-loss", store=store, run_id="r1"):
        charge(5)
    assert ran == ["charge"]  # the committed step did not run again
    assert not info.value.retryable and "appendonly yes" in str(info.value)
    store.close()
    # a store opened again starts over on the emptied server, as the message says
    again = pk.connect(f"{redis_url}?volatile=true&prefix={prefix}")
    assert again.threads() == []
    again.close()


def test_an_old_lease_holder_cannot_write_into_a_store_that_lost_its_data(
    redis_url: str, admin: Any, prefix: str
) -> None:
    """After the loss a new holder's fencing token starts again from the bottom; the old
    holder's token, higher, must never land there: its every connection refuses."""
    name = f"pkfence{uuid.uuid4().hex[:8]}"
    old = pk.connect(f"{redis_url}?volatile=true&prefix={prefix}&client_name={name}")
    new = pk.connect(f"{redis_url}?volatile=true&prefix={prefix}")

    @pk.checkpointed
    def step(n: int) -> int:
        return n

    def new_holder() -> None:  # another worker, after the loss: takes the lease, token from the bottom
        with pk.resume("t-fence", store=new, run_id="new"):
            step(100)

    with pytest.raises(pk.StoreLostError), pk.resume("t-fence", store=old, run_id="old"):
        for n in range(3):
            step(n)
        _wipe(admin, prefix)
        _kill_connections(admin, name)
        worker = threading.Thread(target=new_holder)
        worker.start()
        worker.join()
        step(3)  # the old holder, whose lease and higher token the store forgot
    assert {c.run_id for c in new.history("t-fence")} == {"new"}  # nothing of the old holder landed
    old.close()
    new.close()


def test_a_store_emptied_while_this_process_stayed_connected_is_caught_at_the_next_turn(
    redis_url: str, admin: Any, prefix: str
) -> None:
    """A FLUSHALL drops no connection, so the connect hook cannot see it: the lease take
    that starts each turn reads the identity in its own round trip."""
    store = pk.connect(f"{redis_url}?volatile=true&prefix={prefix}")
    ran: list[int] = []

    @pk.checkpointed
    def step(n: int) -> int:
        ran.append(n)
        return n

    with pk.resume("t-flush", store=store, run_id="r1"):
        step(1)
    _wipe(admin, prefix)  # what FLUSHALL does to this store, its connections left open
    with pytest.raises(pk.StoreLostError), pk.resume("t-flush", store=store, run_id="r1"):
        step(1)
    assert ran == [1]
    store.close()
