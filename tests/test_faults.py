"""Faults under a running agent: server connections killed mid-run, many writers on one thread.

The backend-level fault tests live next to each backend (test_postgres.py,
test_redis.py); these check the promise users rely on: the run continues
after the retry, and nothing committed is lost or duplicated.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import make_url, uid

import persistkit as pk

HERE = Path(__file__).resolve().parent


def _agent(store: pk.Store, tid: str, kill: Any, at: set[int]) -> list[int]:
    side_effects: list[int] = []

    @pk.checkpointed(name="work")
    def work(i: int) -> int:
        side_effects.append(i)
        if i in at:
            kill()  # the connection dies between this step's side effect and its commit
        run = pk.current_run()
        assert run is not None
        run.state.setdefault("done", []).append(i)
        return i

    with pk.resume(tid, store=store) as run:
        results = [work(i) for i in range(12)]
    assert run.status == "completed"
    assert results == list(range(12))
    return side_effects


def _check_history(store: pk.Store, tid: str) -> None:
    steps = [c for c in store.history(tid) if c.kind == "step"]
    assert sorted(int(c.position or -1) for c in steps) == list(range(12))  # each exactly once
    assert store.get_state(tid) == {"done": list(range(12))}


def test_postgres_connection_terminated_mid_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    import psycopg

    app = f"pkfault-{uuid.uuid4().hex[:8]}"
    url = make_url("postgres", request, tmp_path_factory) + f"&application_name={app}"
    admin_url = request.getfixturevalue("postgres_url")
    store = pk.connect(url)

    def kill() -> None:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                (app,),
            ).fetchone()
        assert killed is not None and killed[0] >= 1

    tid = uid("pgfault")
    assert _agent(store, tid, kill, {3, 7}) == list(range(12))
    _check_history(store, tid)
    store.close()


def test_redis_client_killed_mid_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    import redis

    name = f"pkfault-{uuid.uuid4().hex[:8]}"
    url = make_url("redis", request, tmp_path_factory) + f"&client_name={name}"
    admin = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    store = pk.connect(url)

    def kill() -> None:
        ids = [c["id"] for c in admin.client_list() if c.get("name") == name]
        assert ids, "the store's connections carry the client name"
        for cid in ids:
            admin.client_kill_filter(_id=cid)

    tid = uid("redisfault")
    assert _agent(store, tid, kill, {2, 9}) == list(range(12))
    _check_history(store, tid)
    store.close()
    admin.close()


WRITER = """
import sys
sys.path.insert(0, {tests!r})
import persistkit as pk
from crash_agent import Log
store = pk.connect({url!r})
for _ in range({n}):
    while True:
        try:
            store.update_state({tid!r}, {{"total": 1, "items": [1]}}, state=Log)
            break
        except pk.ConflictError:
            pass
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sqlite", "postgres", "redis"])
def test_many_processes_update_one_thread(kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
    url = make_url(kind, request, tmp_path_factory)
    tid, procs, n = uid("writers"), 4, 15
    script = WRITER.format(tests=str(HERE), url=url, n=n, tid=tid)
    running = [subprocess.Popen([sys.executable, "-c", script]) for _ in range(procs)]
    assert all(p.wait(timeout=120) == 0 for p in running)
    sys.path.insert(0, str(HERE))
    from crash_agent import Log

    store = pk.connect(url)
    state = store.get_state(tid, state=Log)
    assert state.total == procs * n and len(state.items) == procs * n  # no lost update
    assert len(store.history(tid)) == procs * n
    store.close()
