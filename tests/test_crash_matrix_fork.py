"""The crash matrix's fork server (``persistkit.testing._crash_fork.Zygote``): warmed once
with what the uncrashed runs imported, so that no crash run or resume imports it again,
unless warming started a thread (a fork would not copy it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from persistkit.testing._crash_fork import Zygote

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the fork server needs os.fork")


def _exits_with_whether_imported(command: list[Any]) -> None:
    """A child: exit 7 when the module was imported before it ran, 8 when not."""
    os._exit(7 if command[0] in sys.modules else 8)


def _module(root: Path, name: str, body: str) -> str:
    (root / f"{name}.py").write_text(body)
    return name


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _code(status: int) -> int:
    assert os.WIFEXITED(status), status
    return os.WEXITSTATUS(status)


def test_a_warmed_server_forks_children_that_have_the_modules_imported(modules: Path) -> None:
    name = _module(modules, "pk_warm_plain", "VALUE = 1\n")
    zygote = Zygote(_exits_with_whether_imported)
    try:
        assert _code(zygote.call([name], 10)) == 8  # not yet: each child imports it itself
        assert zygote.warm([name, "pk_no_such_module_anywhere"])  # one that fails stays lazy
        assert _code(zygote.call([name], 10)) == 7
        assert _code(zygote.call([name], 10)) == 7  # every child after it, not only the first
    finally:
        zygote.close()
    assert name not in sys.modules  # warming happened in the server, not here


def test_warming_that_starts_a_thread_is_declined_and_the_server_stays_cold(modules: Path) -> None:
    name = _module(
        modules,
        "pk_warm_threaded",
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
    )
    zygote = Zygote(_exits_with_whether_imported)
    try:
        assert not zygote.warm([name])  # its children would lack the thread a fresh process has
        assert _code(zygote.call([name], 10)) == 8  # so each child imports it (and starts it) itself
    finally:
        zygote.close()


def _exits_or_hangs(command: list[Any]) -> None:
    if command[0] == "hang":
        import time

        time.sleep(60)
    os._exit(command[1])


def test_a_batch_runs_children_side_by_side_and_kills_one_past_its_timeout() -> None:
    zygote = Zygote(_exits_or_hangs)
    try:
        statuses = zygote.batch([["exit", 3], ["hang", 0], ["exit", 5], ["exit", 6]], 1.0, 2)
    finally:
        zygote.close()
    assert statuses[1] == -1  # still running after its timeout: killed, the others went on
    assert [_code(statuses[i]) for i in (0, 2, 3)] == [3, 5, 6]


# -- one crash run for every point (process mode on SQLite: _crash_chain) -------------------


def _counted_agent(log: Path, thread: str, threaded: bool = False) -> Any:
    import concurrent.futures
    import contextvars

    import persistkit as pk

    @pk.checkpointed(name="chain.step")
    def step(i: int) -> int:
        with open(log, "a") as f:  # in the step: a body run, counted across processes
            f.write(f"{i}\n")
        return i * 2

    def agent() -> int:
        with pk.resume(thread) as run:
            if threaded:  # the steps run in a worker thread, which a fork does not copy
                with concurrent.futures.ThreadPoolExecutor(1) as pool:
                    run.state["out"] = [pool.submit(contextvars.copy_context().run, step, i).result() for i in range(5)]
            else:
                run.state["out"] = [step(i) for i in range(5)]
            return sum(run.state["out"])

    return agent


@pytest.mark.slow  # process mode (the quick tier leaves it out)
def test_one_crash_run_dies_at_every_point_and_each_resume_sees_what_its_death_left(tmp_path: Path) -> None:
    from conftest import uid

    from persistkit.testing import crash_matrix

    log = tmp_path / "bodies.log"
    result = crash_matrix(
        _counted_agent(log, uid("chain")), mode="process", url="sqlite", directory=str(tmp_path),
        echo=None, other_hash_seed=False,
    )
    assert result.ok and len(result.points) == 15, str(result)
    runs = log.read_text().split()
    # step 0's body: the two uncrashed runs, ONE crash run for all five kills (a crash run
    # per kill ran it five times), and the resume of the kill before its checkpoint landed
    assert runs.count("0") == 4, runs
    assert runs.count("4") == 2 + 1 + 5  # step 4 (the last): and every resume ran it


@pytest.mark.slow  # process mode (the quick tier leaves it out)
def test_steps_in_a_worker_thread_get_a_crash_run_per_point_and_still_pass(tmp_path: Path) -> None:
    from conftest import uid

    from persistkit.testing import crash_matrix

    log = tmp_path / "bodies.log"
    result = crash_matrix(
        _counted_agent(log, uid("chain-threads"), threaded=True), mode="process", url="sqlite",
        directory=str(tmp_path), echo=None, other_hash_seed=False,
    )
    assert result.ok and len(result.points) == 15, str(result)
    # the first kill is in a worker thread: no continuation there, so a crash run per kill
    # (five), the two uncrashed runs and the resume of the first kill ran step 0
    assert log.read_text().split().count("0") == 2 + 5 + 1, log.read_text()
