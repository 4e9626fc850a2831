"""What a step costs must not depend on how the loop is written (issue 13).

The same loop (a step returns a 1 KB message, the caller appends it) cost
~130 µs a step in a script and ~205 µs in a function of an imported module.
The cause: the secret scan's first pass ran the token patterns over the whole
record whenever it held an underscore anywhere and "gh" anywhere — an
underscore that came from the step's or the state class's name
(``make_message``, ``run_agent.<locals>.Chat``), "gh" from the message (a
third of base64 messages, English words like "right"). Wall time is not
asserted here; the work is: the token patterns must not run at all for
records that hold no token prefix, whatever the names.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit.secrets import _redact as _secrets
from persistkit.secrets import _scan


class _Counting:
    def __init__(self, rx: Any) -> None:
        self.rx, self.calls = rx, 0

    def match(self, data: bytes, pos: int = 0) -> Any:
        self.calls += 1
        return self.rx.match(data, pos)


def texts(kind: str) -> list[str]:
    rng = random.Random(11)
    if kind == "base64":
        return [base64.b64encode(rng.randbytes(768)).decode() for _ in range(40)]
    words = ["Right", "night", "Alice", "GitHub", "high", "Zurich", "thought", "JSON", "Yes", "ASAP", "weigh"]
    return [" ".join(rng.choice(words) for _ in range(170))[:1000] for _ in range(40)]


def run_agent(store: pk.Store, step_name: str, schema: str, msgs: list[str]) -> str:
    """The loop in a function, with its class and step defined in it (names chosen by the test)."""

    class Chat(pk.State, name=schema):
        messages: list[str] = []

    @pk.checkpointed(name=step_name)
    def make_message(i: int) -> str:
        return msgs[i]

    tid = uid("cost")
    with pk.resume(tid, store=store, state=Chat) as run:
        for i in range(len(msgs)):
            run.state.messages.append(make_message(i))
    return tid


@pytest.mark.parametrize("kind", ["base64", "english"])
@pytest.mark.parametrize(
    ("step_name", "schema"),
    [("produce", "Chat"), ("make_message", "Chat"), ("produce", "run_agent.<locals>.Chat"), ("fetch_gh_page", "my_app.state")],
)
def test_names_do_not_make_the_secret_scan_run_the_token_patterns(
    local_store: pk.Store, monkeypatch: pytest.MonkeyPatch, kind: str, step_name: str, schema: str
) -> None:
    _secrets._may_match_builtin(b"sk-" + b"a" * 30)  # compiles the token patterns
    counting = {kind: _Counting(rx) for kind, rx in _scan._LOOSE.items()}
    for token_kind, counter in counting.items():
        monkeypatch.setitem(_scan._LOOSE, token_kind, counter)
    msgs = texts(kind)
    assert sum("gh" in m for m in msgs) >= 5  # the messages do hold "gh"
    tid = run_agent(local_store, step_name, schema, msgs)
    assert sum(c.calls for c in counting.values()) == 0
    assert local_store.get_state(tid)["messages"] == msgs


@pytest.mark.parametrize(
    "token",
    [
        "ghp_R8sT2uV4wX6yZ8aB0cD2eF4gH6iJ8kL0mN2p",
        "gho_R8sT2uV4wX6yZ8aB0cD2eF4gH6iJ8kL0mN2p",
        "github_pat_11ABCDEFG0Zq8Wx7Ve6Ut5_Sr4Qp3On2Ml1Kj0Ih9Gf8Ed7Cb6Az5Yx4Wv3Ut2Sr1Qp0On9Ml8Kj7",
        "sk_live_51Hq2Wx3Ec4Rv5Tb6Yn7Um8Ik9Ol0",
        "rk_test_51Hq2Wx3Ec4Rv5Tb6Yn7Um8Ik9Ol0",
    ],
)
def test_tokens_with_an_underscore_prefix_are_still_found(token: str) -> None:
    assert _secrets._may_match_builtin(f'{{"r":"see {token} here"}}'.encode())
    assert token not in pk.connect("memory://").codec.dump_tree({"r": f"see {token}"}).decode()
