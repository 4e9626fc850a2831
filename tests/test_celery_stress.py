"""Many turns of a few threads at once on a real queue, with workers SIGKILLed mid-turn (issue #19).

The case as it was found: Celery on RabbitMQ (examples/celery_worker.py: acks_late,
reject_on_worker_lost, ``pk.resume(thread, run_id=turn, busy="queue")``), checkpoints on
PostgreSQL, TURNS turns over THREADS threads sent at once to two workers with a process pool
each. A seeded plan picks victim turns and a point in each (``before-<n>``: n steps committed;
``in-<n>``: step n ran, not committed); the turn pauses there (examples/celery_worker.py's
AGENT_GATE), and the test SIGKILLs the pool process running it, or the whole worker (master and
pool: a node dying) and starts a replacement. Meanwhile the thread's next turns are queued
behind it on the lease. A few turns are delivered twice (a webhook retried by its sender).

Every turn must finish; each thread's state holds each turn's messages exactly once, contiguous
and in step order; the turns of a thread are in the order they ran their first step; every run
ends once, completed; no step body ran twice except the one in flight in a killed process (the
documented at-least-once). ``PK_STRESS_SEED=<n>`` replays a plan (the seed is printed).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SESSION_TAG

import persistkit as pk

ROOT = Path(__file__).resolve().parent.parent
THREADS, TURNS, STEPS = 5, 40, 4  # several turns of each thread in flight together
PROCESS_KILLS, WORKER_KILLS = 6, 2
DUPLICATES = 5  # turns delivered twice (a webhook retried by its sender)
CONCURRENCY = 2  # pool processes per worker
DEADLINE = 240.0  # for everything to settle; a healthy run takes far less


def _group_pids(pgid: int) -> set[int]:
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # state, ppid, pgrp
                pids.add(int(entry))
    return pids


class Workers:
    """Celery workers, each in its own process group, so one can be killed whole."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.live: list[subprocess.Popen[bytes]] = []
        self.killed: set[int] = set()  # every pid we SIGKILLed
        self.started = 0

    def start(self, concurrency: int = CONCURRENCY) -> None:
        self.started += 1
        self.live.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "examples.celery_worker", "worker", "--pool=prefork",
             f"--concurrency={concurrency}", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel=WARNING", "-n", f"w{self.started}-{uuid.uuid4().hex[:6]}@%h"],
            cwd=ROOT, env=self.env, start_new_session=True,
        ))

    def kill_process(self, pid: int) -> None:
        self.killed.add(pid)
        os.kill(pid, signal.SIGKILL)

    def kill_worker_of(self, pid: int, replace: bool = True) -> None:
        """SIGKILL the whole worker running ``pid`` (master and pool) and start a replacement."""
        pgid = os.getpgid(pid)
        [worker] = [w for w in self.live if w.pid == pgid]
        self.killed |= _group_pids(pgid)
        os.killpg(pgid, signal.SIGKILL)
        worker.wait(timeout=30)
        self.live.remove(worker)
        if replace:
            self.start()

    def check(self) -> None:
        dead = [w for w in self.live if w.poll() is not None]
        assert not dead, f"a celery worker exited by itself (exit {dead[0].returncode})"

    def stop(self) -> None:
        for w in self.live:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)  # warm shutdown: the master stops its pool
        for w in self.live:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait(timeout=30)
            for pid in _group_pids(w.pid):  # a pool process its master left behind
                os.kill(pid, signal.SIGKILL)


class Effects:
    """The lines examples/celery_worker.py writes: ``<turn> <what> <words...> <pid>``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def read(self) -> list[list[str]]:
        return [line.split() for line in self.path.read_text().splitlines() if line.strip()]


@pytest.fixture
def env(rabbitmq_url: str, postgres_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    schema = f"pkcels_{SESSION_TAG}"
    queue = f"persistkit-stress-{uuid.uuid4().hex[:10]}"
    yield {
        **os.environ,
        "CELERY_BROKER_URL": rabbitmq_url,
        "CELERY_QUEUE": queue,
        "PERSISTKIT_URL": f"{postgres_url}?schema={schema}",
        "AGENT_EFFECTS": str(tmp_path / "effects"),
        "AGENT_GATE": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    import kombu
    import psycopg

    with kombu.Connection(rabbitmq_url) as conn:
        conn.default_channel.queue_delete(queue)
    with psycopg.connect(postgres_url, autocommit=True) as pg:
        pg.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _plan(seed: int, turns: list[tuple[str, str]]) -> tuple[dict[str, tuple[str, str]], list[tuple[str, str]]]:
    """Victim turn -> (point, "process" | "worker"), and the turns delivered twice, drawn from ``seed``."""
    rng = random.Random(seed)
    victims = rng.sample([turn for _, turn in turns], PROCESS_KILLS + WORKER_KILLS)
    points = [f"before-{n}" for n in range(STEPS)] + [f"in-{n}" for n in range(STEPS)]
    plan = {turn: (rng.choice(points), "worker" if i < WORKER_KILLS else "process") for i, turn in enumerate(victims)}
    return plan, rng.sample(turns, DUPLICATES)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_turns_of_threads_survive_killed_workers_in_order_and_once(env: dict[str, str], tmp_path: Path) -> None:
    seed = int(os.environ.get("PK_STRESS_SEED") or random.randrange(1 << 32))
    print(f"\nPK_STRESS_SEED={seed}: {TURNS} turns over {THREADS} threads, {STEPS} steps each, 2 workers x "
          f"{CONCURRENCY} processes, {PROCESS_KILLS} pool processes and {WORKER_KILLS} workers killed, "
          f"{DUPLICATES} turns delivered twice")
    sys.path.insert(0, str(ROOT))
    from examples.celery_worker import Conversation, app

    app.conf.broker_url = env["CELERY_BROKER_URL"]
    app.conf.task_default_queue = env["CELERY_QUEUE"]
    tag = uuid.uuid4().hex[:6]
    threads = [f"stress-{tag}-{t}" for t in range(THREADS)]
    turns = [(threads[i % THREADS], f"turn-{tag}-{i:02d}") for i in range(TURNS)]  # interleaved threads
    plan, duplicates = _plan(seed, turns)
    deliveries = Counter(turn for _, turn in [*turns, *duplicates])
    for turn, (point, _) in plan.items():
        (tmp_path / f"{turn}@{point}").touch()
    print("plan:", " ".join(f"{turn}@{point}:{kind}" for turn, (point, kind) in sorted(plan.items())),
          "; twice:", " ".join(turn for _, turn in duplicates))

    effects = Effects(Path(env["AGENT_EFFECTS"]))
    workers = Workers(env)
    started = time.monotonic()
    try:
        for _ in range(2):
            workers.start()
        with app.producer_or_acquire() as producer:
            for thread, turn in [*turns, *duplicates]:
                app.send_task("agent_turn", args=[thread, f"message {turn}", turn, STEPS], producer=producer)

        pending = dict(plan)
        deadline = time.monotonic() + DEADLINE
        while True:
            lines = effects.read()
            done = Counter(w[0] for w in lines if w[1] == "done")
            settled = {turn for turn, n in deliveries.items() if done[turn] >= n}
            settled |= {w[0] for w in lines if w[1] == "failed"}
            if settled >= {turn for _, turn in turns} and not pending:
                break
            for w in lines:
                if w[1] == "gate" and w[0] in pending and pending[w[0]][0] == w[2]:
                    turn, pid = w[0], int(w[-1])
                    if pid in workers.killed:
                        # a stale line: the process paused here died with a worker killed for
                        # another turn; the redelivery pauses at the same point again
                        continue
                    _, kind = pending.pop(turn)
                    if kind == "process":
                        workers.kill_process(pid)
                    else:
                        workers.kill_worker_of(pid)
                    (tmp_path / f"{turn}@{plan[turn][0]}.go").touch()  # its redelivery goes through
            workers.check()
            if time.monotonic() > deadline:
                missing = sorted({turn for _, turn in turns} - settled)
                pytest.fail(f"seed {seed}: turns {missing} never finished nor failed; victims not yet reached: "
                            f"{sorted(pending)}; the last effects: {lines[-10:]}")
            time.sleep(0.05)
        elapsed = time.monotonic() - started
    finally:
        workers.stop()
    print(f"settled in {elapsed:.1f} s; {workers.started} workers started, {len(workers.killed)} processes killed")

    lines = effects.read()
    failed = [(w[0], w[2]) for w in lines if w[1] == "failed"]
    assert not failed, f"seed {seed}: turns acked as failed (lost): {failed}"
    retried = [(w[0], w[2]) for w in lines if w[1] == "retry"]
    print(f"retries: {retried}")

    # No turn ran twice: its other deliveries (a duplicate, a redelivery after it ended) replayed it.
    ran = Counter(w[0] for w in lines if w[1] == "done" and w[2] == "ran")
    assert max(ran.values()) <= 1, f"seed {seed}: turns that ran more than once: {ran.most_common(3)}"

    # No step body ran twice, except the one in flight in a process we killed.
    runs: dict[tuple[str, int], list[int]] = defaultdict(list)
    for w in lines:
        if w[1] == "step":
            runs[w[0], int(w[2])].append(int(w[-1]))
    again = {key: pids for key, pids in runs.items() if any(p not in workers.killed for p in pids[:-1])}
    assert not again, f"seed {seed}: step bodies ran again after a run that was not killed: {again}"
    assert set(runs) == {(turn, n) for _, turn in turns for n in range(STEPS)}

    store = pk.connect(env["PERSISTKIT_URL"])
    try:
        for thread in threads:
            mine = [turn for t, turn in turns if t == thread]
            messages = store.get_state(thread, state=Conversation).messages
            _check_thread(seed, thread, mine, messages, lines)
            ends = [c for c in store.history(thread) if c.kind == "end"]
            assert sorted(c.run_id for c in ends) == sorted(mine), f"seed {seed}: {thread}: one end per turn"
            assert {c.run_status for c in ends} == {"completed"}
    finally:
        store.close()


def _check_thread(seed: int, thread: str, mine: list[str], messages: list[dict[str, Any]],
                  lines: list[list[str]], steps: int = STEPS) -> None:
    # Each turn's messages exactly once, contiguous, in step order.
    order = []
    for m in messages:
        if not order or order[-1] != m["turn"]:
            order.append(m["turn"])
    assert sorted(order) == sorted(mine), (
        f"seed {seed}: {thread}: a turn is missing, duplicated or split: turns in the state {order}")
    want = {turn: [("user", None), *(("assistant", n) for n in range(steps))] for turn in mine}
    got: dict[str, list[tuple[str, int | None]]] = defaultdict(list)
    for m in messages:
        got[m["turn"]].append((m["role"], m.get("step")))
    assert got == want, f"seed {seed}: {thread}: a turn's messages are not user + steps 0..{steps - 1} once"

    # Turns follow in the order they ran their step 0, for the turns whose step 0 ran once (a turn
    # whose step 0 ran twice has an uncommitted first try: it may have lost its place then).
    once = [turn for turn in mine
            if sum(1 for w in lines if w[0] == turn and w[1] == "step" and w[2] == "0") == 1]
    first_step = [w[0] for w in lines if w[1] == "step" and w[2] == "0" and w[0] in once]
    assert [t for t in order if t in once] == first_step, (
        f"seed {seed}: {thread}: turns are not in the order they started: state {order}, started {first_step}")


# -- outages (issue #34, 3b) --------------------------------------------------------------------
#
# Two sequences found from outside with a private PostgreSQL restarted under the recipe. Each sends a
# few turns of two threads and pauses some at a point (AGENT_GATE), then breaks something and checks
# that every turn finishes once, in order per thread, with no turn acked as failed.

OUTAGE_STEPS = 4
SETTLE = 120.0  # generous; a healthy run settles in a fraction of it, and stays below busy_timeout


class PrivatePostgres:
    """A PostgreSQL server of this test alone (initdb + pg_ctl on a free port in a temp dir), so
    that it can be stopped and started while the shared one keeps serving the other tests."""

    def __init__(self, bindir: Path, root: Path, user: str | None) -> None:
        from conftest import _free_port

        self.bindir, self.root, self.user = bindir, root, user
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self.bindir / tool), *args]
        if self.user is not None:  # initdb and postgres refuse to run as root
            argv = ["runuser", "-u", self.user, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if done.returncode:
            log = self.root / "log"
            raise RuntimeError(f"{tool} {' '.join(args)} failed: {done.stderr.strip()} "
                               f"{log.read_text()[-2000:] if log.exists() else ''}")

    def init(self) -> None:
        self._run("initdb", "-D", str(self.root / "data"), "-A", "trust", "-U", "postgres", "--no-sync",
                  "-E", "UTF8")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.root / "data"), "-o", options, "-l", str(self.root / "log"), "-w", "start")

    def crash(self) -> None:
        """Stop at once, as a crash would (no shutdown checkpoint; connections are cut)."""
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    import glob
    import shutil
    import tempfile

    from conftest import unavailable

    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb")) or [shutil.which("initdb") or ""]
    bindir = Path(found[-1]).parent
    if not found[-1] or not (bindir / "pg_ctl").exists():
        unavailable("postgres", "no initdb/pg_ctl to start a private PostgreSQL (apt-get install postgresql)")
    user = None
    root = Path(tempfile.mkdtemp(prefix="pk-private-pg-"))  # not under pytest's tmp: its user must reach it
    if os.geteuid() == 0:
        import pwd

        try:
            entry = pwd.getpwnam("postgres")
        except KeyError:
            unavailable("postgres", "running as root with no 'postgres' user to run a private PostgreSQL as")
        user = "postgres"
        os.chown(root, entry.pw_uid, entry.pw_gid)
    server = PrivatePostgres(bindir, root, user)
    try:
        server.init()
        server.start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        unavailable("postgres", f"cannot start a private PostgreSQL: {exc}")
    yield server
    with contextlib.suppress(RuntimeError):  # stopped already
        server.crash()
    shutil.rmtree(root, ignore_errors=True)


def _outage_env(env: dict[str, str], url: str) -> dict[str, str]:
    return {**env, "PERSISTKIT_URL": url}


def _send(env: dict[str, str], turns: list[tuple[str, str]]) -> None:
    from examples.celery_worker import app

    app.conf.broker_url = env["CELERY_BROKER_URL"]
    app.conf.task_default_queue = env["CELERY_QUEUE"]
    with app.producer_or_acquire() as producer:
        for thread, turn in turns:
            app.send_task("agent_turn", args=[thread, f"message {turn}", turn, OUTAGE_STEPS], producer=producer)


def _until(effects: Effects, workers: Workers, what: str, check: Callable[[list[list[str]]], bool],
           bound: float = SETTLE) -> list[list[str]]:
    deadline = time.monotonic() + bound
    while True:
        lines = effects.read()
        failed = [w for w in lines if w[1] == "failed"]
        assert not failed, f"turns acked as failed (lost) while waiting for {what}: {failed}"
        if check(lines):
            return lines
        workers.check()
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {bound} s; the last effects: {lines[-12:]}")
        time.sleep(0.05)


def _all_done(turns: list[tuple[str, str]]) -> Callable[[list[list[str]]], bool]:
    return lambda lines: {turn for _, turn in turns} <= {w[0] for w in lines if w[1] == "done"}


def _check_outage(url: str, threads: list[str], turns: list[tuple[str, str]], lines: list[list[str]],
                  killed: set[int], in_flight: set[tuple[str, int]]) -> None:
    """Every turn ran once and ended once, completed; each thread holds each turn's messages once,
    together and in step order, turns in the order they started; no step body ran twice except the
    one in flight in a killed process or when the store went away (``in_flight``); no turn waited
    until busy_timeout (each one waiting for a crashed turn gave its process back instead)."""
    assert not [w for w in lines if w[1] == "failed"]
    expired = [w for w in lines if w[1] == "retry" and w[2] == "ThreadBusyError" and w[3] != "gave-way"]
    assert not expired, f"turns waited until busy_timeout: {expired}"
    ran = Counter(w[0] for w in lines if w[1] == "done" and w[2] == "ran")
    assert max(ran.values()) == 1, f"turns that ran more than once: {ran.most_common(3)}"
    runs: dict[tuple[str, int], list[int]] = defaultdict(list)
    for w in lines:
        if w[1] == "step":
            runs[w[0], int(w[2])].append(int(w[-1]))
    again = {key: pids for key, pids in runs.items()
             if key not in in_flight and any(p not in killed for p in pids[:-1])}
    assert not again, f"step bodies ran again after a run that was not killed: {again}"
    assert set(runs) == {(turn, n) for _, turn in turns for n in range(OUTAGE_STEPS)}
    from examples.celery_worker import Conversation

    store = pk.connect(url)
    try:
        for thread in threads:
            mine = [turn for t, turn in turns if t == thread]
            messages = store.get_state(thread, state=Conversation).messages
            _check_thread(0, thread, mine, messages, lines, OUTAGE_STEPS)
            ends = [c for c in store.history(thread) if c.kind == "end"]
            assert sorted(str(c.run_id) for c in ends) == sorted(mine), f"{thread}: one end per turn"
            assert {c.run_status for c in ends} == {"completed"}
    finally:
        store.close()


def _gate_reached(turn: str, point: str) -> Callable[[list[list[str]]], bool]:
    return lambda lines: any(w[:3] == [turn, "gate", point] for w in lines)


def _pid_at(lines: list[list[str]], turn: str, point: str) -> int:
    return int(next(w for w in lines if w[:3] == [turn, "gate", point])[-1])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_restarted_while_postgres_is_down_loses_no_turn(
        env: dict[str, str], tmp_path: Path, private_postgres: PrivatePostgres) -> None:
    """PostgreSQL crashes under two turns with committed steps: one is in a step (its commit fails),
    the other's worker dies whole and a replacement starts while PostgreSQL is still down, so its
    first connect is refused. The later turns of both threads wait. Once PostgreSQL is back every
    turn finishes, none acked as failed (before: the refused connect was not retryable and the turn
    was lost, and its thread's next turns waited for it until abandon)."""
    sys.path.insert(0, str(ROOT))
    env = _outage_env(env, private_postgres.url)
    tag = uuid.uuid4().hex[:6]
    a, b = f"outage-{tag}-a", f"outage-{tag}-b"
    turns = [(a, f"o-{tag}-a0"), (b, f"o-{tag}-b0"), (a, f"o-{tag}-a1"), (b, f"o-{tag}-b1"), (a, f"o-{tag}-a2")]
    a0, b0 = turns[0][1], turns[1][1]
    (tmp_path / f"{a0}@before-2").touch()  # two steps committed, the third not begun
    (tmp_path / f"{b0}@in-1").touch()  # step 1 ran, its commit not made yet
    effects = Effects(Path(env["AGENT_EFFECTS"]))
    workers = Workers(env)
    try:
        workers.start()
        _send(env, turns[:2])
        lines = _until(effects, workers, "both turns at their points",
                       lambda ls: _gate_reached(a0, "before-2")(ls) and _gate_reached(b0, "in-1")(ls))
        _send(env, turns[2:])  # the later turns: in the broker (both processes are taken)
        private_postgres.crash()
        (tmp_path / f"{b0}@in-1.go").touch()  # its commit meets the outage: retried, not failed
        _until(effects, workers, f"{b0} retried", lambda ls: any(w[:2] == [b0, "retry"] for w in ls))
        workers.kill_worker_of(_pid_at(lines, a0, "before-2"), replace=False)
        (tmp_path / f"{a0}@before-2.go").touch()  # its redelivery goes through
        workers.start()  # PostgreSQL is still down: its first connect is refused
        fresh = workers.live[-1].pid

        def refused_in_the_new_worker(ls: list[list[str]]) -> bool:
            pids = _group_pids(fresh)
            return any(w[1] == "retry" and w[2] == "BackendUnavailableError" and int(w[-1]) in pids for w in ls)

        _until(effects, workers, "a turn refused in the restarted worker and retried", refused_in_the_new_worker)
        private_postgres.start()
        lines = _until(effects, workers, "every turn done", _all_done(turns))
    finally:
        workers.stop()
    _check_outage(private_postgres.url, [a, b], turns, lines, workers.killed, {(b0, 1)})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_turns_waiting_for_a_crashed_turn_give_its_redelivery_a_pool_process(
        env: dict[str, str], tmp_path: Path) -> None:
    """A worker dies in a turn with committed steps while more later turns of its thread wait than
    the surviving worker has pool processes. The redelivery must not wait behind them for a
    process: the waiting turns give theirs back (``unfinished_timeout``) and retry after
    ``retry_after``. Before, they waited in every process until ``busy_timeout`` (120 s)."""
    sys.path.insert(0, str(ROOT))
    tag = uuid.uuid4().hex[:6]
    thread = f"starve-{tag}"
    turns = [(thread, f"s-{tag}-{i}") for i in range(6)]  # one crashed turn, five waiting turns
    first = turns[0][1]
    (tmp_path / f"{first}@before-2").touch()
    effects = Effects(Path(env["AGENT_EFFECTS"]))
    workers = Workers(env)
    try:
        workers.start()
        workers.start()
        _send(env, turns[:1])
        lines = _until(effects, workers, "the first turn at its point", _gate_reached(first, "before-2"))
        _send(env, turns[1:])
        store = pk.connect(env["PERSISTKIT_URL"])
        try:  # every other pool process waits on the thread's lease
            _until(effects, workers, "three turns waiting on the lease",
                   lambda _: sum(len(lease.waiting) for lease in store.leases(prefix=thread)) >= 3)
        finally:
            store.close()
        workers.kill_worker_of(_pid_at(lines, first, "before-2"), replace=False)
        (tmp_path / f"{first}@before-2.go").touch()
        lines = _until(effects, workers, "every turn done", _all_done(turns), bound=SETTLE / 2)
    finally:
        workers.stop()
    assert [w for w in lines if w[1:3] == ["retry", "ThreadBusyError"]], f"no turn gave its process back: {lines}"
    _check_outage(env["PERSISTKIT_URL"], [thread], turns, lines, workers.killed, set())
