"""``persistkit limits`` and rate limits on a store without the kv capability (docs/flow-control.md)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import plain_store  # noqa: F401 -- registers plainfile://
import pytest

import persistkit as pk
from persistkit._cli import main


def test_limits_lists_each_limit_and_key_with_its_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/limits.db"
    with pk.connect(url) as store:
        store.limits.set("openai", rate="1/hour", burst=4, timeout=0)
        store.limits.set("idle", rate="50/s")
        for _ in range(3):
            store.limits.acquire("openai", key="tenant-a")
        store.limits.throttle("openai", 600, key="tenant-b")
    assert main(["limits", "--url", url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["concurrency"] == []  # no turn took a slot
    rows = {(r["name"], r["key"]): r for r in shown["rate_limits"]}
    assert set(rows) == {("idle", ""), ("openai", "tenant-a"), ("openai", "tenant-b")}
    a, b, idle = rows["openai", "tenant-a"], rows["openai", "tenant-b"], rows["idle", ""]
    assert (a["rate"], a["burst"], a["available"], a["in_use"], a["waiting"]) == (
        "1/hour",
        4,
        1,
        3,
        0,
    )
    assert a["throttled_until"] is None and b["throttled_until"] is not None and b["available"] == 0
    assert (idle["available"], idle["in_use"]) == (1, 0)
    assert main(["limits", "--url", url, "--name", "openai"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["limit", "key", "rate", "burst"]
    assert [line.split()[:2] for line in table[1:]] == [
        ["openai", "tenant-a"],
        ["openai", "tenant-b"],
    ]
    assert "(in " in table[2]  # the throttle's reset, and how far off it is
    # a mistyped name is not an empty table with exit 0
    assert main(["limits", "--url", url, "--name", "opneai"]) == 3
    assert "no rate or concurrency limit named 'opneai'" in capsys.readouterr().err
    assert main(["limits", "--url", url, "--name", "bad/name"]) == 1
    assert "limit name 'bad/name'" in capsys.readouterr().err


def test_limits_shows_each_concurrency_key_with_holders_waiters_and_average_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each key a turn took a slot of: name, key, limit, holders, waiting (from the slot record,
    which holds the name and key), after the rate limits; --name selects either kind."""
    url = f"sqlite:///{tmp_path}/slots.db"
    limit = ("tenant", "acme", 1)
    with pk.connect(url) as store:
        store.limits.set("openai", rate="10/s")
        queued = threading.Event()

        def second() -> None:
            with pk.connect(url) as other, pk.resume("t2", store=other, concurrency=limit):
                pass

        with pk.resume("t1", store=store, concurrency=limit):
            waiter = threading.Thread(target=second)
            waiter.start()
            for _ in range(2000):  # until the second turn waits in the slot record's queue
                info = pk.Concurrency(*limit).info(store)
                if info is not None and info.waiting:
                    queued.set()
                    break
                threading.Event().wait(0.01)
            assert queued.is_set()
            assert main(["limits", "--url", url, "--json"]) == 0
            shown = json.loads(capsys.readouterr().out)
            assert [r["name"] for r in shown["rate_limits"]] == ["openai"]
            (slot,) = shown["concurrency"]
            assert (slot["name"], slot["key"], slot["limit"]) == ("tenant", "acme", 1)
            assert len(slot["holders"]) == 1 and len(slot["waiting"]) == 1
            assert main(["limits", "--url", url]) == 0
            table = capsys.readouterr().out.splitlines()
            at = next(i for i, line in enumerate(table) if line.startswith("concurrency"))
            assert table[at].split() == ["concurrency", "key", "limit", "holders", "waiting", "average_hold"]
            assert table[at + 1].split() == ["tenant", "acme", "1", "1", "1", "-"]
        waiter.join(timeout=60)
        assert not waiter.is_alive()
    assert main(["limits", "--url", url, "--name", "tenant", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["rate_limits"] == []
    (slot,) = shown["concurrency"]
    assert slot["holders"] == [] and slot["waiting"] == [] and slot["average_hold"] > 0
    assert main(["limits", "--url", url, "--name", "openai", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["concurrency"] == []


def test_a_store_without_kv_says_which_stores_have_it(tmp_path: Path) -> None:
    store = pk.connect(f"plainfile://{tmp_path}/plain.json")
    with pytest.raises(
        pk.ConfigurationError, match=r"'kv' capability.*rate limits.*memory.*sqlite.*postgres"
    ):
        store.limits.set("openai", rate="10/s")
    with (
        pytest.raises(pk.ConfigurationError, match="'kv' capability"),
        pk.limited("openai", store=store),
    ):
        pass
    store.close()
