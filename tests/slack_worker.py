"""The Slack example's command line with two fault points, for tests/test_slack_thread.py.

    python slack_worker.py ARGS...      # the arguments of examples/slack_thread.py

The example stays free of test hooks: this wrapper patches its fake shop and fake Slack
client. With ``SLACK_GATE=DIR``, each point named in ``SLACK_STOP`` (comma separated)
stops the FIRST process that reaches it, across processes: it creates ``DIR/<point>``
(atomically, once) holding the event id and its pid, then waits to be SIGKILLed.

* ``mid``: inside the order lookup tool — a step in flight, the model step before it
  committed (a worker killed mid-turn).
* ``post``: inside the fake Slack client, before it records the post — the reply step
  committed, the post not made (a worker killed between the commit and the post).

With ``SLACK_DOWN=1`` every post fails (``ConnectionError``), without retry waits.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import persistkit as pk
from examples import slack_thread as example


def stop(point: str, event_id: str) -> None:
    gate = os.environ.get("SLACK_GATE")
    if not gate or point not in os.environ.get("SLACK_STOP", "").split(","):
        return
    mine = os.path.join(gate, f"{point}.{os.getpid()}")
    with open(mine, "w") as f:
        json.dump({"event": event_id, "pid": os.getpid()}, f)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(mine, os.path.join(gate, point))  # the first process to get here stops, once
    except FileExistsError:
        return
    while True:  # the test kills this process here
        time.sleep(1)


_lookup = example.Shop.lookup
_post = example.FakeSlack.chat_postMessage


def lookup(order_id: str) -> dict[str, Any] | None:
    run = pk.current_run()
    assert run is not None
    stop("mid", run.run_id)
    return _lookup(order_id)


def post(self: example.FakeSlack, **kw: Any) -> dict[str, Any]:
    stop("post", kw["metadata"]["event_payload"]["event_id"])
    if os.environ.get("SLACK_DOWN"):
        raise ConnectionError("slack is down (SLACK_DOWN)")
    return _post(self, **kw)


example.Shop.lookup = staticmethod(lookup)  # type: ignore[method-assign]
example.FakeSlack.chat_postMessage = post  # type: ignore[method-assign]

if __name__ == "__main__":
    if os.environ.get("SLACK_DOWN"):
        pk.set_testing(True)  # the effect's retries without their backoff waits
    sys.exit(example.main(sys.argv[1:]))
