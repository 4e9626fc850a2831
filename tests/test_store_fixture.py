"""A store written before the package's root was grouped into packages is read the same after.

``tests/fixtures/store_before_regroup.db`` (+ ``_blobs.db``) was written by commit 257ec59
(``tests/fixtures/make_store_fixture.py`` says what it holds: a versioned ``pk.State`` with
list channels, nested registered models and dataclasses, secret handles, a recorded step
error, a fork, an offloaded value, every record encrypted and integrity-sealed). The keys
are fixed test keys (``make_store_fixture.ENCRYPTION_KEY`` / ``INTEGRITY_KEY``).
``store_before_regroup.json`` is what that commit read back from it; the code of today must
read exactly the same, replay the recorded runs without running a step, verify every
record, and go on writing to it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIXTURES))

import make_store_fixture as fx  # noqa: E402
from fixture_types import Chat, Msg, Note, ToolCall  # noqa: E402
from snapshot import snapshot  # noqa: E402

import persistkit as pk  # noqa: E402


@pytest.fixture
def store(tmp_path: Path) -> Any:
    """A copy of the committed files (opening may not change them, but a test writes on)."""
    db, blobs = tmp_path / fx.DB.name, tmp_path / fx.BLOBS.name
    shutil.copy(fx.DB, db)
    shutil.copy(fx.BLOBS, blobs)
    s = fx.open_store(db, blobs)
    yield s
    s.close()


@pytest.fixture
def secrets_known() -> Any:
    """The values behind the stored handles, registered as a resuming process would."""
    pk.secrets.register("openai", fx.DETECTED)
    pk.secrets.register("fixture-named", fx.NAMED)
    yield
    pk.secrets.unregister("openai")
    pk.secrets.unregister("fixture-named")


def test_every_thread_reads_as_it_was_written(store: pk.Store) -> None:
    expected = json.loads(fx.EXPECTED.read_text(encoding="utf-8"))
    got = snapshot(store)
    assert sorted(got) == ["chat", "chat-fork", "dict-thread"]
    for thread in expected:
        assert got[thread]["history"] == expected[thread]["history"], thread
        for checkpoint_id, state in expected[thread]["states"].items():
            assert got[thread]["states"][checkpoint_id] == state, (thread, checkpoint_id)
    assert got == expected


def test_the_head_state_holds_every_kind_of_stored_value(store: pk.Store) -> None:
    st = store.get_state("chat", state=Chat)
    assert isinstance(st, Chat)
    assert [m.text for m in st.messages] == [
        "answer 0 to hello", "answer 1 to weather", f"my key is $CRED{{openai-{_tag(store)}}}",
        "answer 0 to and tomorrow?", f"my key is $CRED{{openai-{_tag(store)}}}",
    ]
    assert all(type(m) is Msg for m in st.messages) and st.total == 0 + 10 + 0
    assert [n.title for n in st.notes] == ["plan for hello", "plan for and tomorrow?"]
    assert st.notes[1].calls == [ToolCall("search", {"q": "and tomorrow?"}),
                                 ToolCall("fetch", {"url": "https://example.com/and tomorrow?"})]
    assert type(st.notes[0]) is Note
    assert isinstance(st.api_key, pk.Secret) and st.api_key.name == "fixture-named"
    assert st.tags == {"run-1", "run-2"}
    assert st.blob == fx.big_value(1).encode()
    fork = store.get_state("chat-fork", state=Chat)
    assert [m.text for m in fork.messages][-1] == "forked" and fork.total == 10 + 1
    plain = store.get_state("dict-thread")
    assert plain["edited"] is True and plain["msgs"] == [Msg(role="assistant", text="answer 7 to dict", tokens=70)]
    assert plain["calls"] == {"first": ToolCall("x", {"k": [1, 2.5, None]})}
    failed = [c for c in store.history("chat") if c.status == "failed"]
    assert [c.error for c in failed] == ["Boom: tool 1 failed: quota exceeded", "Boom: tool 2 failed: quota exceeded"]  # newest first


def _tag(store: pk.Store) -> str:
    text = json.loads(fx.EXPECTED.read_text(encoding="utf-8"))["chat"]["states"]
    found = {m["text"] for s in text.values() for m in s["messages"] if m["text"].startswith("my key is")}
    (only,) = found
    return only.removeprefix("my key is $CRED{openai-").removesuffix("}")


def test_the_recorded_runs_replay_without_running_a_step(store: pk.Store, secrets_known: None) -> None:
    fx.CALLS.clear()
    for run_id, prompts in (("run-1", ["hello", "weather"]), ("run-2", ["and tomorrow?"])):
        out = fx.run_chat(store, "chat", run_id, prompts)
        assert out["error"] == f"tool {len(prompts)} failed: quota exceeded"
        assert out["total"] == 10  # run-1: 0 + 10; run-2 adds 0
    assert not fx.CALLS
    assert [c.run_id for c in store.history("chat")][:1] == ["run-2"]


def test_integrity_holds_and_the_store_goes_on(store: pk.Store, secrets_known: None) -> None:
    report = store.verify()
    assert report.ok, report
    before = len(store.history("chat"))
    fx.CALLS.clear()
    out = fx.run_chat(store, "chat", "run-3", ["after the move"])
    assert fx.CALLS == {"call_llm": 1, "plan": 1, "tool": 2, "flaky": 1, "big": 1}
    assert out["error"] == "tool 1 failed: quota exceeded"
    st = store.get_state("chat", state=Chat)
    assert st.messages[-2].text == "answer 0 to after the move" and st.tags == {"run-1", "run-2", "run-3"}
    # the handles written before the move resolve after it (the store's handle key, the names)
    assert st.api_key is not None and st.api_key.reveal() == fx.NAMED
    assert pk.secrets.resolve(st.messages[2].text, store=store) == f"my key is {fx.DETECTED}"
    assert len(store.history("chat")) > before
    assert store.verify().ok


def test_the_keys_open_nothing_else(tmp_path: Path) -> None:
    """The fixture is really sealed: without its encryption key it does not read."""
    db = tmp_path / "x.db"
    shutil.copy(fx.DB, db)
    s = pk.connect(f"sqlite:///{db}", encryption={"other": bytes(32)})
    try:
        with pytest.raises(pk.PersistkitError):
            s.get_state("chat", state=Chat)
    finally:
        s.close()
