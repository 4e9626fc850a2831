"""The timeline page (``persistkit timeline``, ``persistkit.ops._timeline``), read as HTML.

A thread with a run that fails at a step and is retried, is suspended, answered and
completes, then a second run, and a fork: the page must show each attempt's bars with the
right statuses, the error, the fork links, every value escaped and secrets as handles.
tests/test_timeline_browser.py opens the same page in Chromium.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit._cli import main
from persistkit.ops import _timeline
from persistkit.ops._timeline import model, render

XSS = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
SECRET = "sk-timeline-3f9a1c77d2e84b0b"


def build_thread(store: pk.Store, tid: str) -> dict[str, Any]:
    """The demo thread: run 1 fails at ``charge``, is retried (it then suspends), answered,
    and completes; run 2 appends one more note; then a fork of the thread. Returns ids."""
    fail = {"left": 1}

    @pk.checkpointed(name="fetch_order")
    def fetch_order(order: str) -> dict[str, Any]:
        return {"order": order, "note": XSS, "token": pk.Secret(SECRET, name="payments")}

    @pk.checkpointed(name="charge")
    def charge(amount: int) -> int:
        if fail["left"]:
            fail["left"] -= 1
            raise ConnectionError("payment gateway timed out <after 30 s>")
        return amount

    @pk.checkpointed(name="summarize")
    def summarize(n: int) -> str:
        return f"{n} notes"

    def run_one(run_id: str | None = None) -> pk.Run:
        with pk.resume(tid, store=store, run_id=run_id) as run:
            order = fetch_order("A-17")
            run.state.setdefault("notes", []).append(f"fetched {order['order']}")
            run.state["charged"] = charge(120)
            run.state["notes"].append("charged")
            run.state["approved"] = pk.suspend({"refund?": 120})
        return run

    with pytest.raises(ConnectionError):
        run_one()
    first_run = store.history(tid, limit=1)[0].run_id
    assert first_run is not None
    assert run_one(first_run).status == "suspended"
    store.answer(tid, True)
    assert run_one().status == "completed"
    with pk.resume(tid, store=store) as run2:
        run2.state["notes"].append("second run")
        summarize(len(run2.state["notes"]))
    fork = store.fork(tid, new_thread_id=tid + "-fork", update={"approved": False})
    return {"run1": first_run, "run2": run2.run_id, "fork": fork.thread_id}


def _bars(page: str) -> list[tuple[str, str]]:
    """(step name, status) of every bar, in page order."""
    found = re.findall(r'<button type="button" class="bar[^"]*" data-c="[^"]*" data-status="([^"]*)".*?'
                       r'<span class="name">([^<]*)</span>', page)
    return [(html.unescape(name), html.unescape(status)) for status, name in found]


def _data(page: str) -> dict[str, Any]:
    raw = re.search(r'<script type="application/json" id="pk-data">(.*?)</script>', page, re.S)
    assert raw is not None
    loaded: dict[str, Any] = json.loads(raw.group(1))
    return loaded


def test_the_page_shows_runs_attempts_statuses_errors_and_forks(store: pk.Store) -> None:
    tid = uid("timeline")
    ids = build_thread(store, tid)
    page = render(store, tid)

    assert page.startswith("<!doctype html>")
    # nothing to fetch, so it opens offline: no stylesheet, script or image from elsewhere
    assert not re.search(r'(src|href)="[a-z]+:', page) and "<link" not in page and "@import" not in page
    assert _bars(page) == [
        # run 1, attempt 1: fetch ran, charge failed, the run ended failed
        ("fetch_order", "ran"), ("charge", "failed"), ("end of run", "run failed"),
        # attempt 2 (the retry): fetch replayed, charge ran again, then the question
        ("fetch_order", "replayed"), ("charge", "retried"), ("pk.suspend", "suspended"),
        # attempt 3 (after the answer): both replayed, the answer, the end
        ("fetch_order", "replayed"), ("charge", "replayed"), ("pk.suspend", "answered"),
        ("end of run", "run completed"),
        # run 2
        ("summarize", "ran"), ("end of run", "run completed"),
    ]
    assert f'id="run-{ids["run1"]}"' in page and f'id="run-{ids["run2"]}"' in page
    assert "attempt 1 · failed" in page and "attempt 2 · suspended" in page and "attempt 3 · completed" in page
    assert "retry 1" in page  # the retried step says how many failures came before
    # the failed step's error is on its bar, escaped
    assert '<span class="err">ConnectionError: payment gateway timed out &lt;after 30 s&gt;</span>' in page
    # the fork, both ways
    assert f'href="{tid}-fork.html"' in page
    fork_page = render(store, ids["fork"])
    assert 'id="forked-from"' in fork_page and f'href="{tid}.html"' in fork_page
    assert _bars(fork_page) == [("fork", "fork")]


def test_values_are_escaped_and_secrets_stay_handles(store: pk.Store) -> None:
    tid = uid("timeline")
    build_thread(store, tid)
    page = render(store, tid)
    assert SECRET not in page  # never resolved: the page holds what the store holds
    assert "$CRED{payments}" in page
    # the only <script> tags are the page's own two; stored text cannot close them
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert "<img" not in page
    data = _data(page)
    assert any(json.dumps(XSS) in v for v in data["values"])  # kept as text, to be shown as text
    assert "'nonce-" in page  # the page's CSP runs its own script only


def test_a_clicked_step_has_result_state_and_diff(store: pk.Store) -> None:
    tid = uid("timeline")
    build_thread(store, tid)
    m = model(store, tid)
    run1 = m["runs"][0]
    charge = next(b for b in run1["attempts"][1]["bars"] if b["name"] == "charge")
    details = m["checkpoints"][charge["c"]]
    assert json.loads(m["values"][details["result"]]) == 120
    assert details["args"]  # the arguments digest
    def state(c: str) -> dict[str, Any]:
        return {k: json.loads(m["values"][i]) for k, i in m["checkpoints"][c]["state"].items()}

    assert state(charge["c"]) == {"notes": ["fetched A-17"]}  # committed with the step: before the caller's edit
    asked = next(b for b in run1["attempts"][1]["bars"] if b["status"] == "suspended")
    assert state(asked["c"]) == {"notes": ["fetched A-17", "charged"], "charged": 120}
    changes = {c["ch"]: c for c in m["checkpoints"][asked["c"]]["diff"]["changes"]}
    assert changes["charged"]["op"] == "added" and changes["notes"]["op"] == "appended"
    failed = next(b for b in run1["attempts"][0]["bars"] if b["status"] == "failed")
    assert m["checkpoints"][failed["c"]]["error"] == "ConnectionError: payment gateway timed out <after 30 s>"
    # run 2's step: the list got one item appended, shown as an append
    summarize = m["runs"][1]["attempts"][0]["bars"][0]
    diff = m["checkpoints"][summarize["c"]]["diff"]
    [change] = [c for c in diff["changes"] if c["ch"] == "notes"]
    assert change["op"] == "appended" and change["n"] == 1
    assert json.loads(m["values"][change["new"]]) == ["second run"]
    assert durations_known(m) and all(b["dur"] is None or b["dur"] >= 0 for b in bars_of(m))


def bars_of(m: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for r in m["runs"] for a in r["attempts"] for b in a["bars"]]


def durations_known(m: dict[str, Any]) -> bool:
    """Every bar after the first recorded one of its attempt has a duration."""
    for r in m["runs"]:
        for a in r["attempts"]:
            recorded = [b for b in a["bars"] if b["status"] != "replayed"]
            if any(b["dur"] is None for b in recorded[1:]) or recorded[0]["dur"] is not None:
                return False
    return True


def test_long_values_and_long_threads_are_cut(local_store: pk.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    tid = uid("timeline")
    with pk.resume(tid, store=local_store) as run:
        run.state["big"] = "x" * 50_000
        run.state["log"] = [f"line {i}" for i in range(5_000)]
    for i in range(5):
        local_store.update_state(tid, {"n": i})
    page = render(local_store, tid)
    assert len(page) < 60_000  # 50 KB and 5,000 items, each value cut to VALUE_CAP
    assert "… cut: 50,002 characters in all, the first 4,000 shown" in html.unescape(page)
    data = _data(page)
    log = next(v for v in data["values"] if "line 4999" in v)
    assert log.startswith("… cut: items 0..") and "line 0\"" not in log  # the newest items are kept
    monkeypatch.setattr(_timeline, "MAX_CHECKPOINTS", 3)
    short = render(local_store, tid)
    assert f"the newest 3 of its {len(local_store.history(tid))} checkpoints" in short
    assert len(_data(short)["checkpoints"]) == 3


def test_the_cli_writes_the_page(store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pk.connect(store_url) as store:
        tid = uid("timeline")
        build_thread(store, tid)
    out = tmp_path / "thread.html"
    assert main(["timeline", tid, "-o", str(out), "--url", store_url]) == 0
    assert "wrote" in capsys.readouterr().out
    page = out.read_text()
    assert ("charge", "failed") in _bars(page)
    # the form, the store URL first
    assert main(["timeline", store_url, tid, "-o", str(tmp_path / "again.html"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes"] == (tmp_path / "again.html").stat().st_size
    assert main(["timeline", tid + "-missing", "--url", store_url, "-o", str(tmp_path / "x.html")]) == 3
    assert not (tmp_path / "x.html").exists()
    with pytest.raises(SystemExit) as usage:
        main(["timeline", "a", "b", "--url", store_url])
    assert usage.value.code == 2


def test_fork_links_of_long_threads_and_the_bounds_of_the_fork_scan(
    local_store: pk.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = uid("timeline")
    with pk.resume(src, store=local_store) as run:
        run.state["n"] = 0
    fork = local_store.fork(src, new_thread_id=src + "-fork").thread_id
    for i in range(4):  # the fork's first record is now older than the newest few
        local_store.update_state(fork, {"n": i + 1})
    with pk.resume(uid("timeline-other"), store=local_store) as run:  # a thread made later, not a fork
        run.state["x"] = 1
    monkeypatch.setattr(_timeline, "MAX_CHECKPOINTS", 2)
    fork_page = render(local_store, fork)
    assert "the newest 2 of its 5 checkpoints" in fork_page
    assert 'id="forked-from"' in fork_page and f'href="{src}.html"' in fork_page  # read from its first record
    assert f'href="{fork}.html"' in render(local_store, src)
    monkeypatch.setattr(_timeline, "FORK_ROWS", 0)  # no rows to read: the scan stops at the first thread to read
    bounded = model(local_store, src)
    assert bounded["forks_limited"] and bounded["forks"] == []
    assert "Forks of this thread were looked for in" in render(local_store, src)
    monkeypatch.setattr(_timeline, "FORK_ROWS", 20_000)
    monkeypatch.setattr(_timeline, "FORK_SCAN", 1)
    assert model(local_store, src)["forks_limited"]


def crashed_thread(url: str, tmp_path: Path, tid: str) -> tuple[str, str]:
    """The quickstart's crash: a 20-step run SIGKILLed inside step 14 (position 13), resumed
    by a second process. Returns the two processes' ``host:pid``."""
    import socket

    from test_resume_mark import crash_and_resume

    dead, resumer = crash_and_resume(url, tmp_path, tid, 13)
    host = socket.gethostname()
    return f"{host}:{dead}", f"{host}:{resumer}"


def test_a_sigkilled_and_resumed_run_shows_the_crash(tmp_path: Path) -> None:
    """The demo thread said "1 attempt" with 20 green bars: the kill and the 13 replayed steps
    were invisible (issue #34 §4). The resume mark splits the run where the process died."""
    url, tid = f"sqlite:///{tmp_path}/crash.db", uid("timeline-crash")
    dead, resumer = crashed_thread(url, tmp_path, tid)
    with pk.connect(url) as store:
        m = model(store, tid)
        page = render(store, tid)
    [run] = m["runs"]
    assert run["status"] == "completed" and len(run["attempts"]) == 2
    first, second = run["attempts"]
    assert first["ended"] == "process died" and first["resumed"] is None
    assert [b["status"] for b in first["bars"]] == ["ran"] * 13
    words = f"process {dead} died after step 13 (work at 12) · resumed in {resumer}, 13 replayed"
    assert second["resumed"]["text"] == words
    assert [b["status"] for b in second["bars"]] == ["replayed"] * 13 + ["ran"] * 7 + ["run completed"]
    resumed_step = second["bars"][13]  # timed from the resume, not from the dead process's last step
    assert resumed_step["dur"] == pytest.approx(resumed_step["t"] - second["resumed"]["t"])
    assert html.escape(words) in page and "2 attempts" in page
    assert f"attempt 2 · completed · resumed in {resumer}" in page


@pk.register
def _notify(text: str) -> None:
    """An after-commit effect (registered: a stored record may name it)."""


def test_after_commit_effects_and_a_turn_waiting_behind_another(local_store: pk.Store) -> None:
    import threading
    import time

    tid = uid("timeline-lease")

    @pk.checkpointed(name="reply")
    def reply(text: str) -> str:
        pk.after_commit(_notify, text)
        return text

    with pk.resume(tid, store=local_store, run_id="turn-1"):
        reply("hello")
        waiter = threading.Thread(target=_second_turn, args=(local_store, tid))
        waiter.start()
        deadline = time.monotonic() + 30
        while not local_store.leases(prefix=tid)[0].waiting:  # the second turn queued behind this one
            assert time.monotonic() < deadline, "the second turn never queued"
            waiter.join(0.01)
        m = model(local_store, tid)
        page = render(local_store, tid)
    waiter.join(30)
    lease = m["lease"]
    assert lease["holder"] and len(lease["waiting"]) == 1 and lease["reserved_for"] is None
    assert "1 turn waiting behind it" in page and 'id="lease"' in page
    [bar] = [b for b in bars_of(m) if b["name"] == "reply"]
    assert bar["effects"] == {"n": 1, "done": 1, "names": [f"{__name__}:_notify"]}
    assert "1 after-commit · done" in page
    assert model(local_store, tid)["lease"] is None  # both turns ended: nothing holds or waits


def _second_turn(store: pk.Store, tid: str) -> None:
    with pk.resume(tid, store=store, run_id="turn-2", busy="queue", busy_timeout=60):
        pass
