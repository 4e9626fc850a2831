#!/usr/bin/env python
"""Make the README's picture of the timeline page: docs/img/timeline.png.

Builds a demo thread on a temporary SQLite store (a support agent whose search step
times out once, so its run is retried; it then asks for approval, is answered, and
finishes; a second run follows up; the thread is forked), writes its page with
``persistkit timeline``, and has headless Chromium photograph it with the question's
step selected (the page opens the step named in its ``#c=<checkpoint id>`` link).

    PYTHONPATH=. python scripts/timeline_screenshot.py [--out docs/img/timeline.png]

Needs ``chromium`` on PATH (``python3 dev.py test`` installs it as root on Debian/Ubuntu).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import persistkit as pk  # noqa: E402 -- the checkout's, from the path set above
from persistkit._cli import main as cli  # noqa: E402

THREAD = "ticket-4711"


def build(store: pk.Store) -> str:
    """The demo thread; returns the checkpoint id of its question (the step shown selected)."""
    flaky = {"timeouts": 1}

    @pk.checkpointed(name="classify_ticket")
    def classify_ticket(text: str) -> dict[str, Any]:
        time.sleep(0.35)  # an LLM call, say: the bars' widths are real durations
        return {"intent": "refund", "order": "A-1093", "confidence": 0.93}

    @pk.checkpointed(name="search_orders")
    def search_orders(order: str) -> dict[str, Any]:
        time.sleep(0.5)
        if flaky["timeouts"]:
            flaky["timeouts"] -= 1
            raise TimeoutError("orders API did not answer within 30 s")
        return {"order": order, "amount": 129.0, "paid_with": "card", "api_key": pk.Secret("sk-live-demo", name="orders-api")}

    @pk.checkpointed(name="draft_reply")
    def draft_reply(order: dict[str, Any]) -> str:
        time.sleep(0.8)
        return f"We are sorry: order {order['order']} will be refunded ({order['amount']:.2f} EUR)."

    @pk.checkpointed(name="send_reply")
    def send_reply(text: str) -> str:
        time.sleep(0.25)
        return "msg-88213"

    def turn(run_id: str | None = None) -> pk.Run:
        with pk.resume(THREAD, store=store, run_id=run_id) as run:
            s = run.state
            s.setdefault("messages", []).append({"role": "user", "text": "My parcel never came, I want my money back"})
            ticket = classify_ticket(s["messages"][0]["text"])
            s["intent"] = ticket["intent"]
            order = search_orders(ticket["order"])
            reply = draft_reply(order)
            s["messages"].append({"role": "assistant", "text": reply, "draft": True})
            s["approved"] = pk.suspend({"refund": order["amount"], "order": order["order"]})
            s["sent"] = send_reply(reply)
        return run

    with contextlib.suppress(TimeoutError):  # the first attempt fails at the search
        turn()
    run_id = store.history(THREAD, limit=1)[0].run_id
    turn(run_id)  # the retry: classify replays, the search runs again, then the question
    question = store.history(THREAD, limit=1)[0].checkpoint_id
    store.answer(THREAD, True)
    turn()
    with pk.resume(THREAD, store=store) as run:
        run.state["messages"].append({"role": "user", "text": "Thanks!"})
        classify_ticket("Thanks!")
    store.fork(THREAD, new_thread_id=THREAD + "-what-if-declined", update={"approved": False})
    return question


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "img" / "timeline.png"), help="where to write the PNG")
    ap.add_argument("--size", default="1400,860", help="the browser window, width,height")
    args = ap.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("chromium is not on PATH: apt-get install chromium", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/demo.db"
        with pk.connect(url) as store:
            question = build(store)
        page = Path(tmp) / f"{THREAD}.html"
        if cli(["timeline", THREAD, "--url", url, "-o", str(page)]):
            return 1
        out = Path(args.out).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [browser, "--headless", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp}/profile",
               f"--window-size={args.size}", f"--screenshot={out}", page.as_uri() + f"#c={question}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.insert(1, "--no-sandbox")  # Chromium's sandbox refuses root
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode or not out.exists():
            print(done.stderr, file=sys.stderr)
            return 1
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
