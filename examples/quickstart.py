"""persistkit quickstart: a 20-step research agent that dies at step 14 and resumes.

    pip install persistkit                 # no extra: SQLite is the default store
    python examples/quickstart.py          # runs the agent twice and shows what was saved

The first run is killed for real (SIGKILL, no cleanup, like an OOM kill or a
lost container) in the middle of step 14. The second run replays the 13
finished steps from the store, without calling the LLM, and runs the rest.
Everything lives in the default SQLite store under ./.persistkit/.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import persistkit as pk

THREAD = "demo-research-agent"
QUESTIONS = 18  # plan + 18 research steps + summary = 20 steps
COUNTER = Path(".persistkit") / "demo-llm-calls.log"


class Research(pk.State, version=1):
    topic: str = ""
    notes: Annotated[list[dict[str, str]], pk.append] = []


def fake_llm(prompt: str) -> str:
    """A deterministic stand-in for a model call: ~50 ms and one line in the call log."""
    if os.environ.get("DEMO_CRASH_AT"):
        print(f"  LLM call: {prompt[:48]}", flush=True)
    time.sleep(0.05)
    COUNTER.parent.mkdir(exist_ok=True)
    with COUNTER.open("a") as log:
        log.write(prompt[:60].replace("\n", " ") + "\n")
    digest = hashlib.sha256(prompt.encode()).hexdigest()
    return f"answer-{digest[:10]}"


@pk.checkpointed
def plan(topic: str) -> list[str]:
    fake_llm(f"plan research on {topic}")
    return [f"{topic}: question {i + 1}" for i in range(QUESTIONS)]


@pk.checkpointed
def research(question: str, step_no: int) -> str:
    answer = fake_llm(f"research {question}")
    if step_no == int(os.environ.get("DEMO_CRASH_AT", "0")):
        print(f"  step {step_no:2d} (pos {step_no - 1:2d})  research  ... the process dies here (SIGKILL)",
              flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    run = pk.current_run()
    assert run is not None
    run.state.notes.append({"question": question, "answer": answer})
    return answer


@pk.checkpointed
def summarize(notes: list[dict[str, str]]) -> str:
    return fake_llm("summarize " + json.dumps(notes))


def agent(topic: str) -> str:
    questions = plan(topic)
    for i, q in enumerate(questions):
        research(q, i + 2)
    run = pk.current_run()
    assert run is not None
    return summarize(run.state.notes)


def worker() -> None:
    """One invocation of the agent (one process)."""
    started = time.perf_counter()
    with pk.resume(THREAD, state=Research) as run:
        run.state.topic = "durable AI agents"
        summary = agent(run.state.topic)
    elapsed = time.perf_counter() - started
    for n, step in enumerate(run.steps, 1):  # step n is stored at position n - 1
        how = "replayed from store" if step.replayed else "ran (LLM call)"
        print(f"  step {n:2d} (pos {step.position:>2})  {step.name:<9} {how}")
    print(json.dumps({
        "replayed": len(run.replayed),
        "ran": len(run.executed),
        "seconds": round(elapsed, 2),
        "summary": summary,
    }), flush=True)


def llm_calls() -> int:
    return len(COUNTER.read_text().splitlines()) if COUNTER.exists() else 0


def main() -> None:
    store = pk.connect()  # $PERSISTKIT_URL, else SQLite under ./.persistkit/
    store.delete_thread(THREAD)
    COUNTER.unlink(missing_ok=True)
    me = [sys.executable, __file__, "--worker"]

    print(f"persistkit demo — a 20-step research agent on {store.url}\n")
    print("Run 1: the agent starts; the process will be killed during step 14.")
    t0 = time.perf_counter()
    first = subprocess.run(me, env={**os.environ, "DEMO_CRASH_AT": "14"}, text=True, capture_output=True)
    t1 = time.perf_counter() - t0
    print(first.stdout, end="")
    died = first.returncode == -signal.SIGKILL
    print(f"  -> process exit code {first.returncode} ({'killed by SIGKILL' if died else 'unexpected'}), "
          f"{llm_calls()} LLM calls, {t1:.2f}s\n")
    calls_before = llm_calls()

    print("Run 2: the same command again.")
    second = subprocess.run(me, text=True, capture_output=True, check=True)
    lines = second.stdout.rstrip().splitlines()
    stats = json.loads(lines[-1])
    print("\n".join(lines[:-1]))
    run2_calls = llm_calls() - calls_before
    print(f"\n  replayed {stats['replayed']} finished steps from the store, ran {stats['ran']}")
    print(f"  LLM calls in run 2: {run2_calls} (without persistkit: 20; saved {20 - run2_calls}, "
          f"about {(20 - run2_calls) * 0.05:.2f}s of model time)")
    print(f"  run 2 took {stats['seconds']:.2f}s; result: {stats['summary']}")
    notes = store.get_state(THREAD, state=Research).notes
    print(f"  state: {len(notes)} notes, each written exactly once\n")

    print(f"History of thread {THREAD!r} (newest first; pos counts from 0, so step 14 is pos 13):")
    print(f"  {'checkpoint':<24}  {'run':<8}  {'kind':<4}  {'pos':>3}  {'step':<9}  {'status':<9}  run status")
    for cp in store.history(THREAD):
        print(f"  {cp.checkpoint_id}  {(cp.run_id or '')[:8]:<8}  {cp.kind:<4}  {cp.position or '':>3}  "
              f"{cp.step or '':<9}  {cp.status or '':<9}  {cp.run_status or ''}")
        if cp.resumed:  # the first checkpoint written after the resume says who resumed, and what it found
            how = f"process {cp.resumed.took_over} died" if cp.resumed.holder_gone else "the run stopped"
            print(f"  {'':<24}  {(cp.run_id or '')[:8]:<8}  {how}; resumed in {cp.resumed.host}, "
                  f"{cp.resumed.replayed} steps replayed")
    print(f"\nSee it drawn: persistkit timeline {THREAD}  (writes {THREAD}.html)")
    store.close()
    if not died or stats["replayed"] != 13 or run2_calls != 7:
        sys.exit("demo: unexpected outcome")


if __name__ == "__main__":
    worker() if "--worker" in sys.argv else main()
