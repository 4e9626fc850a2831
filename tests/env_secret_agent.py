"""An agent that holds a key from its environment in state and in step arguments, run as
its own process: the reusable piece of the "environment secrets in a new process" case.

    python env_secret_agent.py URL THREAD KILL_AT

The key is read from ``$PK_AGENT_OPENAI_API_KEY`` (``VARIABLE``); nothing is registered
or configured: environment secrets work with zero configuration. The run:

1. ``run.state.api_key = key`` (a ``pk.State`` field, the quickstart's style) and a
   user message quoting the key appended to ``run.state.messages``;
2. step ``fetch_key()`` returns the key (a step whose result is all secret);
3. step ``draft(api_key, topic)`` returns an email body with the key inside;
4. step ``send(body)`` (a tool call: the key inside a longer text in its arguments);
5. step ``call_model(api_key, messages)`` (a model call: the key alone, and inside
   the conversation; its body also reads ``run.state.api_key``).

Every step body appends what it was handed to the file ``$PK_AGENT_OUTBOX`` (one JSON
line per call: ``{"step", "texts"}``) before anything else, so the caller sees what
each call received, including the call in flight at a crash. KILL_AT = k >= 1:
SIGKILL inside step number k (1-4, after writing its outbox line); -1: run to the end.
Prints one JSON line: ``{"done": true, "reply": ...}`` or ``{"error": class, "message": ...}``.

From a test, use :func:`run_agent` (one process) or :func:`crash_and_resume` (the
whole case: crash at k in one process, resume in a new one with an environment of
your choosing).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

VARIABLE = "PK_AGENT_OPENAI_API_KEY"
STEPS = ("fetch_key", "draft", "send", "call_model")
HERE = Path(__file__).resolve()


def run_agent(
    url: str, thread: str, kill_at: int, *, outbox: Path, key: str | None, extra_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run the agent as a new process; ``key`` None: the variable is not set there.
    Returns its JSON line, or ``{"killed": True}`` when it was killed as asked."""
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    if key is not None:
        env[VARIABLE] = key
    env.update(extra_env or {})
    env["PK_AGENT_OUTBOX"] = str(outbox)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, str(HERE), url, thread, str(kill_at)], capture_output=True, text=True, env=env, timeout=180
    )
    if kill_at >= 1:
        assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr)
        return {"killed": True}
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def handed(outbox: Path) -> list[dict[str, Any]]:
    """What each step call was handed, in call order, across processes."""
    if not outbox.exists():
        return []
    return [json.loads(line) for line in outbox.read_text().splitlines() if line.strip()]


def crash_and_resume(
    url: str, thread: str, kill_at: int, *, outbox: Path, key: str, resume_key: str | None, **kw: Any
) -> dict[str, Any]:
    """The agent killed in step ``kill_at`` with ``key`` in its environment, then resumed in a
    new process whose environment holds ``resume_key`` (None: the variable is gone)."""
    run_agent(url, thread, kill_at, outbox=outbox, key=key, **kw)
    return run_agent(url, thread, -1, outbox=outbox, key=resume_key, **kw)


def main() -> None:
    import persistkit as pk

    url, thread, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    outbox = Path(os.environ["PK_AGENT_OUTBOX"])

    class Chat(pk.State, name="env_secret_agent.Chat"):
        api_key: str = ""
        messages: Annotated[list[str], pk.append] = []

    def log(step: str, *texts: Any) -> None:
        with outbox.open("a") as f:
            f.write(json.dumps({"step": step, "texts": [str(t) for t in texts]}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if STEPS[kill_at - 1 if kill_at >= 1 else 0] == step and kill_at >= 1:
            os.kill(os.getpid(), signal.SIGKILL)

    @pk.checkpointed
    def fetch_key() -> str:
        log("fetch_key")
        return os.environ[VARIABLE]

    @pk.checkpointed
    def draft(api_key: str, topic: str) -> str:
        log("draft", api_key)
        return f"Hello ops,\nthe {topic} key is {api_key} (rotate it monthly).\n"

    @pk.checkpointed
    def send(body: str) -> str:
        log("send", body)
        return f"sent {len(body)} characters"

    @pk.checkpointed
    def call_model(api_key: str, messages: list[str]) -> str:
        state = pk.current_run().state
        log("call_model", api_key, *messages, state.api_key)
        return f"model answered {len(messages)} messages"

    store = pk.connect(url)
    try:
        with pk.resume(thread, store=store, state=Chat) as run:
            if not run.state.messages and VARIABLE in os.environ:  # the key enters state (replays restore it)
                run.state.api_key = os.environ[VARIABLE]
                run.state.messages.append(f"user: deploy with key {os.environ[VARIABLE]} please")
            key = fetch_key()
            body = draft(key, "deploy")
            send(body)
            reply = call_model(key, list(run.state.messages))
            run.state.messages.append(f"assistant: {reply}")
    except pk.PersistkitError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return
    finally:
        store.close()
    print(json.dumps({"done": True, "reply": reply}))


if __name__ == "__main__":
    main()
