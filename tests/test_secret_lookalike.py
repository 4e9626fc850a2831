"""Text that merely looks like a secret handle (a user pasting persistkit docs into a chat)
is stored escaped and comes back exactly as typed: never a handle, never resolved, never
refused as one — crossed with how it reaches the store.

The bug this guards: a run keeps what it committed as live trees (not as stored), and the
newest list item (``Loader._committed``), a step replayed in the same run and a restored
state were decoded as stored trees: a typed ``$CRED{env:X}`` was taken for a handle read
back unresolved, written unescaped next time (a real handle from then on), and refused
before the next step ("it would be handed the handle ... as text").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit._cli import main
from persistkit.secrets._registry import _loaded, _unresolved_live

L = "user text: $CRED{env:NOT_A_HANDLE} stays"
L2 = "two: $CRED{env:NOT_A_HANDLE} and $CRED{openai} and $CRED{$} and $CRED{ open"
ESC = "an escape typed: $CRED{$}env:X} and $CRED{$}"
PAD = " padding" * 20  # over the dedupe size: the list item is stored as a reference to the result
SECRET = "s3cr3t-Lookalike-Value-9f8e7d6c5b4a"
NAME = "lookalike_key"
WITH_SECRET = f"{L} next to key={SECRET}"

ITEMS: dict[str, list[Any]] = {
    "str-then-plain": ["a", L],
    "plain-then-str": [L, "a"],
    "two-equal-str": [L, L],
    "three-equal-after-plain": ["x", L, L],
    "many": [L, L2, L, ESC, L, L2, L, L],
    "dict": [{"c": L}],
    "two-equal-dicts": [{"c": L}, {"c": L}],
    "nested": [{"c": [L, {"d": L}], L: 1}, {"c": [L, {"d": L}], L: 1}],
    "two-in-one-string": [L2, L2],
    "escape-typed": [ESC, ESC],
    "dedupe-ref-str": [L + PAD, L + PAD],
    "dedupe-ref-dict": [{"c": L, "p": PAD}, {"c": L, "p": PAD}],
    "with-secret": [WITH_SECRET, WITH_SECRET],
    "with-secret-dedupe": [WITH_SECRET + PAD, WITH_SECRET + PAD, {"k": WITH_SECRET, "p": PAD}],
}
HANDLES = ("$CRED{env:NOT_A_HANDLE}", "$CRED{openai}", "$CRED{env:X}")


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    for h in HANDLES:  # each test on its own: a failure before must not decide this one
        _loaded.discard(h)
        _unresolved_live.discard(h)
    pk.secrets.register(NAME, SECRET)
    yield
    pk.secrets.unregister(NAME)


def _inspected(value: Any) -> Any:
    """``value`` as inspection shows it: the registered secret as its handle (never resolved)."""
    if isinstance(value, str):
        return value.replace(SECRET, "$CRED{" + NAME + "}")
    if isinstance(value, list):
        return [_inspected(v) for v in value]
    if isinstance(value, dict):
        return {_inspected(k): _inspected(v) for k, v in value.items()}
    return value


def _no_handle_held() -> None:
    """No typed lookalike was ever taken for a handle read back from a store."""
    for h in HANDLES:
        assert h not in _loaded and h not in _unresolved_live, h


def _loop(store: pk.Store, thread: str, items: list[Any]) -> None:
    @pk.checkpointed(name="look.r")
    def r(i: int) -> Any:
        return items[i]

    with pk.resume(thread, store=store) as run:
        for i in range(len(items)):
            run.state.setdefault("log", []).append(r(i))
    with pk.resume(thread, store=store) as run:  # replays, with the state read back
        assert r(0) == items[0]
        assert run.state["log"] == items


@pytest.mark.parametrize("case", sorted(ITEMS))
def test_lookalike_list_items_come_back_as_typed(store_url: str, case: str) -> None:
    items = ITEMS[case]
    store = pk.connect(store_url)
    thread = uid("look")
    _loop(store, thread, items)
    _no_handle_held()
    assert store.get_state(thread)["log"] == _inspected(items)
    again = pk.connect(store_url)  # a new store object: nothing cached
    assert again.get_state(thread)["log"] == _inspected(items)
    assert pk.secrets.resolve(again.get_state(thread), store=again)["log"] == items
    with pk.resume(thread, store=again) as run:  # and a step runs with the state read back
        run.state["log"].append(r_next())
        assert run.state["log"] == [*items, "next"]
    fork = again.fork(thread, new_thread_id=uid("lookfork"))
    assert again.get_state(fork.thread_id)["log"] == _inspected([*items, "next"])
    _no_handle_held()


@pk.checkpointed(name="look.next")
def r_next() -> str:
    return "next"


def test_registered_secret_next_to_lookalike_is_redacted_and_resolves(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = pk.connect(store_url)
    thread = uid("looksec")
    items = ITEMS["with-secret-dedupe"]
    _loop(store, thread, items)
    if not store_url.startswith(
        "memory:"
    ):  # the CLI opens the URL anew: memory:// is this process's
        assert main(["show", "--url", store_url, thread, "--json"]) == 0
        out = capsys.readouterr().out
        assert SECRET not in out  # stored as its handle
        handle = "$CRED{" + NAME + "}"
        assert json.loads(out)["state"]["log"] == [
            WITH_SECRET.replace(SECRET, handle) + PAD,
            WITH_SECRET.replace(SECRET, handle) + PAD,
            {"k": WITH_SECRET.replace(SECRET, handle), "p": PAD},
        ]  # the lookalike as typed, the secret as its handle
    again = pk.connect(store_url)
    got = again.get_state(thread)["log"]
    assert got == _inspected(items)  # inspection: the secret as its handle, the lookalike verbatim
    assert pk.secrets.resolve(got, store=again) == items  # the secret resolves, the lookalike stays
    _no_handle_held()


def test_history_metadata_and_value_channel_keep_the_lookalike(store_url: str) -> None:
    store = pk.connect(store_url)
    thread = uid("lookmeta")
    with pk.resume(thread, store=store, metadata={"note": L}) as run:
        run.state["note"] = L
        run.state["pasted"] = {"doc": [L, L2, ESC]}
        r_next()
        run.state["note2"] = L
        r_next()
    with pk.resume(thread, store=store) as run:
        r_next()
        assert run.state["note"] == run.state["note2"] == L
    _no_handle_held()
    state = pk.connect(store_url).get_state(thread)
    assert state == {"note": L, "pasted": {"doc": [L, L2, ESC]}, "note2": L}
    assert all(cp.metadata.get("note") in (None, L) for cp in store.history(thread))


def test_in_run_replay_of_a_retried_parent_keeps_the_lookalike(store_url: str) -> None:
    """A retried parent replays its finished children from the records this run committed
    (live trees): their results come back as typed, and the next step is not refused."""
    store = pk.connect(store_url)
    calls = {"n": 0}

    @pk.checkpointed(name="look.child")
    def child(x: str) -> str:
        return x

    @pk.checkpointed(
        name="look.parent", retry=pk.Retry(attempts=2, wait_initial=0, wait_max=0, wait_jitter=0)
    )
    def parent() -> tuple[str, str, str]:
        got = (child(L), child(ESC), child(WITH_SECRET))
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("once")
        return got

    with pk.resume(uid("lookretry"), store=store) as run:
        run.state["note"] = L
        assert parent() == (L, ESC, WITH_SECRET)
        assert r_next() == "next"  # not refused: nothing was taken for a handle
        assert run.state["note"] == L
    _no_handle_held()
