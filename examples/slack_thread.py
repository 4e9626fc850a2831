"""A Slack support bot whose turns survive crashes, wait for a person, and post each reply once.

    pip install persistkit                                    # no extra: SQLite, a fake Slack
    python examples/slack_thread.py                           # the demo: prints what happens
    python examples/slack_thread.py --chaos                   # the faults, in real processes, and the proof
    python examples/slack_thread.py handle event.json         # handle one Events API envelope (- : stdin)
    python examples/slack_thread.py handle fix.json --busy interrupt   # a correction: stop the turn in flight
    python examples/slack_thread.py handle event.json --busy debounce   # messages typed in a burst: one turn
    python examples/slack_thread.py pending                   # refunds waiting for a person
    python examples/slack_thread.py answer THREAD_TS yes      # approve (or no) and finish the turn
    python examples/slack_thread.py drain                     # post replies a dead worker left behind

Every command takes ``--url`` (default ``$PERSISTKIT_URL``, else SQLite under
``./.persistkit/``) and ``--fake-dir`` (default ``$SLACK_FAKE_DIR``, else
``./.persistkit/slack``): where the fake Slack client appends every post it receives
(``posts.jsonl``), the fake shop every refund (``refunds.jsonl``) and the fake model
every call (``model.jsonl``). Nothing here talks to the network.

One Slack thread is one persistkit thread (``slack:<channel>:<thread_ts>``); one event
is one turn, ``pk.resume(thread, run_id=<event_id>, busy="queue")``:

* Two events of one thread at once (two workers, two machines) run one after the
  other, in arrival order; a redelivered event (Slack retries when it got no 200 in
  3 s) replays its recorded turn and posts nothing new.
* The agent is a fake model deciding on tool calls, each a ``@pk.checkpointed`` step.
  A worker killed mid-turn is continued by the event's redelivery from its last
  committed step; the thread's next event waits behind it (the crashed turn keeps
  its place).
* A refund needs a person: ``pk.suspend(question)`` stores the question and ends the
  turn (the process may exit). ``answer`` records the decision from any process
  (``store.answer``) and continues the turn there: nothing before the question runs
  again, the refund runs once with its step's idempotency key.
* A correction ("wait, make it $50") handled with ``--busy interrupt`` asks the thread's
  turn in flight to stop at its next step (``pk.resume(busy="interrupt")``): that turn ends
  ``interrupted`` without posting its reply (its finished steps stay in the thread), and
  the correction's turn runs next. A redelivery of the interrupted event is acked.
* Messages typed in a burst ("where is my order?", "it's #1043") handled with ``--busy
  debounce`` become one turn (``pk.resume(busy="debounce", debounce=(window, max_wait),
  message=...)``): the first event's turn waits until the thread was quiet for
  ``--debounce-window`` seconds (at most ``--debounce-max``), then answers every message of
  the burst at once (``run.messages``); the other events' handlers exit at once with
  ``merged`` (their message is in that turn). A message is in exactly one turn, even when a
  worker dies mid-burst.
* The reply is posted with ``run.after_commit(post_reply, ...)``: only once the
  checkpoint that produced it is durable, exactly once across crashes (a worker that
  died between the commit and the post leaves it to the next resume of the turn, or
  to ``drain``), with the effect's idempotency key passed to Slack.

``--chaos`` runs one thread's events through the faults above, each worker its own
process (this script's ``handle``, ``answer`` and ``drain``), each kill a SIGKILL: two
events at the same instant (one takes the thread, the other waits); the first killed
mid-turn, hung in the shop's order lookup; its redelivery killed between the reply's
commit and its post; Slack down for the next redelivery (the post stays pending); a
``drain``; a refund a person declines; every finished event redelivered. It prints each
step, the posts and the proof that each reply was posted once, in the order the turns
ran (exit 0), or says which check failed (exit 1). The faults are the fake
world's own, switched by files in the fake dir: ``slack-down`` (every post fails) and
``stall-lookup`` / ``stall-post`` (the next such call hangs, in the one process that
renames the file to ``stalled-<point>.<pid>``: the one to kill).

Exit codes: 0 done (each command prints one JSON line: ``completed``, ``suspended``,
``merged`` or ``ignored`` for ``handle``); 1 a persistkit error, said in one line; 2 an unreadable
envelope; 3 the thread stayed busy past ``--busy-timeout`` (retry the event later); 4 the
reply is committed but Slack kept refusing its post (it stays pending: retry the event,
or ``drain``).

In production, ``handle`` runs on a job queue (see examples/celery_worker.py): the
HTTP endpoint acks Slack at once and enqueues the envelope, and a turn waiting behind
a run that waits for a person (``ThreadBusyError`` after ``--busy-timeout``) is
retried by the queue.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel

import persistkit as pk

MAX_TOOL_CALLS = 6  # a turn's model calls are bounded: a confused model cannot loop forever
ORDERS = {  # the fake shop's orders
    "1042": {"item": "espresso machine", "total": 120.0, "status": "delivered on Nov 20"},
    "1043": {"item": "milk frother", "total": 35.0, "status": "shipped, arriving Nov 28"},
}


class Approval(BaseModel):
    """A person's decision on a refund: ``store.answer`` refuses anything else (nothing stored)."""

    approved: bool
    by: str


class Conversation(pk.State, version=1):
    channel: str = ""
    thread_ts: str = ""
    messages: Annotated[list[dict[str, Any]], pk.append] = []


# -- the world outside: a fake Slack client and a fake shop, each an append-only file ---------


def fake_dir() -> Path:
    return Path(os.environ.get("SLACK_FAKE_DIR") or Path(".persistkit") / "slack")


def _append(name: str, record: dict[str, Any]) -> None:
    path = fake_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())  # a SIGKILL right after must not lose a post that was made


def _read(name: str) -> list[dict[str, Any]]:
    path = fake_dir() / name
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


# The world's faults, switched by files in the fake dir (so every process sees them; --chaos
# uses them): ``slack-down`` makes every post fail; ``stall-<point>`` makes the next call at
# that point (``lookup``: the shop's order lookup, ``post``: Slack's chat.postMessage) hang,
# as a stuck API call does, in the one process that takes the file (renamed, atomically, to
# ``stalled-<point>.<pid>``): the chaos run kills that process there.
STALL_LIMIT = 120.0  # a hung call nobody killed gives up (TimeoutError), as a client timeout would


def _stall(point: str) -> None:
    work = fake_dir()
    try:
        os.rename(work / f"stall-{point}", work / f"stalled-{point}.{os.getpid()}")
    except FileNotFoundError:
        return  # no stall asked, or another process took it
    gone = threading.Event()
    for _ in range(int(STALL_LIMIT / 0.05)):  # a turn asked to stop (a correction) is not kept waiting
        if pk.cancelled() or gone.wait(0.05):
            return
    raise TimeoutError(f"the fake {point} call hung {STALL_LIMIT:.0f} s and no one killed process {os.getpid()}")


class FakeSlack:
    """Records every ``chat.postMessage`` call it receives, duplicates included (no dedup:
    the test must see a post made twice)."""

    def chat_postMessage(self, *, channel: str, thread_ts: str, text: str,
                         metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        _stall("post")
        if (fake_dir() / "slack-down").exists():
            raise ConnectionError("the fake Slack is down (slack-down is in the fake dir)")
        _append("posts.jsonl", {"channel": channel, "thread_ts": thread_ts, "text": text,
                                "metadata": metadata, "pid": os.getpid()})
        return {"ok": True, "channel": channel}

    @staticmethod
    def posts() -> list[dict[str, Any]]:
        return _read("posts.jsonl")


class Shop:
    @staticmethod
    def lookup(order_id: str) -> dict[str, Any] | None:
        _stall("lookup")
        order = ORDERS.get(order_id)
        return {"order_id": order_id, **order} if order else None

    @staticmethod
    def refund(order_id: str, amount: float, idempotency_key: str) -> dict[str, Any]:
        """A payment API: the key makes a repeated call (a crash before its step committed) one refund."""
        done = [r for r in Shop.refunds() if r["idempotency_key"] == idempotency_key]
        if done:
            return done[0]
        record = {"order_id": order_id, "amount": amount, "idempotency_key": idempotency_key, "pid": os.getpid()}
        _append("refunds.jsonl", record)
        return record

    @staticmethod
    def refunds() -> list[dict[str, Any]]:
        return _read("refunds.jsonl")


slack = FakeSlack()


@pk.register
def post_reply(channel: str, thread_ts: str, text: str, event_id: str, *, idempotency_key: str) -> None:
    """The after-commit effect: post the turn's reply in its thread. Stored by name in the
    reply step's checkpoint and run by whichever process gets there first after it lands;
    persistkit passes ``idempotency_key`` (the same in every process that runs it)."""
    slack.chat_postMessage(
        channel=channel, thread_ts=thread_ts, text=text,
        # Slack message metadata: a real client can look for this key before posting again
        metadata={"event_type": "agent_reply", "event_payload": {"event_id": event_id, "key": idempotency_key}},
    )


# -- the agent: a deterministic fake model and its tools, each call a recorded step -----------


def fake_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Decides the next action from this turn's messages: a tool call or the reply."""
    start = max(i for i, m in enumerate(messages) if m["role"] == "user")
    asked, done = messages[start]["content"], messages[start + 1:]
    results = {m["name"]: m["content"] for m in done if m["role"] == "tool"}
    order = re.search(r"#?(\d{4,})", asked)
    if order is None:
        return {"reply": "Which order is it about? Please give me its number."}
    if "lookup_order" not in results:
        return {"tool": "lookup_order", "args": {"order_id": order.group(1)}}
    found = results["lookup_order"]
    if found is None:
        return {"reply": f"I could not find order #{order.group(1)}."}
    if "refund" not in asked.lower():
        return {"reply": f"Order #{found['order_id']} ({found['item']}): {found['status']}."}
    if "refund" not in results:
        amount = re.search(r"\$(\d+(?:\.\d\d)?)", asked)
        value = min(float(amount.group(1)), found["total"]) if amount else found["total"]
        return {"tool": "refund", "args": {"order_id": found["order_id"], "amount": value}}
    refund = results["refund"]
    if refund.get("declined"):
        return {"reply": f"Sorry, the refund of ${refund['amount']:.2f} on order #{refund['order_id']} was not approved."}
    return {"reply": f"Done: ${refund['amount']:.2f} refunded on order #{refund['order_id']}."}


def _state() -> Conversation:
    run = pk.current_run()
    assert run is not None
    state: Conversation = run.state
    return state


@pk.checkpointed(check_args=False)
def receive(envelope: dict[str, Any] | None) -> dict[str, str]:
    """The turn's input, recorded: a process continuing the turn with no envelope (the
    approver) replays it. Only what the turn needs is stored (not the envelope's token)."""
    if envelope is None:
        raise pk.ConfigurationError("this turn has no recorded event: continue it with the event's envelope")
    event = envelope["event"]
    got = {"event_id": envelope["event_id"], "channel": event["channel"], "user": event.get("user", ""),
           "text": event.get("text", ""), "ts": event["ts"], "thread_ts": event.get("thread_ts") or event["ts"]}
    state = _state()
    state.channel, state.thread_ts = got["channel"], got["thread_ts"]
    state.messages.append({"role": "user", "content": got["text"], "user": got["user"], "event_id": got["event_id"]})
    return got


@pk.checkpointed
def think(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One model call (here a fake one: deterministic and free; each call is logged, as a
    bill would count it)."""
    action = fake_model(messages)
    _append("model.jsonl", {"messages": len(messages), "action": action, "pid": os.getpid()})
    return action


@pk.checkpointed
def call_tool(name: str, args: dict[str, Any], approved: bool | None = None) -> Any:
    if name == "lookup_order":
        result: Any = Shop.lookup(args["order_id"])
    elif not approved:
        result = {**args, "declined": True}
    else:  # the step's key: a refund retried after a crash in flight is made once
        step = pk.current_step()
        assert step is not None
        result = Shop.refund(args["order_id"], args["amount"], step.key)
    _state().messages.append({"role": "tool", "name": name, "content": result})
    return result


@pk.checkpointed
def reply(text: str, event: dict[str, str]) -> None:
    """Record the reply and post it once this step's checkpoint is durable."""
    _state().messages.append({"role": "assistant", "content": text})
    run = pk.current_run()
    assert run is not None
    run.after_commit(post_reply, event["channel"], event["thread_ts"], text, event["event_id"])


def agent(event: dict[str, str]) -> str:
    for _ in range(MAX_TOOL_CALLS):
        action = think(_state().messages)
        if "reply" in action:
            return str(action["reply"])
        approved = None
        if action["tool"] == "refund":  # money leaves: a person decides (for days, if need be)
            args = action["args"]
            decision: Approval = pk.suspend({
                "question": f"Refund ${args['amount']:.2f} on order #{args['order_id']}?",
                "channel": event["channel"], "thread_ts": event["thread_ts"], "event_id": event["event_id"],
                "asked_by": event["user"],
            }, answer_type=Approval)
            approved = decision.approved
        call_tool(action["tool"], action["args"], approved)
    return "Sorry, I could not finish this one; a person will follow up."


# -- the handler: one event, one turn ---------------------------------------------------------


def thread_of(channel: str, thread_ts: str) -> str:
    return f"slack:{channel}:{thread_ts}"


#: ``--busy debounce``: (window, max_wait) seconds, ``pk.resume(debounce=...)``.
DEBOUNCE = (2.0, 10.0)


def slim(envelope: dict[str, Any]) -> dict[str, str]:
    """What a turn keeps of an event (not the envelope's token)."""
    event = envelope["event"]
    return {"event_id": envelope["event_id"], "channel": event["channel"], "user": event.get("user", ""),
            "text": event.get("text", ""), "ts": event["ts"], "thread_ts": event.get("thread_ts") or event["ts"]}


@pk.checkpointed(check_args=False)
def receive_burst(events: list[dict[str, str]], leader: str) -> dict[str, str]:
    """A debounced turn's input (``run.messages``: every event of the burst, in the order
    they were sent), recorded as one user message, so the model answers them together."""
    state = _state()
    first = events[0]
    state.channel, state.thread_ts = first["channel"], first["thread_ts"]
    text = "\n".join(e["text"] for e in events)
    state.messages.append({"role": "user", "content": text, "user": first["user"], "event_id": leader,
                           "burst": [e["event_id"] for e in events]})
    return {**first, "event_id": leader, "text": text}


def turn(store: pk.Store, thread: str, run_id: str, envelope: dict[str, Any] | None,
         busy_timeout: float | None = 300.0, busy: str = "queue",
         debounce: tuple[float, float] = DEBOUNCE) -> str:
    """Run (or continue, or replay) one turn; returns its status: completed, suspended,
    interrupted (a later event of the thread took over with ``busy="interrupt"``), or merged
    (``busy="debounce"``: the event's message is in another turn of the burst)."""
    merging = busy == "debounce"
    extra: dict[str, Any] = {}
    if merging:  # a continued turn (envelope None: an answer) sends no message of its own
        extra = {"debounce": debounce, "message": slim(envelope) if envelope is not None else None}
    try:
        with pk.resume(thread, run_id=run_id, busy=busy, busy_timeout=busy_timeout,
                       store=store, state=Conversation, **extra) as run:
            event = receive_burst(run.messages or [], run_id) if merging else receive(envelope)
            reply(agent(event), event)
    except pk.RunCancelledError as exc:  # stopped at a step boundary: ack the event, post nothing
        return exc.status
    except pk.Debounced:  # the message is in the burst another event's turn answers: ack it
        return "merged"
    return run.status


def handle(store: pk.Store, envelope: dict[str, Any], busy_timeout: float | None = 300.0,
           busy: str = "queue", debounce: tuple[float, float] = DEBOUNCE) -> str:
    """Handle one Events API envelope: ``completed``, ``suspended``, ``interrupted``, ``merged``
    or ``ignored``. ``busy="interrupt"``: a correction, which stops the thread's turn in flight
    and runs next; ``busy="debounce"``: a burst of messages becomes one turn."""
    if envelope.get("type") == "url_verification":
        return "ignored"
    if envelope.get("type") != "event_callback" or not isinstance(envelope.get("event"), dict):
        raise pk.ConfigurationError(f"not a Slack event_callback envelope: {json.dumps(envelope)[:200]}")
    event = envelope["event"]
    if event.get("type") != "message" or event.get("bot_id") or event.get("subtype"):
        return "ignored"  # our own replies (and edits, joins...) come back as events: no turn for them
    missing = [k for k in ("event_id",) if not envelope.get(k)] + [k for k in ("channel", "ts") if not event.get(k)]
    if missing:
        raise pk.ConfigurationError(f"Slack envelope without {', '.join(missing)}: cannot key its turn")
    thread = thread_of(event["channel"], event.get("thread_ts") or event["ts"])
    return turn(store, thread, envelope["event_id"], envelope, busy_timeout, busy, debounce)


def find_thread(store: pk.Store, thread_ts: str, channel: str | None) -> str:
    if channel:
        return thread_of(channel, thread_ts)
    found = [t for t in store.threads(prefix="slack:") if t.endswith(f":{thread_ts}")]
    if not found:
        raise pk.NotFoundError(f"no Slack thread with thread_ts {thread_ts} in this store")
    if len(found) > 1:
        raise pk.ConfigurationError(f"{len(found)} threads have thread_ts {thread_ts} ({', '.join(found)}): "
                                    "say which with --channel")
    return found[0]


def answer(store: pk.Store, thread: str, approved: bool, by: str) -> str:
    """Record a person's decision on the thread's open question, then continue the turn
    here (the same turn code: it replays up to the question, which returns the decision).
    Running it again after a crash only continues the turn."""
    asked = [q for q in store.pending(prefix=thread) if q.thread_id == thread]
    if asked:
        run_id = asked[0].run_id
        try:
            store.answer(thread, {"approved": approved, "by": by}, question=asked[0].question_id)
        except pk.AnswerError as exc:  # answered meanwhile by someone else: continue the turn
            print(f"not recorded: {exc}", file=sys.stderr)
    else:  # answered before, and the process that continued the turn died: continue it
        last = store.history(thread, limit=1)
        if not last or last[0].kind == "end" or last[0].run_id is None:
            raise pk.ConfigurationError(f"thread {thread} has no turn waiting for an answer")
        run_id = last[0].run_id
    merged = any(c.step == "pk.debounce" for c in store.history(thread) if c.run_id == run_id)
    return turn(store, thread, run_id, None, busy="debounce" if merged else "queue")


# -- the command line and the demo ------------------------------------------------------------


def envelope_for(channel: str, thread_ts: str, ts: str, event_id: str, text: str) -> dict[str, Any]:
    return {"type": "event_callback", "team_id": "T0DEMO", "event_id": event_id, "event_time": int(float(ts)),
            "event": {"type": "message", "channel": channel, "user": "U0CUSTOMER", "text": text, "ts": ts,
                      "thread_ts": thread_ts}}


def demo(url: str | None) -> None:
    store = pk.connect(url)
    channel, thread_ts = "C0SUPPORT", f"{time.time():.6f}"
    thread = thread_of(channel, thread_ts)
    work = fake_dir()
    work.mkdir(parents=True, exist_ok=True)
    for name in ("posts.jsonl", "refunds.jsonl", "model.jsonl"):
        (work / name).unlink(missing_ok=True)
    events = [
        envelope_for(channel, thread_ts, thread_ts, "Ev01REFUND", "Please refund $80 on order #1042, it broke."),
        envelope_for(channel, thread_ts, f"{float(thread_ts) + 1:.6f}", "Ev02STATUS", "And where is order #1043?"),
    ]
    for e in events:
        (work / f"{e['event_id']}.json").write_text(json.dumps(e))
    me = [sys.executable, __file__, *(["--url", url] if url else [])]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*me, *args], text=True, capture_output=True)

    print(f"persistkit demo: a Slack thread {thread} on {store.url}\n")
    print("1. Event Ev01REFUND: a customer asks for a refund.")
    first = cli("handle", str(work / "Ev01REFUND.json"))
    print(f"   {first.stdout.strip()}  (the worker process exited: nothing holds the turn in memory)")
    print("\n2. Event Ev02STATUS arrives in the same thread while Ev01 waits for a person.")
    second = subprocess.Popen([*me, "handle", str(work / "Ev02STATUS.json")], text=True, stdout=subprocess.PIPE)
    give_up = time.monotonic() + 60
    while not (info := [i for i in store.leases(prefix=thread) if i.thread_id == thread]) or not info[0].waiting:
        if time.monotonic() > give_up or second.poll() is not None:
            sys.exit("demo: Ev02STATUS did not wait behind Ev01REFUND")
        time.sleep(0.05)
    print(f"   it waits its turn: the thread is reserved for run {info[0].reserved_for} "
          f"({len(info[0].waiting)} turn waiting)")
    print("\n3. Slack redelivers Ev01REFUND (it got no 200 in time).")
    again = cli("handle", str(work / "Ev01REFUND.json"))
    print(f"   {again.stdout.strip()}  (replayed up to the question: no model call, nothing posted)")
    print("\n4. Open questions (what a review UI reads):")
    print("   " + cli("pending").stdout.strip().replace("\n", "\n   "))
    print(f"\n5. A person approves, from another process: answer {thread_ts} yes")
    approved = cli("answer", thread_ts, "yes", "--channel", channel)
    print(f"   {approved.stdout.strip()}")
    out, _ = second.communicate(timeout=60)
    print(f"   Ev02STATUS's worker went on: {out.strip()}")
    print("\nPosts the fake Slack client received (every call, duplicates included):")
    for p in FakeSlack.posts():
        print(f"   [{p['metadata']['event_payload']['event_id']}] {p['text']}")
    print(f"Refunds made: {[(r['order_id'], r['amount']) for r in Shop.refunds()]}; "
          f"model calls: {len(_read('model.jsonl'))} (3 for the refund turn, 2 for the status turn: "
          "none made twice)")
    print(f"\nHistory of {thread} (oldest first):")
    for cp in reversed(store.history(thread)):
        print(f"   {cp.run_id or '':<11} {cp.kind:<4} {cp.position or '':>3} {cp.step or '':<10} "
              f"{cp.status or '':<10} {cp.run_status or ''}")
    store.close()
    ok = [p["metadata"]["event_payload"]["event_id"] for p in FakeSlack.posts()] == ["Ev01REFUND", "Ev02STATUS"]
    if not ok or second.returncode != 0 or len(Shop.refunds()) != 1 or len(_read("model.jsonl")) != 5:
        sys.exit("demo: unexpected outcome")


# -- the chaos run: the faults, in real processes ---------------------------------------------

CHAOS_LIMIT = 60.0  # seconds any one wait of the chaos run may take (a hang, not a timing)
CHAOS_EVENTS = {  # event id: (the customer's message, the reply the bot must post for it, once)
    "Ev01ORDER": ("Where is my order #1042?", "Order #1042 (espresso machine): delivered on Nov 20."),
    "Ev02ORDER": ("And where is order #1043?", "Order #1043 (milk frother): shipped, arriving Nov 28."),
    "Ev03REFUND": ("The machine arrived broken: please refund $80 on order #1042.",
                   "Sorry, the refund of $80.00 on order #1042 was not approved."),
}


class ChaosFailed(Exception):
    """A chaos run's step did not go as the example promises (the run exits 1)."""


class Chaos:
    """The chaos run's processes: each a ``handle``, ``answer`` or ``drain`` of this script."""

    def __init__(self, url: str | None, store: pk.Store, channel: str, thread_ts: str) -> None:
        self.me = [sys.executable, __file__, *(["--url", url] if url else [])]
        self.store, self.channel, self.ts, self.work = store, channel, thread_ts, fake_dir()
        self.thread = thread_of(channel, thread_ts)
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        p = subprocess.Popen([*self.me, *args], text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def handle(self, event_id: str) -> subprocess.Popen[str]:
        return self.start("handle", str(self.work / f"{event_id}.json"))

    def what(self, p: subprocess.Popen[str]) -> str:
        return f"process {p.pid} ({' '.join(map(str, p.args[len(self.me):]))})"  # type: ignore[index]

    def finish(self, p: subprocess.Popen[str], *codes: int) -> dict[str, Any]:
        """Wait for ``p`` to exit with one of ``codes`` (default 0); the JSON line it printed last."""
        try:
            out, _ = p.communicate(timeout=CHAOS_LIMIT)
        except subprocess.TimeoutExpired:
            raise ChaosFailed(f"{self.what(p)} still runs after {CHAOS_LIMIT:.0f} s") from None
        lines = out.strip().splitlines()
        if p.returncode not in (codes or (0,)) or not lines:
            raise ChaosFailed(f"{self.what(p)} exited {p.returncode}:\n{out}")
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    def until(self, what: str, check: Callable[[], Any], *running: subprocess.Popen[str]) -> Any:
        """Poll ``check()`` until it returns something true; fail past CHAOS_LIMIT or if one
        of ``running`` exited meanwhile."""
        give_up = time.monotonic() + CHAOS_LIMIT
        while not (found := check()):
            for p in running:
                if p.poll() is not None:
                    raise ChaosFailed(f"waiting for {what}: {self.what(p)} exited {p.returncode}:\n"
                                      f"{p.communicate()[0]}")
            if time.monotonic() > give_up:
                raise ChaosFailed(f"waited {CHAOS_LIMIT:.0f} s for {what}")
            time.sleep(0.02)
        return found

    def arm(self, point: str) -> None:
        """The next call at ``point`` (``lookup`` or ``post``), in whichever process gets there, hangs."""
        (self.work / f"stall-{point}").touch()

    def stalled(self, point: str, *running: subprocess.Popen[str]) -> subprocess.Popen[str]:
        """Wait until one of ``running`` hangs at ``point`` (:meth:`arm`); that process."""
        by_pid = {p.pid: p for p in running}
        found: list[Path] = self.until(f"a worker hung at {point}",
                                       lambda: list(self.work.glob(f"stalled-{point}.*")), *running)
        stuck = by_pid.get(int(found[0].name.rsplit(".", 1)[1]))
        if stuck is None:
            raise ChaosFailed(f"{found[0].name}: a process this run did not start hung at {point}")
        found[0].unlink()
        return stuck

    def kill(self, p: subprocess.Popen[str]) -> None:
        os.kill(p.pid, signal.SIGKILL)
        if p.wait(CHAOS_LIMIT) != -signal.SIGKILL:
            raise ChaosFailed(f"process {p.pid} exited {p.returncode} before the SIGKILL")

    def lease(self) -> pk.LeaseInfo | None:
        found = [i for i in self.store.leases(prefix=self.thread) if i.thread_id == self.thread]
        return found[0] if found else None

    def head(self) -> tuple[str | None, str | None]:
        """The run and step of the thread's newest checkpoint."""
        last = self.store.history(self.thread, limit=1)
        return (last[0].run_id, last[0].step) if last else (None, None)

    def posts(self) -> list[dict[str, Any]]:
        """The posts made in this run's thread (a drain may post other threads' leftovers too)."""
        return [p for p in FakeSlack.posts() if (p["channel"], p["thread_ts"]) == (self.channel, self.ts)]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()


def chaos(url: str | None) -> int:
    """``--chaos``: one thread's events through every fault the example claims to survive, each
    worker its own process, each kill a SIGKILL; prints what happens, the posts and the proof
    that each reply was posted once, in the order the turns ran. 0 if all of it holds, else 1."""
    channel, thread_ts = "C0SUPPORT", f"{time.time():.6f}"
    work = fake_dir()
    work.mkdir(parents=True, exist_ok=True)
    for old in [*work.glob("stall*-*"), *(work / n for n in ("slack-down", "posts.jsonl", "refunds.jsonl", "model.jsonl"))]:
        old.unlink(missing_ok=True)
    for i, (event_id, (text, _)) in enumerate(CHAOS_EVENTS.items()):
        envelope = envelope_for(channel, thread_ts, f"{float(thread_ts) + i:.6f}", event_id, text)
        (work / f"{event_id}.json").write_text(json.dumps(envelope))
    try:
        store = pk.connect(url)
    except pk.PersistkitError as exc:
        print(f"slack_thread: {exc}", file=sys.stderr)
        return 1
    world = Chaos(url, store, channel, thread_ts)
    say(f"persistkit chaos run: Slack thread {world.thread} on {store.url}\n"
        f"(every worker is its own process; the fake Slack and shop write under {work})\n")
    try:
        turns = _chaos_steps(world)
        return _chaos_proof(world, turns)
    except (ChaosFailed, pk.PersistkitError) as exc:
        print(f"\nchaos: FAILED: {exc}", flush=True)
        return 1
    finally:
        world.close()
        store.close()


def say(text: str) -> None:
    print(text, flush=True)  # the reader watches the run as it goes, not at its end


def _chaos_steps(world: Chaos) -> list[str]:
    """The faults, one after the other; returns the event ids in the order their turns ran."""
    say("1. Ev01ORDER and Ev02ORDER (two messages of one thread) reach two workers at the same instant.")
    world.arm("lookup")  # whichever turn gets the thread hangs in its order lookup
    workers = {e: world.handle(e) for e in ("Ev01ORDER", "Ev02ORDER")}
    stuck = world.stalled("lookup", *workers.values())
    first = next(e for e, p in workers.items() if p is stuck)
    second = next(e for e in workers if e != first)
    info = world.until(f"{second} waiting behind {first}", lambda: (i := world.lease()) and i.waiting and i, workers[second])
    if world.head() != (first, "think"):
        raise ChaosFailed(f"{first} hangs in its lookup, but the thread's newest checkpoint is {world.head()}")
    say(f"   {first} took the thread (pid {stuck.pid}); its model step committed, it hangs in the shop's "
        f"order lookup.\n   {second} (pid {workers[second].pid}) waits behind it ({len(info.waiting)} turn waiting).")

    say(f"\n2. SIGKILL {first}'s worker mid-turn.")
    world.kill(stuck)
    world.until(f"the thread reserved for {first}'s unfinished turn",
                lambda: (i := world.lease()) is not None and i.reserved_for == first)
    say(f"   the thread stays reserved for {first}'s unfinished turn; {second} still waits; "
        f"posts so far: {len(world.posts())}.")

    say(f"\n3. Slack redelivers {first} (no 200 from the dead worker): the turn goes on from its last committed step.")
    world.arm("post")
    again = world.handle(first)
    hung = world.stalled("post", again)
    if world.head() != (first, "reply") or world.posts():
        raise ChaosFailed(f"before the post: head {world.head()}, posts {world.posts()}")
    world.kill(hung)
    say(f"   its reply step committed; SIGKILL the worker (pid {hung.pid}) between the commit and the post: "
        f"posts so far: {len(world.posts())}.")

    say(f"\n4. Slack goes down; {first} is redelivered again.")
    (world.work / "slack-down").touch()
    failed = world.finish(world.handle(first), 4)
    if failed.get("status") != "post pending" or world.posts() or workers[second].poll() not in (None, 3):
        raise ChaosFailed(f"with Slack down: {failed}, posts {world.posts()}")
    say(f"   every attempt to post is refused: exit 4, {failed['status']} (key {failed['key']}); "
        f"the reply stays committed and {second} still waits, so replies stay in order.")

    say("\n5. Slack is back. A sweeper runs `drain`.")
    (world.work / "slack-down").unlink()
    drained = world.finish(world.start("drain"))
    if [p["metadata"]["event_payload"]["event_id"] for p in world.posts()] != [first]:
        raise ChaosFailed(f"drain: {drained}, posts {world.posts()}")
    say(f"   {json.dumps(drained)}: the pending post went out, once.")

    say(f"\n6. Slack's last redelivery of {first} ends its turn; {second}'s worker, waiting since step 1, goes on.")
    say(f"   {first}: {json.dumps(world.finish(world.handle(first)))} (nothing posted again)")
    outcome = world.finish(workers[second], 0, 3)
    if outcome.get("status") == "busy":  # it gave its worker slot back: the queue retries the event
        say(f"   {second} gave its worker slot back ({json.dumps(outcome)}); the queue retries it.")
        outcome = world.finish(world.handle(second))
    say(f"   {second}: {json.dumps(outcome)}")

    say("\n7. Ev03REFUND asks for a refund: a person must decide.")
    say(f"   {json.dumps(world.finish(world.handle('Ev03REFUND')))}")
    say(f"   a person declines, from another process (answer {world.ts} no): "
        f"{json.dumps(world.finish(world.start('answer', world.ts, 'no', '--channel', world.channel)))}")

    say("\n8. Slack redelivers all three finished events at once.")
    redelivered = [world.handle(e) for e in CHAOS_EVENTS]
    say("   " + ", ".join(f"{e}: {world.finish(p)['status']}" for e, p in zip(CHAOS_EVENTS, redelivered, strict=True)))
    return [first, second, "Ev03REFUND"]


def _chaos_proof(world: Chaos, turns: list[str]) -> int:
    """Print the posts and check them against the thread's own record; 0 if every check holds."""
    posts = world.posts()
    say("\nPosts the fake Slack client received in the thread (every call, duplicates included):")
    for p in posts:
        say(f"   [{p['metadata']['event_payload']['event_id']}] {p['text']}")
    posted = [p["metadata"]["event_payload"]["event_id"] for p in posts]
    ran = [m["event_id"] for m in world.store.get_state(world.thread)["messages"] if m["role"] == "user"]
    keys = {p["metadata"]["event_payload"]["key"] for p in posts}
    texts = [p["text"] for p in posts]
    expected = [CHAOS_EVENTS[e][1] for e in turns]
    calls = len(_read("model.jsonl"))
    checks = [
        (len(posts) == len(set(posted)) == len(keys) == len(CHAOS_EVENTS),
         f"each event posted once: {len(posts)} posts for {len(CHAOS_EVENTS)} events, {len(keys)} idempotency keys"),
        (posted == ran == turns, f"posted in the order the turns ran: {' -> '.join(posted)} (the thread's turns: {' -> '.join(ran)})"),
        (texts == expected, "each post is its turn's reply"),
        (Shop.refunds() == [], f"the declined refund was not made: {len(Shop.refunds())} refunds"),
        (calls == 7, f"{calls} model calls for 7 decisions (2, 2 and 3 per turn): none made twice"),
    ]
    say("\nProof:")
    for ok, what in checks:
        say(f"   {'ok  ' if ok else 'FAIL'} {what}")
    if all(ok for ok, _ in checks):
        say("chaos: every reply posted once, in order")
        return 0
    say("chaos: FAILED")
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("PERSISTKIT_URL"), help="store URL")
    parser.add_argument("--fake-dir", help="where the fake Slack client and shop write (default $SLACK_FAKE_DIR)")
    parser.add_argument("--chaos", action="store_true",
                        help="run the faults (two workers at once, SIGKILLs, Slack down, a redelivery) and prove the posts")
    sub = parser.add_subparsers(dest="command")
    h = sub.add_parser("handle", help="handle one event envelope")
    h.add_argument("envelope", help="a JSON file, or - for stdin")
    h.add_argument("--busy-timeout", type=float, default=300.0)
    h.add_argument("--debounce-window", type=float, default=DEBOUNCE[0],
                   help="--busy debounce: seconds of quiet that end a burst")
    h.add_argument("--debounce-max", type=float, default=DEBOUNCE[1],
                   help="--busy debounce: the longest a burst is gathered (seconds)")
    h.add_argument("--busy", choices=["queue", "interrupt", "debounce"], default="queue",
                   help="interrupt: a correction, which stops the thread's turn in flight at its next step; "
                        "debounce: messages of a burst become one turn (the others print merged)")
    a = sub.add_parser("answer", help="answer a thread's open question and finish its turn")
    a.add_argument("thread_ts")
    a.add_argument("decision", choices=["yes", "no"])
    a.add_argument("--channel")
    a.add_argument("--by", default=os.environ.get("USER", "someone"), help="who decides")
    sub.add_parser("pending", help="list open questions")
    sub.add_parser("drain", help="run after-commit posts that a dead process left")
    args = parser.parse_args(argv)
    if args.fake_dir:
        os.environ["SLACK_FAKE_DIR"] = args.fake_dir  # read by the effects, in this process
    if args.chaos:
        if args.command is not None:
            parser.error(f"--chaos runs on its own, not with {args.command!r}")
        return chaos(args.url)
    if args.command is None:
        demo(args.url)
        return 0
    with pk.connect(args.url) as store:
        try:
            return command(store, args)
        except pk.ThreadBusyError as exc:  # retryable: the queue delivers the event again later
            print(json.dumps({"status": "busy", "waiting_for": exc.unfinished_run}))
            return 3
        except pk.EffectError as exc:  # Slack kept failing: the reply is committed, its post pending
            print(json.dumps({"status": "post pending", "key": exc.key, "error": str(exc)}))
            return 4
        except pk.PersistkitError as exc:
            print(f"slack_thread: {exc}", file=sys.stderr)
            return 1


def command(store: pk.Store, args: argparse.Namespace) -> int:
    if args.command == "handle":
        try:
            envelope = json.loads(sys.stdin.read() if args.envelope == "-" else Path(args.envelope).read_text())
        except (OSError, ValueError) as exc:
            print(f"slack_thread: cannot read the envelope {args.envelope}: {exc}", file=sys.stderr)
            return 2
        window = (args.debounce_window, args.debounce_max)
        print(json.dumps({"status": handle(store, envelope, args.busy_timeout, args.busy, window)}))
    elif args.command == "answer":
        thread = find_thread(store, args.thread_ts, args.channel)
        print(json.dumps({"status": answer(store, thread, args.decision == "yes", args.by)}))
    elif args.command == "pending":
        for q in store.pending(prefix="slack:"):
            print(json.dumps({"thread": q.thread_id, "run": q.run_id, "id": q.question_id, "question": q.payload}))
    else:  # a sweeper (cron): posts committed replies whose process died before posting them
        report = store.drain_outbox(prefix="slack:")
        print(json.dumps({"posted": len(report.done), "failed": [e.error for e in report.failed],
                          "skipped": [t for t, _, _ in report.skipped]}))
        return 0 if report.ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
