"""Every security layer at once, as a careful user turns them on: redaction, encryption,
integrity with a witness. They must compose: a secret never stored, ciphertext only,
tampering refused, rotation of the encryption key under the integrity chain, verify."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import uid

import persistkit as pk

ENC_A = bytes(range(32))
ENC_B = bytes(range(100, 132))
MAC = bytes(range(7, 39))
OPENAI = "sk-proj-Zq81xLmN0pQrS2tUvW3xYz4AbC5dEf6GhI7"
MARKER = "plain-marker-7d1f0a"


@pk.checkpointed(name="together.call")
def call(prompt: str) -> str:
    run = pk.current_run()
    assert run is not None
    run.state["log"].append(f"{prompt} -> answer ({MARKER}) key {OPENAI}")
    return f"answer to {prompt}"


def _open(url: str, tmp: Path, enc: Any = None) -> pk.Store:
    return pk.connect(
        url,
        encryption=enc or {"a": ENC_A},
        integrity={"m": MAC},
        witness=f"file:{tmp}/witness.log",
    )


def test_all_layers_compose(store_url: str, tmp_path: Path) -> None:
    tid = uid("all")
    store = _open(store_url, tmp_path)
    with pk.resume(tid, store=store, state={"log": []}, metadata={"user": "u1"}):
        for i in range(5):
            call(f"q{i}")
    assert store.verify(tid).ok
    state = store.get_state(tid)
    assert len(state["log"]) == 5 and MARKER in state["log"][0]
    store.close()

    # rotation of the encryption key, under the integrity chain: nothing to re-tag
    store = _open(store_url, tmp_path, enc={"a": ENC_A, "b": ENC_B})
    report = store.rotate_keys(tid)
    assert report.active_key == "b" and report.rows_resealed > 0
    assert store.verify(tid).ok
    store.close()

    store = _open(store_url, tmp_path, enc={"b": ENC_B})  # the old key retired
    with pk.resume(tid, store=store, state={"log": []}):
        call("q5")
    assert len(store.get_state(tid)["log"]) == 6
    assert store.verify(tid).ok
    assert [c.kind for c in store.history(tid)][:2] == ["end", "step"]
    store.close()

    # without the encryption key the integrity layer cannot even see its tags
    with pk.connect(store_url, integrity={"m": MAC}) as keyless, pytest.raises(pk.PersistkitError):
        keyless.history(tid)


def test_sqlite_file_holds_no_marker_no_secret_and_refuses_edits(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    url = f"sqlite:///{db}"
    tid = uid("file")
    store = _open(url, tmp_path)
    with pk.resume(tid, store=store, state={"log": []}):
        for i in range(3):
            call(f"q{i}")
    store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("agent.db*"))
    assert MARKER.encode() not in raw and OPENAI.encode() not in raw
    assert b"q1 -> answer" not in raw

    # flip one byte inside the newest row's ciphertext
    with sqlite3.connect(db) as con:
        cid, payload = con.execute(
            "SELECT checkpoint_id, payload FROM pk_checkpoints WHERE thread_id = ? ORDER BY checkpoint_id DESC LIMIT 1",
            (tid,),
        ).fetchone()
        edited = bytearray(payload)
        edited[len(edited) // 2] ^= 0x01
        con.execute("UPDATE pk_checkpoints SET payload = ? WHERE checkpoint_id = ?", (bytes(edited), cid))
    store = _open(url, tmp_path)
    with pytest.raises(pk.IntegrityError) as info:
        store.history(tid)
    assert tid in str(info.value) and cid in str(info.value)
    with pytest.raises(pk.IntegrityError), pk.resume(tid, store=store, state={"log": []}):
        call("again")
    report = store.verify(tid)
    assert not report.ok and any(p.checkpoint_id == cid for p in report.problems)
    store.close()


def test_cli_verify_on_an_encrypted_integrity_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import base64

    url = f"sqlite:///{tmp_path}/cli.db"
    tid = uid("cli")
    store = _open(url, tmp_path)
    with pk.resume(tid, store=store, state={"log": []}):
        call("q")
    store.close()
    env = {
        "PERSISTKIT_ENCRYPTION_KEYS": "a:" + base64.b64encode(ENC_A).decode(),
        "PERSISTKIT_INTEGRITY_KEYS": "m:" + base64.b64encode(MAC).decode(),
        "PATH": "/usr/bin:/bin",
    }
    cmd = [sys.executable, "-m", "persistkit", "verify", url, "--witness", f"file:{tmp_path}/witness.log"]
    ok = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert base64.b64encode(ENC_A).decode() not in ok.stdout + ok.stderr
    env.pop("PERSISTKIT_ENCRYPTION_KEYS")
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode != 0


def test_readme_security_snippet_runs(tmp_path: Path) -> None:
    """The Security example of docs/getting-started.md (once the README's), pointed at a SQLite file
    (its $DATABASE_URL) and a temp witness."""
    import base64
    import os
    import re

    readme = (Path(__file__).resolve().parent.parent / "docs" / "getting-started.md").read_text()
    found = re.search(r"## Security\s.*?```python\n(.*?)```", readme, re.S)
    assert found is not None
    code = found.group(1).replace("/var/lib/agent/witness.log", f"{tmp_path}/witness.log")
    code = "import persistkit as pk\n" + code + (
        "\n@pk.checkpointed\ndef ask(q):\n    import os\n    return 'key ' + os.environ['OPENAI_API_KEY']\n"
        "with pk.resume('t', store=store):\n    print(ask('q'))\n"
        "print(store.verify().ok)\n"
    )
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path}/agent.db",  # the block reads its store's URL from there
        "OPENAI_API_KEY": OPENAI,
        "PERSISTKIT_ENCRYPTION_KEYS": "k1:" + base64.b64encode(ENC_A).decode(),
        "PERSISTKIT_INTEGRITY_KEYS": "m1:" + base64.b64encode(MAC).decode(),
    }
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["key", OPENAI, "True"]
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("agent.db*"))
    assert OPENAI.encode() not in raw
