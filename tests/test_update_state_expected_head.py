"""store.update_state(expected_head=): a compare-and-swap on the head's checkpoint id, and
coordination.fenced: update_state under a lease's fencing token."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from conftest import make_url, uid

import persistkit as pk
from persistkit.coordination import fenced
from persistkit.coordination._hooks import hold_sync, let_go_sync


@pytest.fixture(params=["memory", "sqlite", "postgres", "redis", "s3"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> pk.Store:
    s = pk.connect(make_url(request.param, request, tmp_path_factory))
    request.addfinalizer(s.close)
    return s


def test_expected_head_writes_only_on_that_head(store: pk.Store) -> None:
    thread = uid("eh")
    first = store.update_state(thread, {"n": 1}, expected_head=None)  # None: the thread is empty
    with pytest.raises(pk.ConflictError, match="expected_head=None"):
        store.update_state(thread, {"n": 2}, expected_head=None)
    second = store.update_state(thread, {"n": 2}, expected_head=first.checkpoint_id)
    with pytest.raises(pk.ConflictError) as err:
        store.update_state(thread, {"n": 3}, expected_head=first.checkpoint_id)  # stale
    assert err.value.found_checkpoint == second.checkpoint_id
    with pytest.raises(pk.ConflictError):
        asyncio.run(store.aupdate_state(thread, {"n": 3}, expected_head=first.checkpoint_id))
    asyncio.run(store.aupdate_state(thread, {"n": 3}, expected_head=second.checkpoint_id))
    assert store.get_state(thread) == {"n": 3}
    store.update_state(thread, {"n": 4})  # no expected_head: on top of whatever the head is
    assert store.get_state(thread) == {"n": 4}


def test_fenced_update_state_is_refused_once_the_lease_was_taken_over(store: pk.Store) -> None:
    thread = uid("fence")
    holding = hold_sync(store, thread, "", "reject", True, 30.0, 0, None)
    assert holding is not None
    try:
        with fenced(holding.lease):
            store.update_state(thread, {"n": 1})  # the holder writes
            rec = store.backend.lease_get(thread, "")
            assert rec is not None
            thief = json.dumps({"o": "thief", "e": time.time() + 3600, "p": None, "q": []}).encode()
            assert store.backend.lease_swap(thread, "", rec.version, rec.token + 1, thief)
            with pytest.raises(pk.LeaseLostError):
                store.update_state(thread, {"n": 2})
        store.update_state(thread, {"n": 3}, namespace="other")  # other namespaces are not fenced
    finally:
        let_go_sync(store, holding)
    assert store.get_state(thread) == {"n": 1}
