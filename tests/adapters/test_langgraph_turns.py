"""Turns of one LangGraph thread in real processes on PostgreSQL (issue #19, the seeds' Slack case):
two turns at once, a redelivered turn, a worker SIGKILLed mid-turn while the next turn waits.
Every turn lands once, its messages contiguous and in node order; no finished node body runs twice."""

from __future__ import annotations

import json
import operator
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from conftest import make_url, uid

pytest.importorskip("langgraph")

from langgraph.graph import END, START, StateGraph

import persistkit as pk
from persistkit_langgraph import PersistkitSaver, adurable_invoke, durable_invoke

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "adapters" / "langgraph_turn_worker.py"
NODES = ("user", "think", "act", "reply")
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "adapters")])}


@pytest.fixture
def pg(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_url("postgres", request, tmp_path_factory)


@pytest.fixture(params=["plain", "secret-like"])
def ids(request: pytest.FixtureRequest) -> dict[str, str]:
    """The turns' run ids: their names, or event ids persistkit's high-entropy rule would redact
    in a value (a message id, ``secrets.token_urlsafe``): stored and matched as they are."""
    if request.param == "plain":
        return {}
    import secrets

    return {run: f"evt_{secrets.token_urlsafe(24)}" for run in "ABC"}


def start(
    url: str, thread: str, run: str, where: Path, mode: str = "sync", *options: str, ids: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    run_id = (ids or {}).get(run)
    cmd = [sys.executable, str(WORKER), url, thread, run, str(where), mode, *options, *([f"id={run_id}"] if run_id else [])]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def wait_for(path: Path) -> None:
    for _ in range(600):
        if path.exists():
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def messages(url: str, thread: str) -> list[str]:
    with PersistkitSaver.from_url(url) as saver:
        tup = saver.get_tuple({"configurable": {"thread_id": thread}})
        assert tup is not None
        return list(tup.checkpoint["channel_values"]["messages"])


def turns(msgs: list[str]) -> list[str]:
    """The runs in the thread, in order, asserting each turn's messages are complete and contiguous."""
    assert len(msgs) % len(NODES) == 0, msgs
    runs = []
    for i in range(0, len(msgs), len(NODES)):
        run = msgs[i].split(":")[0]
        assert msgs[i : i + len(NODES)] == [f"{run}:{n}" for n in NODES], msgs
        runs.append(run)
    assert len(set(runs)) == len(runs), f"a turn landed twice: {msgs}"
    return runs


def effects(where: Path) -> Counter[str]:
    path = where / "effects"
    return Counter(path.read_text().split()) if path.exists() else Counter()


def ran_once(where: Path, *runs: str) -> None:
    assert effects(where) == Counter(f"{r}:{n}" for r in runs for n in NODES[1:])


# -- real processes on PostgreSQL ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_two_turns_of_one_thread_at_once_both_land_in_order(pg: str, tmp_path: Path, mode: str) -> None:
    thread = uid("slack")
    a = start(pg, thread, "A", tmp_path, mode, "slow")
    time.sleep(0.05)
    b = start(pg, thread, "B", tmp_path, mode, "slow")
    out_a, out_b = finish(a), finish(b)
    runs = turns(messages(pg, thread))
    assert sorted(runs) == ["A", "B"]
    # each call returned the thread as its turn left it: the later turn saw the earlier one
    first, second = (out_a, out_b) if runs[0] == "A" else (out_b, out_a)
    assert first["ok"]["messages"] == [f"{runs[0]}:{n}" for n in NODES]
    assert second["ok"]["messages"] == [f"{r}:{n}" for r in runs for n in NODES]
    ran_once(tmp_path, "A", "B")


@pytest.mark.slow
def test_a_turn_arriving_while_another_runs_waits_and_runs_after_it(pg: str, tmp_path: Path) -> None:
    thread = uid("slack")
    a = start(pg, thread, "A", tmp_path, "sync", "slow")
    wait_for(tmp_path / "A.running")  # A holds the thread
    b = start(pg, thread, "B", tmp_path, "async")
    finish(a), finish(b)
    assert turns(messages(pg, thread)) == ["A", "B"]
    ran_once(tmp_path, "A", "B")


@pytest.mark.slow
def test_a_redelivered_turn_runs_once(pg: str, tmp_path: Path, ids: dict[str, str]) -> None:
    thread = uid("slack")
    first = finish(start(pg, thread, "A", tmp_path, ids=ids))
    again = finish(start(pg, thread, "A", tmp_path, "async", ids=ids))  # Slack retries the event
    assert again == first
    finish(start(pg, thread, "B", tmp_path, ids=ids))
    late = finish(start(pg, thread, "A", tmp_path, ids=ids))  # redelivered after the next turn ran
    assert late == first
    assert turns(messages(pg, thread)) == ["A", "B"]
    ran_once(tmp_path, "A", "B")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_worker_killed_mid_turn_keeps_its_place_while_the_next_turn_waits(
    pg: str, tmp_path: Path, mode: str, ids: dict[str, str]
) -> None:
    thread = uid("slack")
    a = start(pg, thread, "A", tmp_path, mode, "kill", ids=ids)
    wait_for(tmp_path / "A.running")
    b = start(pg, thread, "B", tmp_path, mode, "timeout=50", ids=ids)  # queued behind A
    a.communicate(timeout=60)
    assert a.returncode == -9  # died at the start of act, think committed
    time.sleep(1.0)  # B takes the dead holder's lease, finds A crashed, and waits for it
    c = start(pg, thread, "C", tmp_path, mode, "timeout=50", ids=ids)  # the thread's next event queues behind B
    time.sleep(1.0)
    assert b.poll() is None and c.poll() is None, (b.communicate(), c.communicate())
    redelivered = finish(start(pg, thread, "A", tmp_path, mode, ids=ids))  # the queue redelivers A
    assert redelivered["ok"]["messages"] == [f"A:{n}" for n in NODES]
    assert finish(b)["ok"]["messages"][-1] == "B:reply"
    assert finish(c)["ok"]["messages"][-1] == "C:reply"
    assert turns(messages(pg, thread)) == ["A", "B", "C"]  # arrival order, the crashed turn first
    ran_once(tmp_path, "A", "B", "C")  # think ran once: the redelivery continued after it


@pytest.mark.slow
def test_a_crashed_turn_makes_reject_and_timeout_raise_thread_busy(pg: str, tmp_path: Path, ids: dict[str, str]) -> None:
    thread = uid("slack")
    a = start(pg, thread, "A", tmp_path, "sync", "kill", ids=ids)
    a.communicate(timeout=60)
    assert a.returncode == -9
    run_a = ids.get("A", "A")
    for options in (("busy=reject",), ("busy=wait", "timeout=0.5"), ("timeout=0.5",)):
        out = finish(start(pg, thread, "B", tmp_path, "sync", *options, ids=ids))
        assert out["error"] == "ThreadBusyError", out
        assert out["unfinished_run"] == run_a, out
        # the LangGraph remedies, the crashed turn named as it is
        assert f"durable_invoke(graph, None, config, run_id={run_a!r})" in out["message"], out
        assert f"store.abandon({thread!r}, {run_a!r}, namespace='lg:c:')" in out["message"], out
        assert "pk.resume" not in out["message"] and "$CRED" not in out["message"], out
        assert ("busy='reject'" if "busy=reject" in options else "busy_timeout= in durable_invoke") in out["message"]
    # durable_invoke without run_id continues the crashed turn (keeping its identity) ...
    with PersistkitSaver.from_url(pg) as saver:
        graph = _worker_graph(saver)
        out = durable_invoke(graph, None, {"configurable": {"thread_id": thread}})
        assert out["messages"] == [f"A:{n}" for n in NODES]
    # ... so A's redelivery then replays it, and B runs
    assert finish(start(pg, thread, "A", tmp_path, ids=ids))["ok"] == {"messages": [f"A:{n}" for n in NODES]}
    finish(start(pg, thread, "B", tmp_path, ids=ids))
    assert turns(messages(pg, thread)) == ["A", "B"]
    # A's act and reply ran in this process (its graph records no effects); nothing ran twice
    assert effects(tmp_path) == Counter({"A:think": 1, "B:think": 1, "B:act": 1, "B:reply": 1})


@pytest.mark.slow
def test_a_crashed_turn_given_up_with_abandon_lets_the_waiting_turn_go_on(pg: str, tmp_path: Path, ids: dict[str, str]) -> None:
    """store.abandon(thread, run_id, namespace="lg:c:") (the ThreadBusyError's advice) ends a crashed
    LangGraph turn: the waiting turn starts on top of the nodes it ran, its redelivery runs nothing."""
    thread, run_a = uid("slack"), ids.get("A", "A")
    a = start(pg, thread, "A", tmp_path, "sync", "kill", ids=ids)
    a.communicate(timeout=60)
    assert a.returncode == -9
    b = start(pg, thread, "B", tmp_path, "sync", "timeout=50", ids=ids)  # waits for A's redelivery
    time.sleep(1.0)
    assert b.poll() is None, b.communicate()
    with PersistkitSaver.from_url(pg) as saver:
        assert saver.store.abandon(thread, run_a, namespace="lg:c:").run_status == "abandoned"
    assert finish(b)["ok"]["messages"] == ["A:user", "A:think", *(f"B:{n}" for n in NODES)]
    out = finish(start(pg, thread, "A", tmp_path, ids=ids))  # the queue redelivers A after all
    assert out["error"] == "RunAbandonedError", out
    assert effects(tmp_path) == Counter({"A:think": 1, "B:think": 1, "B:act": 1, "B:reply": 1})
    # abandoned with no turn waiting: the thread shows it, the redelivery and a bare continue refuse
    other = uid("slack")
    c = start(pg, other, "C", tmp_path, "sync", "kill", ids=ids)
    c.communicate(timeout=60)
    run_c = ids.get("C", "C")
    with PersistkitSaver.from_url(pg) as saver:
        saver.store.abandon(other, run_c, namespace="lg:c:")
        graph = _worker_graph(saver)
        config: Any = {"configurable": {"thread_id": other}}
        state = graph.get_state(config)
        assert state.metadata["persistkit_abandoned"] is True and state.metadata["persistkit_run_id"] == run_c
        with pytest.raises(pk.RunAbandonedError, match=f"turn {run_c} was abandoned"):
            durable_invoke(graph, {"messages": ["C:user"]}, config, run_id=run_c)
        with pytest.raises(pk.ConfigurationError, match="abandoned"):
            durable_invoke(graph, None, config)
        out = durable_invoke(graph, {"messages": ["D:user"]}, config, run_id="D")
        assert out["messages"] == ["C:user", "C:think", *(f"D:{n}" for n in NODES)]
        assert len(list(graph.get_state_history(config))) == len(list(saver.list(config)))


@pytest.mark.slow
def test_plain_invokes_of_one_thread_at_once_never_drop_a_turn_silently(pg: str, tmp_path: Path) -> None:
    thread = uid("slack")
    a = start(pg, thread, "A", tmp_path, "plain", "slow")
    time.sleep(0.05)
    b = start(pg, thread, "B", tmp_path, "plain", "slow")
    outs = {"A": finish(a), "B": finish(b)}
    msgs = messages(pg, thread)
    assert any("ok" in out for out in outs.values())
    for run, out in outs.items():  # each call either landed whole, or was told it did not
        block = [f"{run}:{n}" for n in NODES]
        if "error" in out:
            assert out["error"] == "ConflictError", out
            assert f"{run}:reply" not in msgs
        else:
            assert out["ok"]["messages"] == msgs or out["ok"]["messages"] == msgs[: len(out["ok"]["messages"])]
            i = msgs.index(f"{run}:user")
            assert msgs[i : i + len(NODES)] == block, msgs


# -- in one process ---------------------------------------------------------------------------------------


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]


def _worker_graph(saver: PersistkitSaver) -> Any:
    builder: StateGraph[Any] = StateGraph(Chat)
    for name in NODES[1:]:
        builder.add_node(name, lambda s, name=name: {"messages": [f"{s['messages'][-1].split(':')[0]}:{name}"]})
    builder.add_edge(START, "think")
    builder.add_edge("think", "act")
    builder.add_edge("act", "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=saver)


def test_a_put_whose_parent_is_no_longer_the_head_is_a_conflict(pg: str) -> None:
    """Another run of the thread commits while this one runs: this run's next checkpoint is
    refused (ConflictError) instead of overwriting the other run's turn."""
    thread = uid("lg")
    config: Any = {"configurable": {"thread_id": thread}}
    with PersistkitSaver.from_url(pg) as saver:
        other = _worker_graph(saver)
        builder: StateGraph[Any] = StateGraph(Chat)

        def think(state: Chat) -> dict[str, Any]:  # meanwhile, turn B runs to its end
            done = threading.Thread(target=lambda: other.invoke({"messages": ["B:user"]}, config))
            done.start()
            done.join()
            return {"messages": ["A:think"]}

        builder.add_node("think", think)
        builder.add_edge(START, "think")
        builder.add_edge("think", END)
        graph = builder.compile(checkpointer=saver)
        with pytest.raises(pk.ConflictError, match="another run of this thread wrote a newer checkpoint"):
            graph.invoke({"messages": ["A:user"]}, config, durability="sync")
        # A's input checkpoint was committed before B started; B's turn is whole on top of it,
        # and A's think, computed from the head B replaced, was refused instead of dropping B
        assert messages(pg, thread) == ["A:user", *(f"B:{n}" for n in NODES)]
        # time travel still branches: a run asked to start from an older checkpoint writes from it
        history = list(saver.list(config))
        oldest = history[-1].config["configurable"]["checkpoint_id"]
        out = other.invoke({"messages": ["C:user"]}, {"configurable": {"thread_id": thread, "checkpoint_id": oldest}})
        assert out["messages"][-4:] == [f"C:{n}" for n in NODES]


def test_bad_options_are_configuration_errors(pg: str) -> None:
    with PersistkitSaver.from_url(pg) as saver:
        graph = _worker_graph(saver)
        config: Any = {"configurable": {"thread_id": uid("lg")}}
        for kwargs in ({"busy": "later"}, {"lease_ttl": 0}, {"busy_timeout": -1}, {"busy_timeout": float("nan")}, {"run_id": ""}, {"run_id": 7}):
            with pytest.raises(pk.ConfigurationError):
                durable_invoke(graph, {"messages": ["A:user"]}, config, **kwargs)
        with pytest.raises(pk.ConfigurationError, match="thread_id"):
            durable_invoke(graph, {"messages": ["A:user"]}, {"configurable": {}})


def test_a_replaced_holder_writes_nothing(pg: str) -> None:
    """The saver's checkpoint writes inside durable_invoke carry the lease's fencing token:
    once another holder took the thread over, the old holder's next write is refused."""
    thread = uid("lg")
    with PersistkitSaver.from_url(pg) as saver:
        backend = saver.store.backend
        builder: StateGraph[Any] = StateGraph(Chat)

        def think(state: Chat) -> dict[str, Any]:  # meanwhile the lease is taken over
            rec = backend.lease_get(thread, "lg:c:")
            assert rec is not None
            thief = json.dumps({"o": "thief", "e": time.time() + 3600, "p": None, "q": []}).encode()
            assert backend.lease_swap(thread, "lg:c:", rec.version, rec.token + 1, thief)
            return {"messages": ["A:think"]}

        builder.add_node("think", think)
        builder.add_edge(START, "think")
        builder.add_edge("think", END)
        graph = builder.compile(checkpointer=saver)
        with pytest.raises(pk.LeaseLostError):
            durable_invoke(graph, {"messages": ["A:user"]}, {"configurable": {"thread_id": thread}}, run_id="A")
        assert messages(pg, thread) == ["A:user"]  # think's checkpoint was refused


# -- turn identity: ids that look like secrets, unfinished turns the thread moved past -------------------

#: Event ids that persistkit's high-entropy rule would take for secrets in a value.
LOOKS_SECRET = ["evt_1NG8Du2eZvKYlo2CUI79vXWy", "Q2hhbmdlZEJ5QVJlZGVsaXZlcnlJZEZvclRlc3Q0Mg"]


def _counting_graph(saver: PersistkitSaver, ran: list[str], fail: set[str] | None = None) -> Any:
    """think -> act -> reply; each node records ``run:node`` in ``ran``; act raises for runs in ``fail``."""
    builder: StateGraph[Any] = StateGraph(Chat)

    def node(name: str) -> Any:
        def body(state: Chat) -> dict[str, Any]:
            run = state["messages"][-1].split(":")[0]
            ran.append(f"{run}:{name}")
            if fail is not None and name == "act" and run in fail:
                raise RuntimeError(f"act failed for {run}")
            return {"messages": [f"{run}:{name}"]}

        return body

    for name in NODES[1:]:
        builder.add_node(name, node(name))
    builder.add_edge(START, "think")
    builder.add_edge("think", "act")
    builder.add_edge("act", "reply")
    builder.add_edge("reply", END)
    return builder.compile(checkpointer=saver)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_id_that_looks_like_a_secret_is_stored_and_matched_as_is(store_url: str, mode: str) -> None:
    import asyncio
    import secrets

    for run_id in [*LOOKS_SECRET, secrets.token_urlsafe(32)]:
        thread = uid("lg")
        config: Any = {"configurable": {"thread_id": thread}, "metadata": {"api_key": "sk-" + secrets.token_urlsafe(30)}}
        ran: list[str] = []
        with PersistkitSaver.from_url(store_url) as saver:
            graph = _counting_graph(saver, ran)

            def turn(graph: Any = graph, run_id: str = run_id, config: Any = config) -> Any:
                if mode == "async":
                    return asyncio.run(adurable_invoke(graph, {"messages": ["A:user"]}, config, run_id=run_id))
                return durable_invoke(graph, {"messages": ["A:user"]}, config, run_id=run_id)

            first = turn()
            assert turn() == first  # the redelivery found the turn: no node ran again
            durable_invoke(graph, {"messages": ["B:user"]}, config, run_id="B")
            assert turn() == first  # also once the thread moved on (an index read of the turn's records)
            assert ran == [f"{r}:{n}" for r in "AB" for n in NODES[1:]]
            meta = graph.get_state(config).metadata
            assert meta["persistkit_run_id"] == "B"
            history = list(graph.get_state_history(config))
            assert {h.metadata.get("persistkit_run_id") for h in history} == {run_id, "B"}
            # the id is the record's own run id; the caller's real secret in metadata stays redacted
            records = saver.store.history(thread, namespace="lg:c:", run_id=run_id)
            assert records and all(r.run_id == run_id for r in records)
            assert all(h.metadata["api_key"] != config["metadata"]["api_key"] for h in history)
            assert all(h.metadata["api_key"].startswith("$CRED{") for h in history)
            assert run_id not in json.dumps([r.metadata for r in records], default=str)


def test_a_failed_turn_redelivered_after_the_thread_moved_on_is_a_conflict(store_url: str) -> None:
    """f1's act raised, then f2 ran: f1's redelivery must not return its partial output as its result."""
    thread = uid("lg")
    config: Any = {"configurable": {"thread_id": thread}}
    ran: list[str] = []
    with PersistkitSaver.from_url(store_url) as saver:
        graph = _counting_graph(saver, ran, fail={"F"})
        with pytest.raises(RuntimeError, match="act failed"):
            durable_invoke(graph, {"messages": ["F:user"]}, config, run_id=LOOKS_SECRET[0])
        durable_invoke(graph, {"messages": ["G:user"]}, config, run_id="G")
        graph = _counting_graph(saver, ran)  # the failure was fixed: still, F's turn cannot finish now
        with pytest.raises(pk.ConflictError, match="did not finish before the thread moved on") as info:
            durable_invoke(graph, {"messages": ["F:user"]}, config, run_id=LOOKS_SECRET[0])
        assert not info.value.retryable
        assert "node 'act' raised" in str(info.value) and "checkpoint_id" in str(info.value)
        assert ran == ["F:think", "F:act", "G:think", "G:act", "G:reply"]  # nothing ran again
        # a failed turn redelivered before the thread moved on still runs its failed node again
        with pytest.raises(RuntimeError):
            durable_invoke(_counting_graph(saver, ran, fail={"H"}), {"messages": ["H:user"]}, config, run_id="H")
        out = durable_invoke(graph, {"messages": ["H:user"]}, config, run_id="H")
        assert out["messages"][-4:] == [f"H:{n}" for n in NODES]


def test_a_turn_cut_off_by_a_plain_invoke_redelivered_is_a_conflict(pg: str) -> None:
    thread = uid("lg")
    config: Any = {"configurable": {"thread_id": thread}}
    with PersistkitSaver.from_url(pg) as saver:
        other = _worker_graph(saver)
        builder: StateGraph[Any] = StateGraph(Chat)

        def think(state: Chat) -> dict[str, Any]:  # meanwhile a plain invoke runs turn B (no lease)
            done = threading.Thread(target=lambda: other.invoke({"messages": ["B:user"]}, config))
            done.start()
            done.join()
            return {"messages": ["A:think"]}

        builder.add_node("think", think)
        builder.add_edge(START, "think")
        builder.add_edge("think", END)
        graph = builder.compile(checkpointer=saver)
        with pytest.raises(pk.ConflictError, match="another run of this thread"):
            durable_invoke(graph, {"messages": ["A:user"]}, config, run_id="A")
        with pytest.raises(pk.ConflictError, match=r"turn A did not finish before the thread moved on \(it was cut off"):
            durable_invoke(graph, {"messages": ["A:user"]}, config, run_id="A")
        assert messages(pg, thread) == ["A:user", *(f"B:{n}" for n in NODES)]


class _Died(BaseException):
    """A turn's process dying mid-way, in process: no node error is recorded, as after a kill."""


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_turn_behind_a_crashed_one_gives_its_worker_back_after_unfinished_timeout(tmp_path: Path, mode: str) -> None:
    """``unfinished_timeout=`` reaches the turn's lease: past it the turn raises ThreadBusyError
    with ``retry_after`` and the LangGraph remedies, before any node runs."""
    import asyncio

    thread, ran = uid("lg"), []
    config: Any = {"configurable": {"thread_id": thread}}
    with PersistkitSaver.from_url(f"sqlite:///{tmp_path}/lg.db") as saver:

        def act_dies(state: Chat) -> dict[str, Any]:
            raise _Died

        builder: StateGraph[Any] = StateGraph(Chat)
        builder.add_node("think", lambda state: {"messages": ["A:think"]})
        builder.add_node("act", act_dies)
        builder.add_edge(START, "think")
        builder.add_edge("think", "act")
        builder.add_edge("act", END)
        with pytest.raises(_Died):
            durable_invoke(builder.compile(checkpointer=saver), {"messages": ["A:user"]}, config, run_id="A")
        graph = _counting_graph(saver, ran)

        def turn(**options: Any) -> Any:
            if mode == "async":
                return asyncio.run(adurable_invoke(graph, {"messages": ["B:user"]}, config, run_id="B", **options))
            return durable_invoke(graph, {"messages": ["B:user"]}, config, run_id="B", **options)

        with pytest.raises(pk.ThreadBusyError) as gave:
            turn(unfinished_timeout=0)
        err = gave.value
        assert err.unfinished_run == "A" and err.retry_after is not None and err.retryable
        assert "unfinished_timeout=0" in str(err) and "err.retry_after" in str(err)
        assert "durable_invoke(graph, None, config, run_id='A')" in str(err)  # the LangGraph remedy
        assert ran == []  # it gave its place back before any node
        durable_invoke(graph, None, config, run_id="A")  # the crashed turn's redelivery goes first
        assert turn(unfinished_timeout=0)["messages"][-3:] == ["B:think", "B:act", "B:reply"]
    with pytest.raises(pk.ConfigurationError, match="unfinished_timeout=0 needs the graph compiled with"):
        durable_invoke(builder.compile(), {"messages": []}, config, unfinished_timeout=0)  # no lease to bound


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_concurrency_two_turns_of_one_key_never_overlap(mode: str) -> None:
    """``durable_invoke(concurrency=)``: two turns of two threads under one key with limit 1
    (two Python threads, or two tasks) run their nodes one after the other (the nodes sleep,
    so without the slot they overlap); the key's slot is free afterwards, and a redelivered
    finished turn returns its result without taking a slot."""
    import asyncio

    gate, running = threading.Lock(), [0, 0]  # now, peak
    key = uid("tenant")
    limit = ("tenant", key, 1)

    def slow(name: str) -> Any:
        def body(state: Chat) -> dict[str, Any]:
            with gate:
                running[0] += 1
                running[1] = max(running)
            time.sleep(0.03)
            with gate:
                running[0] -= 1
            return {"messages": [f"{state['messages'][-1].split(':')[0]}:{name}"]}

        return body

    with PersistkitSaver.from_url(f"memory://{uid('lg-slot')}") as saver:
        builder: StateGraph[Any] = StateGraph(Chat)
        for name in ("think", "reply"):
            builder.add_node(name, slow(name))
        builder.add_edge(START, "think")
        builder.add_edge("think", "reply")
        builder.add_edge("reply", END)
        graph = builder.compile(checkpointer=saver)
        configs: list[Any] = [{"configurable": {"thread_id": uid(f"lg-slot-{i}")}} for i in range(2)]
        outs: list[Any] = []
        if mode == "async":

            async def both() -> None:
                outs.extend(await asyncio.gather(*(
                    adurable_invoke(graph, {"messages": [f"{r}:user"]}, c, run_id=r, concurrency=limit)
                    for r, c in zip("AB", configs, strict=True)
                )))

            asyncio.run(both())
        else:
            workers = [
                threading.Thread(target=lambda r=r, c=c: outs.append(
                    durable_invoke(graph, {"messages": [f"{r}:user"]}, c, run_id=r, concurrency=limit)
                ))
                for r, c in zip("AB", configs, strict=True)
            ]
            for w in workers:
                w.start()
            for w in workers:
                w.join(timeout=60)
        assert sorted(out["messages"][-1] for out in outs) == ["A:reply", "B:reply"]
        assert running == [0, 1]
        info = pk.Concurrency("tenant", key, 1).info(saver.store)
        assert info is not None and info.holders == () and info.waiting == ()
        # a redelivered finished turn replays under busy='reject' while another turn holds the only slot
        with pk.resume(uid("lg-slot-other"), store=saver.store, concurrency=limit):
            again = durable_invoke(graph, {"messages": ["A:user"]}, configs[0], run_id="A", concurrency=limit, busy="reject")
            assert again["messages"][-1] == "A:reply"
            with pytest.raises(pk.ConcurrencyLimitError):
                durable_invoke(graph, {"messages": ["C:user"]}, configs[0], run_id="C", concurrency=limit, busy="reject")
    with pytest.raises(pk.ConfigurationError, match=r"concurrency=.* needs the graph compiled with"):
        durable_invoke(builder.compile(), {"messages": []}, configs[0], concurrency=limit)


def test_run_ids_the_store_cannot_hold_are_refused(pg: str) -> None:
    with PersistkitSaver.from_url(pg) as saver:
        graph = _worker_graph(saver)
        config: Any = {"configurable": {"thread_id": uid("lg")}}
        for bad in ("a\x00b", "x" * 513, "   "):
            with pytest.raises(pk.ConfigurationError, match="run_id="):
                durable_invoke(graph, {"messages": ["A:user"]}, config, run_id=bad)


def test_update_state_records_a_run_id_as_is(store_url: str) -> None:
    """The core part the saver stands on: ``store.update_state(..., run_id=)`` (and its async twin)
    writes the record under that run id, unredacted, found by ``history(run_id=)``."""
    import asyncio

    run_id = LOOKS_SECRET[0]
    with pk.connect(store_url) as store:
        thread = uid("upd")
        store.update_state(thread, {"n": 1}, run_id=run_id, metadata={"note": run_id})
        asyncio.run(store.aupdate_state(thread, {"n": 2}, run_id="B"))
        store.update_state(thread, {"n": 3})
        assert [cp.run_id for cp in store.history(thread)] == [None, "B", run_id]
        (mine,) = store.history(thread, run_id=run_id)
        assert mine.metadata["note"] != run_id  # metadata is still redacted: only the run id is not
        for bad in ("", "a\x00b", "x" * 513, 7):
            with pytest.raises(pk.ConfigurationError, match="run_id"):
                store.update_state(thread, {"n": 4}, run_id=bad)  # type: ignore[arg-type]
