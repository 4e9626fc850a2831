"""The timeline page as a person sees it: opened in headless Chromium, clicked, looked at.

Chromium is driven over the DevTools protocol (a websocket; ``websockets`` is in the
``test`` extra), so the page runs its own script as in a browser window: the test reads
what is rendered (``innerText``, sizes), clicks a step with real mouse events, and takes
a screenshot. Chromium is Debian's ``chromium`` package (``python3 dev.py test`` installs
it); without it the test reports the service ``chromium`` unavailable (see conftest).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_timeline import SECRET, XSS, build_thread

import persistkit as pk
from persistkit.ops._timeline import render

_WAIT = 60.0  # seconds any one browser answer may take on a loaded machine


class Page:
    """One Chromium tab over the DevTools protocol: commands, and the events seen so far."""

    def __init__(self, ws_url: str) -> None:
        from websockets.sync.client import connect

        self.ws = connect(ws_url, max_size=None, open_timeout=_WAIT)
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=_WAIT))
            if msg.get("id") == i:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result
            self.events.append(msg)

    def wait_for(self, event: str) -> dict[str, Any]:
        for seen in self.events:
            if seen.get("method") == event:
                self.events.remove(seen)
                return seen
        while True:
            msg = json.loads(self.ws.recv(timeout=_WAIT))
            if msg.get("method") == event:
                return msg
            self.events.append(msg)

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able)."""
        out = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in out:
            raise AssertionError(f"{expression}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def click(self, selector: str) -> None:
        """A left click at the middle of the element, as a mouse makes it."""
        box = self.js(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            e.scrollIntoView({{block: "center"}}); const r = e.getBoundingClientRect();
            return {{x: r.left + r.width / 2, y: r.top + r.height / 2}}; }})()""")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=box["x"], y=box["y"], button="left", clickCount=1)

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def browser(chromium: str, tmp_path: Path) -> Iterator[Page]:
    args = [chromium, "--headless", "--disable-gpu", "--remote-debugging-port=0", "--no-first-run",
            "--no-default-browser-check", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,900"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--no-sandbox")  # Chromium's sandbox refuses root (CI containers)
    proc = subprocess.Popen([*args, "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    page = None
    try:
        page = Page(_endpoint(proc))
        yield page
    finally:
        if page is not None:
            page.close()
        proc.terminate()
        try:
            proc.wait(timeout=_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _endpoint(proc: subprocess.Popen[str]) -> str:
    """The DevTools websocket of the browser's first tab (Chromium prints its endpoint when ready)."""
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # EOF if it dies first
        lines.append(line)
        found = re.search(r"DevTools listening on ws://[^:/]+:(\d+)/", line)
        if found:
            break
    else:
        proc.wait()
        pytest.fail("chromium exited before it listened:\n" + "".join(lines[-20:]))
    # Keep reading what it prints, so a full pipe never stalls it.
    threading.Thread(target=lambda: [None for _ in proc.stderr or ()], daemon=True).start()
    with urllib.request.urlopen(f"http://127.0.0.1:{found.group(1)}/json/list", timeout=_WAIT) as r:
        targets = json.load(r)
    return str(next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page"))


_VISIBLE = """(e) => { const r = e.getBoundingClientRect(), s = getComputedStyle(e);
    return r.width > 0 && r.height > 0 && s.visibility !== "hidden" && s.display !== "none"; }"""


def test_the_page_in_a_browser(browser: Page, tmp_path: Path) -> None:
    tid = "timeline-browser"
    with pk.connect(f"sqlite:///{tmp_path}/store.db") as store:
        build_thread(store, tid)
        page = tmp_path / f"{tid}.html"
        page.write_text(render(store, tid))

    browser.send("Page.enable")
    browser.send("Runtime.enable")
    browser.send("Page.navigate", url=page.as_uri())
    browser.wait_for("Page.loadEventFired")

    # The steps, each a visible bar with its name and status, lanes in the order they ran.
    bars = browser.js(f"""[...document.querySelectorAll(".bar")].filter({_VISIBLE})
        .map(b => [b.querySelector(".name").innerText, b.dataset.status])""")
    assert [tuple(b) for b in bars] == [
        ("fetch_order", "ran"), ("charge", "failed"), ("end of run", "run failed"),
        ("fetch_order", "replayed"), ("charge", "retried"), ("pk.suspend", "suspended"),
        ("fetch_order", "replayed"), ("charge", "replayed"), ("pk.suspend", "answered"),
        ("end of run", "run completed"), ("summarize", "ran"), ("end of run", "run completed"),
    ]
    # The failed step's error, written on its bar, as text.
    err = browser.js(f"""(() => {{ const e = document.querySelector(".bar.st-failed .err");
        return ({_VISIBLE})(e) ? e.innerText : null; }})()""")
    assert err == "ConnectionError: payment gateway timed out <after 30 s>"

    # Click the question: the panel shows the state at that checkpoint and what changed.
    browser.click('.bar[data-status="suspended"]')
    details = browser.js("document.getElementById('details').innerText")
    assert "pk.suspend" in details and "suspended" in details
    state = browser.js(f"""(() => {{ const s = document.getElementById("state");
        return ({_VISIBLE})(s) ? s.innerText : null; }})()""")
    assert state is not None and "state at this checkpoint" in state.lower()  # (CSS capitalizes headings)
    assert '"fetched A-17",' in state and '"charged"' in state and "charged\n120" in state
    changes = browser.js("document.getElementById('diff').innerText")
    assert "appended 1 item" in changes and "added" in changes
    assert browser.js("location.hash").startswith("#c=")

    # Click the first step: its result holds markup and a secret; shown as text, never run.
    browser.click('.bar[data-status="ran"]')
    result = browser.js("document.querySelector('#details pre.result').innerText")
    assert json.dumps(XSS) in result and "$CRED{payments}" in result
    assert browser.js("window.__pwned === undefined && document.images.length === 0")
    assert SECRET not in browser.js("document.documentElement.outerHTML")
    assert not [e for e in browser.events if e.get("method") == "Runtime.exceptionThrown"]

    shot = tmp_path / "timeline.png"
    shot.write_bytes(base64.b64decode(browser.send("Page.captureScreenshot", format="png")["data"]))
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and shot.stat().st_size > 10_000
    if os.environ.get("PERSISTKIT_KEEP_SCREENSHOT"):  # to look at it: a path to copy it to
        Path(os.environ["PERSISTKIT_KEEP_SCREENSHOT"]).write_bytes(shot.read_bytes())
