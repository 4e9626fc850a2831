"""The RQ, Dramatiq and arq recipes of docs/coordination.md ("The same recipe on other queues"), run.

Each recipe runs in a real worker process of its queue, on Redis, with checkpoints in a SQLite
file. The test holds the turn's thread (another process is inside ``pk.resume`` of it) for a few
seconds; the turn, waiting with a short ``busy_timeout``, gets ``pk.ThreadBusyError`` — a
``pk.RetryableError`` — and the recipe must retry it, not fail it: once the thread is free a retry
runs the turn, every step once, and the queue records no failed job.

The worker imports this module: the recipes read their settings from the environment
(``QUEUE_*``). Needs ``pip install 'persistkit[queues]'`` (rq, dramatiq, arq).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import unavailable

import persistkit as pk

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STEPS = 3
QUEUE = os.environ.get("QUEUE_NAME", "persistkit-recipes")
REDIS = os.environ.get("QUEUE_REDIS_URL", "redis://127.0.0.1:6379/0")
BUSY_TIMEOUT = float(os.environ.get("QUEUE_BUSY_TIMEOUT", "120"))

try:
    import rq
    from rq import Callback, Queue, Retry, get_current_job
except ImportError:
    rq = None
try:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker
except ImportError:
    dramatiq = None
try:
    import arq
    from arq.connections import RedisSettings
except ImportError:
    arq = None


# -- what a turn does (shared by the three recipes) ----------------------------------------------


def _store() -> pk.Store:
    return pk.connect(os.environ.get("QUEUE_STORE", "memory://"))


def _effect(*words: object) -> None:
    with open(os.environ["QUEUE_EFFECTS"], "a") as f:
        f.write(" ".join(str(w) for w in words) + "\n")


@pk.checkpointed(name="recipe.think")
def think(turn_id: str, n: int) -> str:
    _effect(turn_id, "step", n)
    return f"thought {n}"


@pk.checkpointed(name="recipe.athink")
async def athink(turn_id: str, n: int) -> str:
    _effect(turn_id, "step", n)
    return f"thought {n}"


# -- RQ ----------------------------------------------------------------------------------------


def enqueue_turn(queue: Any, thread_id: str, message: str, turn_id: str, attempt: int = 0,
                 delay: float = 0) -> Any:
    """The RQ recipe: ``Retry`` covers a killed work-horse, an abandoned job and any failure."""
    options = dict(retry=Retry(max=3, interval=[1, 10, 60]), on_failure=Callback(turn_failed),
                   job_id=f"{turn_id}-{attempt}")
    if delay:
        return queue.enqueue_in(timedelta(seconds=delay), rq_agent_turn, thread_id, message, turn_id, attempt,
                                **options)
    return queue.enqueue(rq_agent_turn, thread_id, message, turn_id, attempt, **options)


def rq_agent_turn(thread_id: str, message: str, turn_id: str, attempt: int = 0) -> None:
    try:
        with pk.resume(thread_id, store=_store(), run_id=turn_id, busy="queue", busy_timeout=BUSY_TIMEOUT,
                       unfinished_timeout=2):
            for n in range(STEPS):
                think(turn_id, n)
    except pk.RetryableError as exc:  # not a failure: the same turn again, later
        _effect(turn_id, "retry", type(exc).__name__)
        job = get_current_job()
        assert job is not None
        enqueue_turn(Queue(job.origin, connection=job.connection), thread_id, message, turn_id,
                     attempt + 1, delay=exc.retry_after or min(2**attempt, 60))
        return
    _effect(turn_id, "done")


def turn_failed(job: Any, connection: Any, type: Any, value: BaseException, traceback: Any) -> None:
    _effect(job.args[2], "failed", type.__name__)


# -- Dramatiq ----------------------------------------------------------------------------------


def retry_turn(retries: int, exc: BaseException) -> bool:
    """Dramatiq's ``retry_when``: a retryable error always (raised, or as the ``dramatiq.Retry``
    of a turn that gave its worker back after ``retry_after``), any other error 3 times."""
    cause = exc.__cause__ if dramatiq is not None and isinstance(exc, dramatiq.Retry) else exc
    if isinstance(cause, pk.RetryableError):
        _effect(cause.thread_id if isinstance(cause, pk.ThreadBusyError) else "?", "retry", type(cause).__name__)
        return True
    return retries < 3


if dramatiq is not None:
    dramatiq.set_broker(RedisBroker(url=REDIS, namespace=f"dramatiq-{QUEUE}"))

    @dramatiq.actor(queue_name=QUEUE, retry_when=retry_turn, throws=(pk.RunAbandonedError,),
                    min_backoff=1_000, max_backoff=60_000)
    def dramatiq_agent_turn(thread_id: str, message: str, turn_id: str) -> None:
        try:
            with pk.resume(thread_id, store=_store(), run_id=turn_id, busy="queue", busy_timeout=BUSY_TIMEOUT,
                           unfinished_timeout=2):
                for n in range(STEPS):
                    think(turn_id, n)
        except pk.RetryableError as exc:
            if exc.retry_after is None:
                raise  # retry_when: the backoff
            raise dramatiq.Retry(str(exc), delay=int(exc.retry_after * 1000)) from exc  # gave its worker back
        _effect(turn_id, "done")


# -- arq ---------------------------------------------------------------------------------------


async def arq_agent_turn(ctx: dict[str, Any], thread_id: str, message: str, turn_id: str) -> None:
    try:
        async with pk.resume(thread_id, store=_store(), run_id=turn_id, busy="queue", busy_timeout=BUSY_TIMEOUT,
                             unfinished_timeout=2):
            for n in range(STEPS):
                await athink(turn_id, n)
    except pk.RetryableError as exc:
        _effect(turn_id, "retry", type(exc).__name__)
        raise arq.Retry(defer=exc.retry_after or min(2 ** ctx["job_try"], 60)) from exc
    _effect(turn_id, "done")


if arq is not None:
    class WorkerSettings:
        functions = [arq.func(arq_agent_turn, name="agent_turn", max_tries=1_000)]
        redis_settings = RedisSettings.from_dsn(REDIS)
        queue_name = QUEUE
        burst = True


# -- the tests ---------------------------------------------------------------------------------

HOLD = """
import sys, time, persistkit as pk
with pk.resume(sys.argv[2], store=pk.connect(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


class Case:
    def __init__(self, tmp_path: Path, redis_url: str) -> None:
        self.tag = uuid.uuid4().hex[:10]
        self.thread, self.turn = f"recipe-{self.tag}", f"turn-{self.tag}"
        self.effects = tmp_path / "effects"
        self.effects.touch()
        self.store_url = f"sqlite:///{tmp_path}/turns.db"
        self.redis_url = redis_url
        self.env = {
            **os.environ,
            "QUEUE_NAME": f"pk-recipes-{self.tag}",
            "QUEUE_REDIS_URL": redis_url,
            "QUEUE_BUSY_TIMEOUT": "0.5",
            "QUEUE_STORE": self.store_url,
            "QUEUE_EFFECTS": str(self.effects),
            "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.procs: list[subprocess.Popen[bytes]] = []

    def hold_thread(self, seconds: float) -> None:
        """Another process runs the thread for ``seconds``: the turn finds it busy."""
        holder = subprocess.Popen([sys.executable, "-c", HOLD, self.store_url, self.thread, str(seconds)],
                                  env=self.env, stdout=subprocess.PIPE)
        self.procs.append(holder)
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"

    def start(self, *argv: str) -> None:
        self.procs.append(subprocess.Popen(list(argv), cwd=HERE, env=self.env))

    def lines(self) -> list[list[str]]:
        return [line.split() for line in self.effects.read_text().splitlines()]

    def wait_done(self, what: str) -> None:
        deadline = time.monotonic() + 120
        while not any(w[:2] == [self.turn, "done"] for w in self.lines()):
            assert time.monotonic() < deadline, f"{what}: the turn never finished: {self.lines()}"
            assert not [w for w in self.lines() if w[1] == "failed"], f"{what}: failed: {self.lines()}"
            time.sleep(0.1)

    def check(self, what: str) -> None:
        lines = self.lines()
        assert [w for w in lines if w[1] == "retry"], f"{what}: the turn was never refused and retried: {lines}"
        assert all(w[2] == "ThreadBusyError" for w in lines if w[1] == "retry")
        assert not [w for w in lines if w[1] == "failed"]
        assert [int(w[2]) for w in lines if w[1] == "step"] == list(range(STEPS))  # every step once
        store = pk.connect(self.store_url)
        ends = [c for c in store.history(self.thread) if c.kind == "end" and c.run_id == self.turn]
        assert len(ends) == 1 and ends[0].run_status == "completed"
        store.close()

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def cleanup_redis(self) -> None:
        import redis

        client = redis.Redis.from_url(self.redis_url)
        keys = list(client.scan_iter(match=f"*{self.tag}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture
def case(redis_url: str, tmp_path: Path) -> Iterator[Case]:
    c = Case(tmp_path, redis_url)
    yield c
    c.stop()
    c.cleanup_redis()


def _need(module: Any, name: str) -> None:
    if module is None:
        unavailable("queues", f"{name} is not installed: pip install 'persistkit[queues]'")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rq_recipe_retries_a_busy_thread_and_finishes_the_turn(case: Case) -> None:
    _need(rq, "rq")
    from redis import Redis

    case.hold_thread(3)
    connection = Redis.from_url(case.redis_url)
    queue = Queue(case.env["QUEUE_NAME"], connection=connection)
    enqueue_turn(queue, case.thread, "hello", case.turn)
    case.start(sys.executable, "-m", "rq.cli", "worker", "--url", case.redis_url, "--with-scheduler",
               "--name", f"w-{case.tag}", case.env["QUEUE_NAME"])
    case.wait_done("rq")
    case.check("rq")
    assert queue.failed_job_registry.count == 0
    connection.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dramatiq_recipe_retries_a_busy_thread_and_finishes_the_turn(case: Case) -> None:
    _need(dramatiq, "dramatiq")
    case.hold_thread(3)
    broker = RedisBroker(url=case.redis_url, namespace=f"dramatiq-{case.env['QUEUE_NAME']}")
    message = dramatiq.Message(queue_name=case.env["QUEUE_NAME"], actor_name="dramatiq_agent_turn",
                               args=(case.thread, "hello", case.turn), kwargs={}, options={})
    broker.enqueue(message)
    case.start(sys.executable, "-m", "dramatiq", "test_queue_recipes", "--processes", "1", "--threads", "1")
    case.wait_done("dramatiq")
    case.check("dramatiq")
    broker.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_arq_recipe_retries_a_busy_thread_and_finishes_the_turn(case: Case) -> None:
    _need(arq, "arq")
    case.hold_thread(3)

    async def enqueue() -> None:
        pool = await arq.create_pool(RedisSettings.from_dsn(case.redis_url))
        job = await pool.enqueue_job("agent_turn", case.thread, "hello", case.turn, _job_id=case.turn,
                                     _queue_name=case.env["QUEUE_NAME"])
        assert job is not None
        again = await pool.enqueue_job("agent_turn", case.thread, "hello", case.turn, _job_id=case.turn,
                                       _queue_name=case.env["QUEUE_NAME"])
        assert again is None  # the duplicated event is dropped at the door
        await pool.aclose()

    asyncio.run(enqueue())
    case.start(sys.executable, "-c", "from arq.cli import cli; cli()", "test_queue_recipes.WorkerSettings")
    case.wait_done("arq")
    case.check("arq")


def test_the_dramatiq_predicate_retries_retryable_errors_forever_and_others_three_times(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUEUE_EFFECTS", str(tmp_path / "effects"))
    busy = pk.ThreadBusyError("busy", thread_id="t")
    retry_when: Callable[[int, BaseException], bool] = retry_turn
    assert retry_when(10_000, busy) and busy.retryable
    conflict = pk.ConflictError(thread_id="t")
    assert not conflict.retryable
    assert [retry_when(n, conflict) for n in range(5)] == [True, True, True, False, False]
    if dramatiq is not None:  # a turn that gave its worker back: retried after its retry_after, for ever
        gave = pk.ThreadBusyError("gave way", thread_id="t", unfinished_run="r", retry_after=1.5)
        try:
            raise dramatiq.Retry(str(gave), delay=1500) from gave
        except dramatiq.Retry as retry:
            assert retry_when(10_000, retry) and retry.delay == 1500
        assert not retry_when(10_000, dramatiq.Retry("not ours"))
