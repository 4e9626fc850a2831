"""examples/sse_chat.py over real HTTP: a client that disconnects mid-answer and reconnects with
Last-Event-ID, while the worker writing the answer is SIGKILLed and a new one continues the turn.
The client ends with exactly the answer an uncrashed worker writes, having seen one rewind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_timeline_browser
from test_timeline_browser import Page

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

#: headless Chromium over the DevTools protocol (the timeline page's test drives it so too)
browser = test_timeline_browser.browser

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sse_chat.py"
sys.path.insert(0, str(EXAMPLE.parent))
import sse_chat  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _events(base: str, thread: str, last: str | None, stop: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """Read the SSE stream (from ``last``) until ``stop(events)``; then drop the connection."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    headers = {"Last-Event-ID": last} if last else {}
    with httpx.stream("GET", f"{base}/stream/{thread}", headers=headers, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        ev: dict[str, str] = {}
        for line in r.iter_lines():
            if line:
                key, _, value = line.partition(": ")
                ev[key] = value
                continue
            if "id" in ev:
                out.append((ev["id"], ev["event"], json.loads(ev["data"])))
                if stop(out):
                    return out
            ev = {}
    return out


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[str, str, list[subprocess.Popen[bytes]]]]:
    """The example's web app on a free port over a SQLite store: (store URL, base URL, processes to end)."""
    url = f"sqlite:///{tmp_path}/chat.db"
    port = _free_port()
    server = subprocess.Popen([sys.executable, str(EXAMPLE), "serve", url, str(port)])
    procs: list[subprocess.Popen[bytes]] = [server]
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "the app did not start"
                time.sleep(0.1)
        yield url, f"http://127.0.0.1:{port}", procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _worker(procs: list[subprocess.Popen[bytes]], url: str, thread: str, delay: float) -> subprocess.Popen[bytes]:
    """A worker process running one turn of ``thread`` (what a job queue would start)."""
    procs.append(subprocess.Popen([sys.executable, str(EXAMPLE), "worker", url, thread, "why?", str(delay)]))
    return procs[-1]


def test_a_client_reconnects_while_the_worker_is_killed_and_sees_the_uncrashed_answer(
    app: tuple[str, str, list[subprocess.Popen[bytes]]],
) -> None:
    url, base, procs = app
    thread = "chat-1"
    killed = _worker(procs, url, thread, 0.2)
    first = _events(base, thread, None, lambda evs: sum(e[1] == "event" for e in evs) >= 4)
    os.kill(killed.pid, signal.SIGKILL)  # mid-answer: its tokens are out, its step never commits
    killed.wait()
    second = _worker(procs, url, thread, 0.01)
    rest = _events(base, thread, first[-1][0], lambda evs: evs[-1][1] == "end")
    assert second.wait(60) == 0
    ids = [int(e[0]) for e in first + rest]
    assert ids == sorted(set(ids)), "an event came twice, or out of order"
    shown: list[tuple[int, str]] = []
    for off, kind, data in first + rest:
        if kind == "event":
            shown.append((int(off), data["data"]["token"]))
        elif kind == "rewind":
            shown = [s for s in shown if s[0] <= data["to"]]
    assert "".join(t for _, t in shown) == "".join(sse_chat.tokens("why?"))
    assert [e[1] for e in rest].count("rewind") == 1
    assert rest[-1][1] == "end" and rest[-1][2]["data"] == "completed"


def test_the_page_in_chromium_shows_the_uncrashed_answer_after_a_kill(
    app: tuple[str, str, list[subprocess.Popen[bytes]]], browser: Page,
) -> None:
    """The example's own page, its EventSource live while the worker is SIGKILLed mid-answer."""
    url, base, procs = app
    thread = "chat-2"
    browser.send("Page.enable")
    browser.send("Runtime.enable")
    browser.send("Page.navigate", url=f"{base}/?thread={thread}")
    browser.wait_for("Page.loadEventFired")
    killed = _worker(procs, url, thread, 0.2)
    deadline = time.monotonic() + 60
    while len(browser.js("document.getElementById('answer').textContent").split()) < 4:
        assert time.monotonic() < deadline, "the page shows no tokens"
        time.sleep(0.05)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    second = _worker(procs, url, thread, 0.01)
    while browser.js("document.title") != "done":
        assert time.monotonic() < deadline, "the page never saw the end"
        time.sleep(0.05)
    assert second.wait(60) == 0
    assert browser.js("document.getElementById('answer').textContent") == "".join(sse_chat.tokens("why?"))
    log = browser.js("document.getElementById('log').textContent")
    assert log.count("rewind to") == 1 and "end completed" in log, log
