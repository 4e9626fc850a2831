"""``persistkit export`` / ``import``: threads moved between stores as JSON Lines.

The round trip runs the verbs in this process (``persistkit._cli.main``) so that the
target may be a memory store and the thread can be resumed right after: a run that
failed half way on an encrypted, integrity-protected SQLite store holding a secret
goes on, on each other store, sealed there with other keys.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_url

import persistkit as pk
from persistkit._cli import EXIT_NOT_FOUND, main

ROOT = Path(__file__).resolve().parent.parent
SECRET = "sk-live-" + "7f3a9c" * 6  # registered below: stored only as $CRED{transfer_api_key}
SOURCE_KEYS = {"PERSISTKIT_ENCRYPTION_KEYS": "s1:" + "A" * 43 + "=", "PERSISTKIT_INTEGRITY_KEYS": "s1:" + "ab" * 32}
TARGET_KEYS = {"PK_TARGET_ENC": "t1:" + "B" * 43 + "=", "PK_TARGET_INT": "t1:" + "cd" * 32}
FAIL = {"on": True}


@pk.checkpointed
def call_api(i: int, key: pk.Secret[str]) -> str:
    if i == 3 and FAIL["on"]:
        raise RuntimeError("the API is down")
    return f"answer {i} with {key.reveal()}"  # the secret's value in a result: redacted when stored


def agent(store: pk.Store, thread_id: str) -> dict[str, Any]:
    with pk.resume(thread_id, store=store) as run:
        run.state.setdefault("answers", [])
        run.state["key"] = pk.Secret(SECRET, name="transfer_api_key")
        for i in range(6):
            run.state["answers"].append(call_api(i, run.state["key"]))
        run.state["done"] = True
        return dict(run.state)


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name, value in {**SOURCE_KEYS, **TARGET_KEYS}.items():
        monkeypatch.setenv(name, value)
    pk.secrets.register("transfer_api_key", SECRET)
    FAIL["on"] = True
    yield
    pk.secrets.unregister("transfer_api_key")


def _source(tmp_path: Path, thread_id: str) -> str:
    """An encrypted, integrity-protected SQLite store whose thread's run failed at step 3."""
    url = f"sqlite:///{tmp_path}/dev.db"
    with pk.connect(url, encryption=True, integrity=True) as store:
        with pytest.raises(RuntimeError, match="the API is down"):
            agent(store, thread_id)
        store.fork(thread_id, new_thread_id=thread_id + "-fork")
    return url


def _target_url(kind: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    url = make_url(kind, request, tmp_path_factory)  # PostgreSQL: the session's schema, threads apart by id
    return url + ("&" if "?" in url else "?") + "encryption=env:PK_TARGET_ENC&integrity=env:PK_TARGET_INT"


@pytest.mark.parametrize("kind", ["postgres", "redis", "s3", "memory"])
def test_a_failed_run_moves_to_another_store_and_goes_on_there(
    kind: str, keys: None, tmp_path: Path, request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str],
) -> None:
    thread = f"move-{uuid.uuid4().hex[:8]}"
    source = _source(tmp_path, thread)
    dump = tmp_path / "threads.jsonl"
    assert main(["export", "--url", source, thread, thread + "-fork", "-o", str(dump)]) == 0
    assert "exported 2 thread(s)" in capsys.readouterr().out
    text = dump.read_text(encoding="utf-8")
    assert SECRET not in text and "$CRED{transfer_api_key}" in text  # redacted, readable, no key material
    assert SOURCE_KEYS["PERSISTKIT_ENCRYPTION_KEYS"][3:] not in text
    header = json.loads(text.splitlines()[0])
    assert header["persistkit"] == "export" and header["format"] == 1 and header["threads"] == [thread, thread + "-fork"]

    target = _target_url(kind, request, tmp_path_factory)
    assert main(["import", "--url", target, str(dump)]) == 0, capsys.readouterr().err
    assert "2 thread(s) imported" in capsys.readouterr().out
    with pk.connect(target) as store, pk.connect(source, encryption=True, integrity=True) as old:
        moved = [(c.checkpoint_id, c.parent_id, c.run_id, c.kind, c.status) for c in store.history(thread)]
        assert moved == [(c.checkpoint_id, c.parent_id, c.run_id, c.kind, c.status) for c in old.history(thread)]
        # chained anew under the target's integrity key (its threads: the server's test schema is shared)
        assert all(store.verify(t).ok for t in (thread, thread + "-fork"))
        FAIL["on"] = False
        state = agent(store, thread)  # the failed run goes on: steps 0-2 replayed, 3-5 run here
        assert [a.replace(SECRET, "<key>") for a in state["answers"]] == [f"answer {i} with <key>" for i in range(6)]
        assert state["done"] is True
        report = store.verify(thread)
        assert report.ok and report.records >= len(moved) + 4, str(report)
        assert store.get_checkpoint(thread + "-fork").forked_from == (thread, old.history(thread)[0].checkpoint_id)
    if kind != "memory":  # the target's records are sealed with its keys: the source's do not open them
        with pytest.raises(pk.PersistkitError), pk.connect(target.partition("encryption=")[0].rstrip("?&"),
                                                           encryption="env:PERSISTKIT_ENCRYPTION_KEYS") as wrong:
            wrong.get_state(thread)


def test_a_thread_the_store_has_is_refused_unless_replace(keys: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    source = _source(tmp_path, "dup")
    dump = tmp_path / "dup.jsonl"
    assert main(["export", "--url", source, "--all", "-o", str(dump)]) == 0
    for name in SOURCE_KEYS:  # the target: a plain store (an encrypted export is decrypted, not sealed)
        monkeypatch.delenv(name)
    target = f"sqlite:///{tmp_path}/prod.db"
    with pk.connect(target) as store:
        store.update_state("dup-fork", {"mine": 1})
    capsys.readouterr()
    assert main(["import", "--url", target, str(dump)]) == 1
    err = capsys.readouterr().err
    assert "already has 1 of the threads" in err and "'dup-fork'" in err and "--replace" in err
    with pk.connect(target) as store:
        assert store.threads() == ["dup-fork"] and store.get_state("dup-fork") == {"mine": 1}  # nothing written
    assert main(["import", "--url", target, "--replace", str(dump)]) == 0
    assert "(replaced)" in capsys.readouterr().out
    with pk.connect(target) as store:
        assert store.threads() == ["dup", "dup-fork"] and "mine" not in store.get_state("dup-fork")


def _rewrite(dump: Path, out: Path, change: Any) -> Path:
    lines = dump.read_text(encoding="utf-8").splitlines(keepends=True)
    out.write_text("".join(change(lines)), encoding="utf-8")
    return out


@pytest.mark.parametrize(("case", "change", "expected"), [
    ("foreign", lambda ls: ['{"id": 1, "name": "not ours"}\n', *ls[1:]], "line 1: not a persistkit export"),
    ("not json", lambda ls: ["id,name\n", *ls], "line 1: not JSON"),
    ("newer", lambda ls: [ls[0].replace('"format":1', '"format":7'), *ls[1:]], "line 1: export format 7"),
    ("cut short", lambda ls: ls[:-3], "without its last line (end-of-export)"),
    ("bad record", lambda ls: [*ls[:3], ls[3].replace('"k":"step"', '"k":"teleport"'), *ls[4:]],
     "line 4: checkpoint "),
    ("reordered", lambda ls: [ls[0], ls[1], ls[3], ls[2], *ls[4:]], "line 4: checkpoint "),
    ("empty", lambda ls: [], "is empty"),
])
def test_a_malformed_file_is_refused_with_its_line_and_nothing_written(
    case: str, change: Any, expected: str, keys: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _source(tmp_path, "bad")
    dump = tmp_path / "bad.jsonl"
    assert main(["export", "--url", source, "bad", "bad-fork", "-o", str(dump)]) == 0
    broken = _rewrite(dump, tmp_path / "broken.jsonl", change)
    target = tmp_path / "prod.db"
    capsys.readouterr()
    assert main(["import", "--url", f"sqlite:///{target}", str(broken)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("persistkit: SerializationError: ") and expected in err, err
    assert "Traceback" not in err and not target.exists()  # checked whole before the store opened


def test_each_thread_is_all_or_nothing_when_a_write_fails(keys: None, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from persistkit._cli import _transfer
    from persistkit.backends._copy import write_thread

    source = _source(tmp_path, "half")
    dump = tmp_path / "half.jsonl"
    assert main(["export", "--url", source, "half", "half-fork", "-o", str(dump)]) == 0

    def failing(backend: Any, copy: Any) -> int:
        if copy.thread_id == "half-fork":
            return write_thread(backend, copy)
        rows = copy.rows[""]
        copy.rows[""] = rows[:2]
        write_thread(backend, copy)  # two rows land, then the store fails
        raise pk.BackendUnavailableError("connection lost")

    monkeypatch.setattr(_transfer, "write_thread", failing)
    target = f"sqlite:///{tmp_path}/prod.db"
    capsys.readouterr()
    assert main(["import", "--url", target, str(dump)]) == 1
    err = capsys.readouterr().err
    assert "thread 'half' was not imported (what was written of it is deleted): connection lost" in err
    with pk.connect(target) as store:
        assert store.threads() == []  # 'half' deleted; 'half-fork' comes after it and was never reached


def test_the_next_thread_stays_when_stdin_breaks_after_it(keys: None, tmp_path: Path) -> None:
    source = _source(tmp_path, "pipe")
    target = f"sqlite:///{tmp_path}/prod.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "adapters")])}
    env.pop("PERSISTKIT_URL", None)
    run = [sys.executable, "-m", "persistkit"]
    exported = subprocess.run([*run, "export", "--url", source, "pipe", "pipe-fork"], capture_output=True,
                              text=True, env=env, timeout=120)
    assert exported.returncode == 0 and "exported 2 thread(s)" in exported.stderr  # the summary off stdout
    lines = exported.stdout.splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if '"thread":"pipe-fork"' in line) + 1
    broken = "".join([*lines[:cut], "{oops\n", *lines[cut:]])
    done = subprocess.run([*run, "import", "--url", target], input=broken, capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 1 and f"<stdin> line {cut + 1}: not JSON" in done.stderr
    assert "Imported before it, whole: 'pipe'" in done.stderr
    with pk.connect(target, encryption=True, integrity=True) as store, \
            pk.connect(source, encryption=True, integrity=True) as old:  # the keys of $PERSISTKIT_*_KEYS
        assert store.threads() == ["pipe"] and store.verify().ok
        assert len(store.history("pipe")) == len(old.history("pipe"))


def test_export_refuses_what_it_cannot_read(keys: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    source = _source(tmp_path, "locked")
    out = tmp_path / "x.jsonl"
    assert main(["export", "--url", source, "locked", "nope", "-o", str(out)]) == EXIT_NOT_FOUND
    assert "thread 'nope' not found" in capsys.readouterr().err and not out.exists()
    monkeypatch.delenv("PERSISTKIT_ENCRYPTION_KEYS")
    monkeypatch.delenv("PERSISTKIT_INTEGRITY_KEYS")
    assert main(["export", "--url", source, "locked", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "StoreOptionsError" in err and "PERSISTKIT_ENCRYPTION_KEYS" in err
    assert not out.exists() and not Path(str(out) + ".part").exists()  # written whole or not at all
    with pytest.raises(SystemExit) as usage:
        main(["export", "--url", source])
    assert usage.value.code == 2
    with pytest.raises(SystemExit) as usage:
        main(["import", source])  # the store where the file goes
    assert usage.value.code == 2 and "give it with --url" in capsys.readouterr().err
    assert main(["import", "--url", source, str(tmp_path / "none.jsonl")]) == EXIT_NOT_FOUND


def test_lease_records_stay_behind(keys: None, tmp_path: Path) -> None:
    source = _source(tmp_path, "held")
    with pk.connect(source, encryption=True, integrity=True) as store:
        with pk.resume("held", store=store, busy="wait"):  # takes the thread's lease, released at the end
            pass
        assert [i.thread_id for i in store.leases()] == ["held"]
    dump = tmp_path / "l.jsonl"
    assert main(["export", "--url", source, "held", "-o", str(dump)]) == 0
    lines = [json.loads(line) for line in dump.read_text(encoding="utf-8").splitlines()]
    assert {line.get("type") for line in lines[1:]} == {"thread", "row", "end", "end-of-export"}
    target = f"sqlite:///{tmp_path}/prod.db"
    assert main(["import", "--url", target, str(dump)]) == 0
    with pk.connect(target, encryption=True, integrity=True) as store:
        assert store.leases() == [] and store.threads() == ["held"]


def test_an_export_cut_by_its_reader_fails_and_a_summary_is_json(keys: None, tmp_path: Path) -> None:
    source = _source(tmp_path, "cut")
    with pk.connect(source, encryption=True, integrity=True) as store:  # more than a pipe's buffer
        store.update_state("cut", {"big": "z" * 2_000_000})
        rows = len(store.history("cut"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PERSISTKIT_URL", None)
    cmd = f"{sys.executable} -m persistkit export --url {source} cut cut-fork | head -n 1"
    out = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr  # a cut export is not one: not 0
    assert json.loads(out.stdout)["persistkit"] == "export"
    dump = tmp_path / "cut.jsonl"
    assert main(["export", "--url", source, "cut", "-o", str(dump)]) == 0
    summary = subprocess.run([sys.executable, "-m", "persistkit", "import", "--json", "--url",
                              f"sqlite:///{tmp_path}/prod.db", str(dump)], capture_output=True, text=True,
                             env=env, timeout=120)
    assert summary.returncode == 0, summary.stderr
    (done,) = json.loads(summary.stdout)
    assert done["thread"] == "cut" and done["rows"] == rows and done["replaced"] is False


def test_two_exports_of_the_same_data_are_byte_equal(keys: None, tmp_path: Path) -> None:
    """The header carried the time of the export, so a file could never be compared or
    checksummed against another export of the same threads (issue #34)."""
    source = _source(tmp_path, "same")
    first, second, stamped = tmp_path / "1.jsonl", tmp_path / "2.jsonl", tmp_path / "3.jsonl"
    assert main(["export", "--url", source, "--all", "-o", str(first)]) == 0
    assert main(["export", "--url", source, "--all", "-o", str(second)]) == 0
    assert first.read_bytes() == second.read_bytes()
    assert "created" not in json.loads(first.read_text(encoding="utf-8").splitlines()[0])
    assert main(["export", "--url", source, "--all", "--timestamp", "-o", str(stamped)]) == 0
    header = json.loads(stamped.read_text(encoding="utf-8").splitlines()[0])
    assert header["created"].endswith("+00:00") and header["threads"] == ["same", "same-fork"]
    target = f"sqlite:///{tmp_path}/prod.db"
    assert main(["import", "--url", target, str(stamped)]) == 0  # either header imports
