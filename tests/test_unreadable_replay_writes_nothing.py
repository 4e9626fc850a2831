"""A resume that cannot read a step's recorded result writes nothing.

The result of a finished step is replayed from the store. When this process cannot read it
(the store opened without the ``blobs=`` it was written with, a secret handle whose source is
not set here), that is no failure of the run: the block raises the clear error and writes
no end record, so the thread's head and state stay as the crash left them and the resume
with the right options finishes the run, each finished step once. (It used to record the
run failed, its state rolled back to the last state it could restore.)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from conftest import uid

import persistkit as pk

RAN: list[str] = []
CRASH: list[bool] = []


@pk.checkpointed(name="test.unreadable.fetch")
def fetch(kind: str) -> str:
    RAN.append("fetch")
    if kind == "secret":
        return f"token {os.environ['PK_TEST_UNREADABLE_TOKEN']}"
    return os.urandom(40_000).hex()  # incompressible: offloaded above blob_threshold


@pk.checkpointed(name="test.unreadable.llm")
def llm(i: int) -> str:
    RAN.append(f"llm{i}")
    if CRASH and i == 2:
        raise KeyboardInterrupt  # the process dies here: nothing of this step is written
    return f"m{i}"


def agent(store: pk.Store, thread: str, kind: str) -> None:
    with pk.resume(thread, run_id="r1", store=store) as run:
        run.state.setdefault("msgs", [])
        run.state["doc"] = fetch(kind)
        for i in range(3):
            run.state["msgs"].append(llm(i))


@pytest.mark.parametrize("kind", ["blobs", "secret"])
def test_a_result_this_process_cannot_read_leaves_the_run_as_it_was(
    kind: str, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = uid(f"unreadable-{kind}")
    full: dict[str, Any] = {}
    if kind == "blobs":
        full = {"blobs": f"sqlite:///{tmp_path}/blobs.db", "blob_threshold": 1000}
    else:
        monkeypatch.setenv("PK_TEST_UNREADABLE_TOKEN", "sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7Jk")
    RAN.clear()
    CRASH[:] = [True]
    with pk.connect(store_url, **full) as store, pytest.raises(KeyboardInterrupt):
        agent(store, thread, kind)
    CRASH.clear()
    with pk.connect(store_url, **full) as store:
        before = [c.checkpoint_id for c in store.history(thread)]
        state = store.get_state(thread)
    lacking = pk.connect(store_url)  # no blobs= / the secret's source unset
    if kind == "secret":
        monkeypatch.delenv("PK_TEST_UNREADABLE_TOKEN")
    with lacking, pytest.raises(pk.StoreOptionsError if kind == "blobs" else pk.SecretResolutionError) as info:
        agent(lacking, thread, kind)
    assert thread in str(info.value)
    if kind == "secret":
        monkeypatch.setenv("PK_TEST_UNREADABLE_TOKEN", "sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7Jk")
    with pk.connect(store_url, **full) as store:
        assert [c.checkpoint_id for c in store.history(thread)] == before  # nothing was written
        assert store.get_state(thread) == state
        agent(store, thread, kind)  # the right options: the run finishes
        end = store.history(thread)[0]
        assert (end.kind, end.run_status) == ("end", "completed")
        assert store.get_state(thread)["msgs"] == ["m0", "m1", "m2"]
    assert RAN == ["fetch", "llm0", "llm1", "llm2", "llm2"]  # each finished step once
