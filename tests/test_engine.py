"""Engine behaviour that does not depend on the backend: storage model, change tracking, API edges."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import pytest
from conftest import uid

import persistkit as pk
from persistkit.backends import Backend, CheckpointRow, Head
from persistkit.backends.memory import MemoryBackend

ROOT = Path(__file__).resolve().parent.parent


class Counting(MemoryBackend):
    """A memory backend that records how many bytes each write carries."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[int] = []

    def write(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int) -> Head:
        self.writes.append(len(row.payload) + sum(len(b) for b in blobs.values()))
        return super().write(row, blobs, expected_version)

    # Runs commit through write_fenced under their lease (it no longer calls write).
    def write_fenced(self, row: CheckpointRow, blobs: Mapping[str, bytes], expected_version: int, fence: int) -> Head:
        self.writes.append(len(row.payload) + sum(len(b) for b in blobs.values()))
        return super().write_fenced(row, blobs, expected_version, fence)


def counting_store() -> tuple[pk.Store, Counting]:
    backend = Counting()
    return pk.connect(backend), backend


class Log(pk.State):
    messages: Annotated[list[dict[str, str]], pk.append] = []
    counter: int = 0


@pk.checkpointed
def noop(i: int) -> int:
    return i


def test_append_to_a_big_history_writes_only_the_new_item() -> None:
    store, backend = counting_store()
    tid = uid()
    big = [{"role": "user", "content": os.urandom(512).hex()} for _ in range(5000)]  # ~5 MB
    with pk.resume(tid, store=store, state=Log) as run:
        run.state.messages.extend(big)
        noop(0)
        for i in range(1, 6):
            run.state.messages.append({"role": "assistant", "content": os.urandom(512).hex()})
            noop(i)
    first, rest = backend.writes[0], backend.writes[1:-1]
    assert first > 2_500_000  # 5 MB of hex text, compressed
    assert all(w < 1024 + 700 for w in rest), rest  # 1 KB item + record overhead, not 5 MB
    with pk.resume(tid, store=store, state=Log) as run:
        assert len(run.state.messages) == 5005


def test_unchanged_channels_cost_nothing() -> None:
    store, backend = counting_store()
    with pk.resume(uid(), store=store) as run:
        run.state["doc"] = os.urandom(50_000).hex()
        noop(0)
        noop(1)
        run.state["doc"] += "!"
        noop(2)
    assert backend.writes[0] > 50_000 > 1000 > backend.writes[1]
    assert backend.writes[2] > 50_000


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.__setitem__(0, {"role": "x"}),
        lambda m: m.pop(0),
        lambda m: m.insert(0, {"role": "x"}),
        lambda m: m.sort(key=lambda d: d["role"], reverse=True),
        lambda m: m[-1].update(role="edited in place"),
        lambda m: m[-1].update(tone="added in place"),
        lambda m: m[-1].pop("role"),
        lambda m: m.clear(),
    ],
)
def test_any_change_to_a_list_is_stored(local_store: pk.Store, edit: Any) -> None:
    tid = uid()
    with pk.resume(tid, store=local_store, state=Log) as run:
        for i in range(3):
            run.state.messages.append({"role": f"r{i}"})
            noop(i)
        edit(run.state.messages)
        noop(3)
        expected = [dict(m) for m in run.state.messages]
    assert local_store.get_state(tid, state=Log).messages == expected
    with pk.resume(tid, store=local_store, state=Log) as run:
        run.state.messages.append({"role": "after"})
        noop(0)
    assert local_store.get_state(tid, state=Log).messages == [*expected, {"role": "after"}]


def test_reassigned_plain_list_is_stored(local_store: pk.Store) -> None:
    tid = uid()
    with pk.resume(tid, store=local_store) as run:
        run.state["items"] = [1, 2]
        noop(0)
        run.state["items"] = [*run.state["items"], 3]
        noop(1)
        run.state["items"] = [9]
        noop(2)
    assert local_store.get_state(tid) == {"items": [9]}
    steps = [c for c in reversed(local_store.history(tid)) if c.kind == "step"]
    assert [local_store.get_state(tid, c.checkpoint_id)["items"] for c in steps] == [[1, 2], [1, 2, 3], [9]]


def test_replay_restores_state_in_place(local_store: pk.Store) -> None:
    """A reference to a state list taken before replay keeps seeing the live list."""
    tid = uid()
    seen: list[int] = []

    @pk.checkpointed
    def add(i: int) -> None:
        seen.append(i)
        if i == 3 and seen.count(3) == 1:
            raise RuntimeError("crash")

    for _ in range(2):
        try:
            with pk.resume(tid, store=local_store, state=Log) as run:
                msgs = run.state.messages
                for i in range(5):
                    add(i)
                    msgs.append({"role": str(i)})
        except RuntimeError:
            pass
    assert [m["role"] for m in local_store.get_state(tid, state=Log).messages] == ["0", "1", "2", "3", "4"]
    assert seen == [0, 1, 2, 3, 3, 4]


def test_dict_state_and_initial_instance(local_store: pk.Store) -> None:
    tid = uid()
    with pk.resume(tid, store=local_store, state=Log(counter=41)) as run:
        run.state.counter += 1
        noop(0)
    with pk.resume(tid, store=local_store, state=Log(counter=0)) as run:
        assert run.state.counter == 42  # the instance only seeds a new thread
    assert local_store.get_state(tid) == {"messages": [], "counter": 42}


def test_step_signature_and_validation() -> None:
    assert noop.__name__ == "noop" and noop(3) == 3
    with pytest.raises(TypeError, match="generator"):

        @pk.checkpointed
        def gen() -> Any:
            yield 1

    with pytest.raises(TypeError, match="generator"):

        @pk.checkpointed
        async def agen() -> Any:
            yield 1

    with pytest.raises(pk.ConfigurationError):
        pk.checkpointed(name="")
    with pytest.raises(pk.ConfigurationError):
        pk.checkpointed(retry=3)  # type: ignore[call-overload]
    for bad in ({"attempts": 0}, {"timeout": -1}, {"on": "x"}, {"wait_max": float("nan")}):
        with pytest.raises(pk.ConfigurationError):
            pk.Retry(**bad)


def test_thread_id_keyword_opens_a_block(tmp_path: Path) -> None:
    store = pk.connect(f"sqlite:///{tmp_path}/kw.db")
    calls: list[int] = []

    @pk.checkpointed
    def once(x: int) -> int:
        calls.append(x)
        return x * 2

    import persistkit.engine._store as store_mod

    previous, store_mod._default = store_mod._default, store
    try:
        assert once(2, thread_id="kw") == 4  # type: ignore[call-arg]
        assert once(5, thread_id="other") == 10  # type: ignore[call-arg]
    finally:
        store_mod._default = previous
    assert calls == [2, 5] and store.threads() == ["kw", "other"]


def test_async_thread_id_keyword(local_store: pk.Store) -> None:
    import persistkit.engine._store as store_mod

    @pk.checkpointed
    async def twice(x: int) -> int:
        return 2 * x

    previous, store_mod._default = store_mod._default, local_store
    try:
        assert asyncio.run(twice(4, thread_id=uid())) == 8  # type: ignore[call-arg]
    finally:
        store_mod._default = previous


def test_base_exceptions_leave_the_step_in_flight(local_store: pk.Store) -> None:
    tid = uid()
    calls: list[str] = []

    @pk.checkpointed
    def interrupted() -> str:
        calls.append("x")
        if len(calls) == 1:
            raise KeyboardInterrupt
        return "done"

    with pytest.raises(KeyboardInterrupt), pk.resume(tid, store=local_store):
        interrupted()
    assert local_store.history(tid) == []
    with pk.resume(tid, store=local_store):
        assert interrupted() == "done"
    assert calls == ["x", "x"]


def test_recorded_custom_error_is_revived(local_store: pk.Store) -> None:
    class Refused(Exception):
        pass

    tid = uid()
    calls: list[int] = []

    @pk.checkpointed
    def deny() -> None:
        calls.append(1)
        raise Refused("no")

    @pk.checkpointed
    def later() -> None:
        if len(calls) == 1:
            raise RuntimeError("crash after the handled error")

    for _ in range(2):
        try:
            with pk.resume(tid, store=local_store):
                try:
                    deny()
                except Exception as exc:
                    assert "no" in str(exc)
                    assert isinstance(exc, Refused | pk.StepFailedError)
                later()
        except RuntimeError:
            pass
    assert calls == [1]


def test_default_store_is_sqlite_under_dot_persistkit(tmp_path: Path) -> None:
    code = "import persistkit as pk; s = pk.connect(); print(s.url)"
    env = {k: v for k, v in os.environ.items() if k != "PERSISTKIT_URL"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().startswith("sqlite") and (tmp_path / ".persistkit").is_dir()
    env["PERSISTKIT_URL"] = "memory://"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().startswith("memory")


def test_import_loads_no_driver_and_no_pydantic() -> None:
    code = (
        "import sys, persistkit\n"
        "bad = [m for m in ('psycopg', 'redis', 'boto3', 'botocore', 'pydantic', 'tenacity', 'asyncio') if m in sys.modules]\n"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_missing_driver_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "import persistkit as pk\n"
        "try:\n    pk.connect('postgresql://localhost/x')\n"
        "except pk.BackendNotFoundError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "persistkit[postgres]" in out.stdout
    with pytest.raises(pk.BackendNotFoundError, match="known schemes"):
        pk.connect("mongodb://x")
    with pytest.raises(pk.ConfigurationError):
        pk.connect("not a url")


def test_readme_quickstart_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Quickstart\s+```python\n(.*?)```", readme, re.S)
    assert code is not None
    lines = code.group(1).strip().splitlines()
    assert len(lines) <= 25
    for _ in range(2):  # the second run starts a new run on the same thread
        out = subprocess.run([sys.executable, "-c", code.group(1)], cwd=tmp_path, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "echo: plan durable agents / echo: write durable agents" in out.stdout


def test_cli(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    store = pk.connect(url)
    with pk.resume("cli-thread", store=store):
        noop(1)
    store.close()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "persistkit", *args], capture_output=True, text=True)

    assert cli("threads", url).stdout.split() == ["cli-thread"]
    hist = cli("history", url, "cli-thread")
    assert hist.returncode == 0 and "noop" in hist.stdout and "completed" in hist.stdout
    assert cli("state", url, "cli-thread").returncode == 0
    bad = cli("history", url, "")
    assert bad.returncode == 2 and "thread_id must be a non-empty" in bad.stderr
    assert cli("migrate", url, "--check").returncode == 0
    assert cli("delete", url, "cli-thread").stdout.strip() == "deleted"


def test_backend_instance_and_options_are_checked() -> None:
    with pytest.raises(pk.ConfigurationError):
        pk.connect(MemoryBackend(), synchronous="FULL")
    with pytest.raises(pk.ConfigurationError):
        pk.Store("memory://")  # type: ignore[arg-type]
    assert isinstance(pk.connect("memory://").backend, Backend)


def test_args_digest_schemes_compare_like_for_like(local_store: pk.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Digests recorded by the typed encoding (older persistkit, or non-JSON args) still guard replay."""
    import dataclasses

    @dataclasses.dataclass
    class Q:
        text: str

    @pk.checkpointed
    def ask(q: Any) -> str:
        return str(q)

    @pk.checkpointed
    def fail() -> None:
        raise RuntimeError("stop")

    run = pk.Run.__new__(pk.Run)  # only the digest helpers are used here
    run.codec = local_store.codec
    fast, typed = run.digest(("hi",), {}), run._typed_digest(("hi",), {})
    assert fast.startswith("x:") and not typed.startswith("x:")
    assert not run.digest(({1, 2},), {}).startswith("x:")  # sets take the typed path
    key = "sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7"
    assert run.digest((f"use {key}",), {}).startswith("r:")  # may hold a secret: hashed redacted
    assert run.digest((f"use {key}",), {}) == run.digest(("use sk-proj-" + "Q" * 30,), {})
    assert run.digest(([*range(100)],), {}) == run.digest(([0, *range(1, 98), 98, 99],), {})

    cases = [
        ("first", "first", "second"),
        (Q("a"), Q("a"), Q("b")),
        ({"s": {1}}, {"s": {1}}, {"s": {2}}),
        (f"use {key}", f"use {key}", f"use {key} twice"),  # r: digests (redacted arguments)
    ]
    for old_persistkit in (False, True):
        for arg, same, other in cases:
            tid = uid("digest")
            with monkeypatch.context() as m:
                if old_persistkit:  # it recorded typed digests only
                    m.setattr(pk.Run, "arguments", pk.Run._typed_digest)
                with pytest.raises(RuntimeError), pk.resume(tid, store=local_store):
                    ask(arg)
                    fail()
            with pytest.raises(pk.NonDeterminismError, match="different arguments"), pk.resume(tid, store=local_store):
                ask(other)
            with pytest.raises(RuntimeError), pk.resume(tid, store=local_store):
                assert ask(same) == str(arg)
                fail()

    # Replay computes the digest the recorded way: plain arguments that now carry a
    # secret are a different call (not "no basis to compare"), and nothing is stored.
    tid = uid("digest")
    with pytest.raises(RuntimeError), pk.resume(tid, store=local_store):
        ask("use the default key")
        fail()
    with pytest.raises(pk.NonDeterminismError, match="different arguments"), pk.resume(tid, store=local_store):
        ask(f"use {key}")
    assert key not in repr(local_store.history(tid))


def test_history_names_a_recorded_error(local_store: pk.Store) -> None:
    @pk.checkpointed
    def broken() -> None:
        raise KeyError("no such tool")

    tid = uid("err")
    with pytest.raises(KeyError), pk.resume(tid, store=local_store):
        broken()
    step, end = sorted(local_store.history(tid), key=lambda c: c.kind == "end")
    assert step.status == "failed" and step.error == "KeyError: 'no such tool'"
    assert end.run_status == "failed" and end.error == "KeyError: 'no such tool'"


class _Died(BaseException):
    """A process death stand-in: nothing after it runs."""


@pytest.mark.parametrize("shape", ["setdefault", "assigned", "typed"])
def test_appending_a_steps_result_to_state_survives_its_replay(local_store: pk.Store, shape: str) -> None:
    """``run.state["notes"].append(step(i))`` reads the list before the step runs; a replayed
    step restores the state, and the append must land in the restored list (it used to go
    to a list the restore had replaced, when the code had put a plain list there)."""
    crash = [True]

    @pk.checkpointed(name="engine.append_result")
    def step(i: int) -> str:
        if i == 2 and crash[0]:
            crash[0] = False
            raise _Died()
        return f"r{i}"

    class Notes(pk.State, name="tests.engine.Notes"):
        notes: list[str] = []

    def agent(tid: str) -> list[str]:
        with pk.resume(tid, store=local_store, state=Notes if shape == "typed" else None) as run:
            if shape == "setdefault":
                notes = run.state.setdefault("notes", [])
            elif shape == "assigned":
                if "notes" not in run.state:
                    run.state["notes"] = []
                notes = run.state["notes"]
            else:
                notes = run.state.notes
            for i in range(4):
                notes.append(step(i))
            return list(run.state.notes if shape == "typed" else run.state["notes"])

    tid = uid("append")
    with pytest.raises(_Died):
        agent(tid)
    assert agent(tid) == ["r0", "r1", "r2", "r3"]
    assert local_store.get_state(tid)["notes"] == ["r0", "r1", "r2", "r3"]
