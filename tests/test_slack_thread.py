"""The Slack-thread example (examples/slack_thread.py) in real processes (issue #21).

Every worker is its own process: ``tests/slack_worker.py``, the example's command line
with two fault points (a worker stops there and the test SIGKILLs it). Two events of one
thread are sent at the same moment; the one that takes the thread first (either: the
test follows whichever did) is killed mid-turn while the other waits behind it, and
continued by its redelivery; a worker is killed once between a reply's commit and its
post; a refund is approved from another process. The fake Slack client records every
call it gets, so the checks see duplicates: one post per event, in the order the turns
ran, none twice, nothing lost — and one refund. Waits are on files, leases and exit
codes, never on time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_url

import persistkit as pk

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKER = HERE / "slack_worker.py"
DEADLINE = 60.0  # seconds any one wait may take before the test fails (a hang, not a timing)
CHANNEL = "C0SUPPORT"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REFUND, STATUS = "Please refund $80 on order #1042, it arrived broken.", "And where is order #1043?"
REPLIES = {"refund": "Done: $80.00 refunded on order #1042.",
           "status": "Order #1043 (milk frother): shipped, arriving Nov 28."}


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url(request.param, request, tmp_path_factory, isolated=True)


def until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + DEADLINE
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return found


class Slack:
    """One thread of the example's world: event files, worker processes, what they did."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp = url, tmp
        self.fake, self.gate = tmp / "fake", tmp / "gate"
        self.fake.mkdir()
        self.gate.mkdir()
        self.ts = f"{time.time():.6f}"
        self.thread = f"slack:{CHANNEL}:{self.ts}"
        self.tag = uuid.uuid4().hex[:8]
        self.procs: list[subprocess.Popen[str]] = []

    def event(self, kind: str) -> str:
        """Write the envelope of the thread's refund or status event; returns its event id."""
        event_id = f"Ev{kind.upper()}{self.tag}"
        ts = self.ts if kind == "refund" else f"{float(self.ts) + 1:.6f}"
        envelope = {"type": "event_callback", "team_id": "T0TEST", "event_id": event_id, "token": "verification",
                    "event": {"type": "message", "channel": CHANNEL, "user": "U0CUSTOMER", "ts": ts,
                              "thread_ts": self.ts, "text": REFUND if kind == "refund" else STATUS}}
        (self.tmp / f"{event_id}.json").write_text(json.dumps(envelope))
        return event_id

    def run(self, *args: str, stop: str = "", **more: str) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "SLACK_FAKE_DIR": str(self.fake), "SLACK_GATE": str(self.gate), "SLACK_STOP": stop, **more}
        env.pop("PERSISTKIT_URL", None)
        out = open(self.tmp / f"out-{len(self.procs)}", "w+")  # noqa: SIM115  (read back by done())
        p = subprocess.Popen([sys.executable, str(WORKER), "--url", self.url, *args],
                             env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        p.out = out  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def handle(self, event_id: str, stop: str = "", **more: str) -> subprocess.Popen[str]:
        return self.run("handle", str(self.tmp / f"{event_id}.json"), stop=stop, **more)

    def answer(self, decision: str, stop: str = "") -> subprocess.Popen[str]:
        return self.run("answer", self.ts, decision, "--channel", CHANNEL, stop=stop)

    def done(self, p: subprocess.Popen[str], exit_code: int = 0) -> dict[str, Any]:
        """Wait for a worker to exit (0 unless said); its printed outcome."""
        code = p.wait(DEADLINE)
        p.out.seek(0)  # type: ignore[attr-defined]
        text = p.out.read()  # type: ignore[attr-defined]
        assert code == exit_code, text
        result: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
        return result

    def stopped(self, point: str) -> str:
        """Wait until a worker stopped at ``point``; the event id it was on."""
        marker = self.gate / point
        until(lambda: marker.exists(), f"a worker stopped at {point!r}")
        event: str = json.loads(marker.read_text())["event"]
        return event

    def kill(self, p: subprocess.Popen[str]) -> None:
        p.send_signal(signal.SIGKILL)
        assert p.wait(DEADLINE) == -signal.SIGKILL

    def lease(self) -> pk.LeaseInfo | None:
        with pk.connect(self.url) as store:
            found = [i for i in store.leases(prefix=self.thread) if i.thread_id == self.thread]
        return found[0] if found else None

    def head(self) -> tuple[str | None, str | None]:
        """The run and step of the thread's newest checkpoint."""
        with pk.connect(self.url) as store:
            [cp] = store.history(self.thread, limit=1)
        return cp.run_id, cp.step

    def pending(self) -> list[Any]:
        with pk.connect(self.url) as store:
            return [q for q in store.pending() if q.thread_id == self.thread]

    def posts(self) -> list[dict[str, Any]]:
        path = self.fake / "posts.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def refunds(self) -> list[dict[str, Any]]:
        path = self.fake / "refunds.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def model_calls(self) -> int:
        path = self.fake / "model.jsonl"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def messages(self) -> list[dict[str, Any]]:
        with pk.connect(self.url) as store:
            return list(store.get_state(self.thread)["messages"])

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(DEADLINE)
            p.out.close()  # type: ignore[attr-defined]


@pytest.fixture
def slack(url: str, tmp_path: Path) -> Iterator[Slack]:
    world = Slack(url, tmp_path)
    yield world
    world.close()


def test_two_events_a_redelivery_two_kills_and_an_approval(slack: Slack) -> None:
    refund, status = slack.event("refund"), slack.event("status")
    kind = {refund: "refund", status: "status"}
    # both events at the same moment; every worker stops at each point if it is the first there
    workers = {refund: slack.handle(refund, stop="mid,post"), status: slack.handle(status, stop="mid,post")}
    first = slack.stopped("mid")  # the turn that took the thread, stopped in its lookup tool
    second = status if first == refund else refund
    until(lambda: (i := slack.lease()) is not None and len(i.waiting) == 1, "the other event queued behind it")
    assert slack.head() == (first, "think")  # the model step committed, the lookup tool in flight
    slack.kill(workers[first])
    until(lambda: (i := slack.lease()) is not None and i.reserved_for == first, "the thread reserved for the crashed turn")
    assert workers[second].poll() is None and slack.posts() == []

    redelivered = slack.handle(first, stop="post")  # Slack retries the event whose worker died
    if first == refund:
        # the crashed turn goes on from its committed steps and asks a person; the status event still waits
        assert slack.done(redelivered) == {"status": "suspended"}
        [asked] = until(slack.pending, "the open question")
        assert asked.run_id == refund and "1042" in json.dumps(asked.payload)
        assert workers[status].poll() is None and slack.posts() == [] and slack.refunds() == []
        approver = slack.answer("yes", stop="post")  # from another process; killed before the post
        assert slack.stopped("post") == refund
        assert slack.head() == (refund, "reply")  # the reply's checkpoint is durable, its post not made
        slack.kill(approver)
        assert slack.posts() == [] and len(slack.refunds()) == 1
        assert slack.done(slack.answer("yes")) == {"status": "completed"}  # the approver's retry posts it
        assert slack.done(workers[status]) == {"status": "completed"}
    else:
        # the status turn finishes its reply and is killed before the post; its next delivery posts it
        assert slack.stopped("post") == status
        assert slack.head() == (status, "reply")
        slack.kill(redelivered)
        assert slack.posts() == []
        assert slack.done(slack.handle(status)) == {"status": "completed"}
        assert slack.done(workers[refund]) == {"status": "suspended"}
        [asked] = until(slack.pending, "the open question")
        assert asked.run_id == refund and slack.refunds() == []
        assert slack.done(slack.answer("yes")) == {"status": "completed"}
    assert slack.pending() == []

    # finished events redelivered: replayed, nothing posted, nothing refunded again
    assert slack.done(slack.handle(refund)) == {"status": "completed"}
    assert slack.done(slack.handle(status)) == {"status": "completed"}

    posts = slack.posts()
    assert [p["metadata"]["event_payload"]["event_id"] for p in posts] == [first, second], posts
    assert [p["text"] for p in posts] == [REPLIES[kind[first]], REPLIES[kind[second]]]
    assert all(p["channel"] == CHANNEL and p["thread_ts"] == slack.ts for p in posts)
    assert len({p["metadata"]["event_payload"]["key"] for p in posts}) == 2
    [made] = slack.refunds()
    assert (made["order_id"], made["amount"]) == ("1042", 80.0)
    assert slack.model_calls() == 5  # 3 for the refund turn, 2 for the status turn: none twice
    # each turn's messages together, in the order the turns ran
    turns = [m.get("event_id") for m in slack.messages() if m["role"] == "user"]
    assert turns == [first, second]
    roles = [m["role"] for m in slack.messages()]
    assert roles.count("assistant") == 2 and roles[-1] == "assistant"
    assert roles.index("assistant") == roles.index("user", 1) - 1


def test_a_post_a_dead_worker_left_is_made_by_drain_once(slack: Slack) -> None:
    status = slack.event("status")
    worker = slack.handle(status, stop="post")
    assert slack.stopped("post") == status
    assert slack.head() == (status, "reply")
    slack.kill(worker)
    assert slack.posts() == []
    assert slack.done(slack.run("drain"))["posted"] == 1
    assert [p["text"] for p in slack.posts()] == [REPLIES["status"]]
    assert slack.done(slack.handle(status)) == {"status": "completed"}  # the redelivery ends the turn
    assert slack.done(slack.run("drain"))["posted"] == 0
    assert len(slack.posts()) == 1


def test_a_post_that_keeps_failing_stays_pending_and_goes_out_once(slack: Slack) -> None:
    status = slack.event("status")
    failed = slack.done(slack.handle(status, SLACK_DOWN="1"), exit_code=4)  # every attempt refused
    assert failed["status"] == "post pending" and slack.posts() == []
    assert slack.head() == (status, "reply")  # a RetryableError: no end record, the run stays unfinished
    assert slack.done(slack.handle(status)) == {"status": "completed"}  # the event's retry posts it
    assert [p["metadata"]["event_payload"]["key"] for p in slack.posts()] == [failed["key"]]
    assert slack.done(slack.run("drain"))["posted"] == 0
    assert slack.done(slack.handle(status)) == {"status": "completed"}
    assert len(slack.posts()) == 1 and slack.model_calls() == 2


def test_a_declined_refund_is_not_made(slack: Slack) -> None:
    refund = slack.event("refund")
    assert slack.done(slack.handle(refund)) == {"status": "suspended"}
    assert slack.done(slack.handle(refund)) == {"status": "suspended"}  # a redelivery asks nothing twice
    assert len(slack.pending()) == 1 and slack.model_calls() == 2
    assert slack.done(slack.answer("no")) == {"status": "completed"}
    assert slack.refunds() == [] and slack.model_calls() == 3
    assert [p["text"] for p in slack.posts()] == ["Sorry, the refund of $80.00 on order #1042 was not approved."]


def test_the_demo_runs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PERSISTKIT_URL", "SLACK_FAKE_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "slack_thread.py")], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[Ev01REFUND] Done: $80.00 refunded on order #1042." in out.stdout
    assert "[Ev02STATUS] Order #1043" in out.stdout


def test_the_chaos_run_proves_each_post_once_in_order(tmp_path: Path) -> None:
    """``slack_thread.py --chaos``: its own faults in its own processes (no patch from here)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PERSISTKIT_URL", "SLACK_FAKE_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "slack_thread.py"), "--chaos"], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    steps, rest = out.stdout.split("\nPosts the fake Slack client received in the thread", 1)
    posts, proof = rest.split("\nProof:\n", 1)
    assert steps.count("SIGKILL the worker") == 1 and "SIGKILL Ev0" in steps  # mid-turn, then before the post
    assert "exit 4, post pending" in steps and '{"posted": 1,' in steps
    assert "Ev01ORDER: completed, Ev02ORDER: completed, Ev03REFUND: completed" in steps
    made = [line.strip() for line in posts.splitlines()[1:] if line.strip()]
    assert sorted(made[:2]) == ["[Ev01ORDER] Order #1042 (espresso machine): delivered on Nov 20.",
                                "[Ev02ORDER] Order #1043 (milk frother): shipped, arriving Nov 28."]
    assert made[2:] == ["[Ev03REFUND] Sorry, the refund of $80.00 on order #1042 was not approved."]
    lines = proof.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == ["ok"] * 5, proof
    assert lines[-1] == "chaos: every reply posted once, in order"


def test_the_chaos_proof_fails_on_a_post_made_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The proof the chaos run prints can fail: a reply posted twice is caught (exit 1)."""
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setenv("SLACK_FAKE_DIR", str(tmp_path))
    from examples import slack_thread as example

    store, ts = pk.connect("memory://"), "1700000000.000100"
    thread = example.thread_of(CHANNEL, ts)
    for i, (event_id, (text, answer)) in enumerate(example.CHAOS_EVENTS.items()):
        with pk.resume(thread, run_id=event_id, store=store, state=example.Conversation):
            example.receive(example.envelope_for(CHANNEL, ts, f"{float(ts) + i:.6f}", event_id, text))
        for _ in range(2 if event_id == "Ev02ORDER" else 1):  # the same reply, with the same key, twice
            example.post_reply(CHANNEL, ts, answer, event_id, idempotency_key=f"key-{event_id}")
    with (tmp_path / "model.jsonl").open("w") as f:
        f.write("{}\n" * 7)
    world = example.Chaos(None, store, CHANNEL, ts)
    assert example._chaos_proof(world, list(example.CHAOS_EVENTS)) == 1
    printed = capsys.readouterr().out
    assert "FAIL each event posted once: 4 posts for 3 events, 3 idempotency keys" in printed
    assert "FAIL posted in the order the turns ran: Ev01ORDER -> Ev02ORDER -> Ev02ORDER" in printed
    assert printed.rstrip().endswith("chaos: FAILED")
