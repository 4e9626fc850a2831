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
from test_timeline import SECRET, XSS, build_thread, crashed_thread

import persistkit as pk
from persistkit.ops._timeline import render

_WAIT = 60.0  # seconds any one browser answer may take on a loaded machine
_WIDTH = 1440  # the viewport's width in CSS pixels: a laptop's browser window (issue #34 §4)


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
            msg: dict[str, Any] = json.loads(self.ws.recv(timeout=_WAIT))
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
            "--no-default-browser-check", f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={_WIDTH},900"]
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


# Each element matching a selector, scrolled to the middle of the window vertically only
# (scrollIntoView would scroll a sideways-scrolling row too, and hide what a person sees):
# is it inside the viewport's width, and is it what is seen at its middle (not clipped by a
# scrolling row, not covered)? Returns what is not, as [text, left, right, viewport width],
# and the elements of the lanes that scroll sideways.
_OUTSIDE = """(sel) => { const out = [];
    for (const e of document.querySelectorAll(sel)) {
        const box = e.getBoundingClientRect();
        window.scrollTo(0, window.scrollY + box.top + box.height / 2 - innerHeight / 2);
        const r = e.getBoundingClientRect(), w = document.documentElement.clientWidth;
        const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
        if (r.left < 0 || r.right > w || !(hit && (hit === e || e.contains(hit))))
            out.push([e.innerText.slice(0, 40), Math.round(r.left), Math.round(r.right), w]);
    }
    const sideways = [...document.querySelectorAll("#lanes, #lanes *")].filter(x =>
        ["auto", "scroll"].includes(getComputedStyle(x).overflowX) && x.scrollWidth > x.clientWidth + 1
    ).map(x => x.className);
    return {outside: out, sideways: sideways, wide: document.documentElement.scrollWidth > innerWidth}; }"""


def _open(browser: Page, page: Path) -> None:
    browser.send("Page.enable")
    browser.send("Runtime.enable")
    browser.send("Emulation.setDeviceMetricsOverride", width=_WIDTH, height=900, deviceScaleFactor=1, mobile=False)
    browser.send("Page.navigate", url=page.as_uri())
    browser.wait_for("Page.loadEventFired")
    assert browser.js("window.innerWidth") == _WIDTH


def _all_visible(browser: Page, selector: str) -> None:
    seen = browser.js(f"({_OUTSIDE})({json.dumps(selector)})")
    assert seen == {"outside": [], "sideways": [], "wide": False}, seen


def test_the_page_in_a_browser(browser: Page, tmp_path: Path) -> None:
    tid = "timeline-browser"
    with pk.connect(f"sqlite:///{tmp_path}/store.db") as store:
        build_thread(store, tid)
        page = tmp_path / f"{tid}.html"
        page.write_text(render(store, tid))

    _open(browser, page)
    _all_visible(browser, ".bar")  # every step of every run inside the window, nothing scrolls sideways

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


def test_a_sigkilled_and_resumed_run_fits_the_window(browser: Page, tmp_path: Path) -> None:
    """The quickstart's crash (SIGKILL inside step 14 of 20, resumed by another process): at
    1,440 px a row showed 8 of its 21 bars, the rest behind a scrollbar, and nothing said the
    process died (issue #34 §4). Now the run's 34 bars (13 ran; 13 replayed, 7 ran and the
    end) and the line saying where it died and who resumed it are all in the window."""
    url, tid = f"sqlite:///{tmp_path}/crash.db", "timeline-crash"
    dead, resumer = crashed_thread(url, tmp_path, tid)
    with pk.connect(url) as store:
        page = tmp_path / f"{tid}.html"
        page.write_text(render(store, tid))

    _open(browser, page)
    statuses = browser.js('[...document.querySelectorAll(".bar")].map(b => b.dataset.status)')
    assert statuses == ["ran"] * 13 + ["replayed"] * 13 + ["ran"] * 7 + ["run completed"]
    _all_visible(browser, ".bar")
    _all_visible(browser, ".resume")
    note = browser.js('document.querySelector(".resume").innerText')
    assert f"process {dead} died after step 13 (work at 12) · resumed in {resumer}, 13 replayed" in note
    labels = browser.js('[...document.querySelectorAll(".attempt .label")].map(e => e.innerText)')
    assert labels[0].startswith("attempt 1 · process died") and f"attempt 2 · completed · resumed in {resumer}" in labels[1]
    assert "2 attempts" in browser.js('document.querySelector(".run h2").innerText')
    # the resumed step is clicked like any other: its details say it ran
    resumed_step = browser.js('document.querySelectorAll(".bar")[26].dataset.c')
    browser.click(f'.bar[data-c="{resumed_step}"]')
    assert "work · 13 · ran" in browser.js("document.getElementById('details').innerText")
    assert not [e for e in browser.events if e.get("method") == "Runtime.exceptionThrown"]
    shot = tmp_path / "crash.png"
    shot.write_bytes(base64.b64decode(browser.send("Page.captureScreenshot", format="png")["data"]))
    if os.environ.get("PERSISTKIT_KEEP_SCREENSHOT"):
        Path(os.environ["PERSISTKIT_KEEP_SCREENSHOT"]).with_suffix(".crash.png").write_bytes(shot.read_bytes())
