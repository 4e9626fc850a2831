"""Secrets across processes (issue 13, items 5 and 17): a step that returns a key, a crash,
a resume in a NEW process; the same value gets the same handle in every process.

A real second process (tests/secret_crash_agent.py) on every store that can be
shared between processes, with and without encryption.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import uid
from pydantic import SecretBytes, SecretStr

import persistkit as pk
from persistkit.secrets import _redact as _secrets
from persistkit.secrets._handlekey import HANDLE_BLOB, HANDLE_THREAD

AGENT = Path(__file__).with_name("secret_crash_agent.py")
KEY = "sk-proj-Hq7Kd9Lm2Np4Rs6Tv8Wx0Yz1Ab3Cd5Ef7Gh9JkQ2Zx"
ENC_KEYS = "k1:" + base64.b64encode(b"\x07" * 32).decode()


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    for name in ("llm_key", "openai", "other"):
        pk.secrets.unregister(name)
    pk.secrets.configure(vault=None, detect=True, detectors=(), resolver=None)


@pytest.fixture(params=["sqlite", "postgres", "redis", "s3"])
def shared_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store URL another process can open (memory:// is per process)."""
    from conftest import make_url

    return make_url(request.param, request, tmp_path_factory)


def agent(url: str, thread: str, kill_at: int, setup: str, *, encrypt: bool = False, key: str = KEY) -> dict[str, Any]:
    env = {**os.environ, "AGENT_KEY": key, "PERSISTKIT_ENCRYPTION_KEYS": ENC_KEYS, "VAULT_KEY": base64.b64encode(b"\x09" * 32).decode()}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    args = [sys.executable, str(AGENT), url, thread, str(kill_at), setup, "1" if encrypt else "0"]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    if kill_at >= 1:
        assert done.returncode == -9, done.stderr
        return {}
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("kill_at", [1, 2, 3])
@pytest.mark.parametrize("encrypt", [False, True])
def test_a_returned_key_resumes_in_a_new_process(shared_url: str, kill_at: int, encrypt: bool) -> None:
    """setup() returns a key, call(key) is killed; a new process resumes.

    Without any setup the resume must refuse with SecretResolutionError naming the
    handle and what to configure (before: the killed call ran again with the handle
    TEXT as its api_key, or replay raised NonDeterminismError). After
    ``pk.secrets.from_env`` in the new process only, every call gets the real key,
    replayed calls match their recorded argument digests.
    """
    if encrypt and not shared_url.startswith("sqlite"):
        pytest.skip("encryption is a wrapper: crossed with one store")
    for setup in ("none", "from_env", "register"):
        thread = uid(f"sk-{setup}")
        agent(shared_url, thread, kill_at, "none", encrypt=encrypt)
        out = agent(shared_url, thread, -1, setup, encrypt=encrypt)
        if setup == "none":
            assert out.get("error") == "SecretResolutionError", out
            assert "$CRED{openai-" in out["message"] and "pk.secrets.from_env(" in out["message"]
            assert KEY not in out["message"]
            # resolving later still works: the handle carries the store's tag, not the process's
            out = agent(shared_url, thread, -1, "from_env", encrypt=encrypt)
        assert "error" not in out, out
        assert out["handed"] and all(out["ok"]), out  # never the handle text
        assert len(out["handed"]) == 3 - kill_at + 1
        assert out["answers"] == [f"answer {i} with a key of {len(KEY)} characters" for i in (1, 2, 3)]


def test_a_returned_key_resumes_with_a_vault(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/v.db"
    thread = uid("sk-vault")
    agent(url, thread, 2, f"vault:{tmp_path}/vault.json")
    out = agent(url, thread, -1, f"vault:{tmp_path}/vault.json")
    assert "error" not in out and all(out["ok"]), out


def handles(store: pk.Store, thread: str) -> str:
    """Every handle name stored in the thread's rows and blobs, as text."""
    text = ""
    for cp in store.history(thread):
        text += repr(cp)
    return text


STORE_ONE = """
import sys, persistkit as pk
store = pk.connect(sys.argv[1], encryption=sys.argv[4] == "1")
with pk.resume(sys.argv[2], store=store) as run:
    run.state["note"] = "use " + sys.argv[3] + " please"
store.close()
"""


@pytest.mark.parametrize(
    ("value", "stable_unencrypted"),
    [
        (KEY, True),  # a machine-made token: named with the store's key
        ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY aws_secret_access_key", None),
        ("postgresql://app:hunter22@db/x", False),  # a password a person chose: not with a key the store shows
    ],
)
@pytest.mark.parametrize("encrypt", [False, True])
def test_one_value_has_one_handle_in_every_process(shared_url: str, value: str, stable_unencrypted: bool | None, encrypt: bool) -> None:
    if encrypt and not shared_url.startswith("sqlite"):
        pytest.skip("encryption is a wrapper: crossed with one store")
    if value.endswith("aws_secret_access_key"):
        value = "aws_secret_access_key=" + value.split()[0]
        stable_unencrypted = True
    threads = [uid("same"), uid("same")]
    env = {**os.environ, "PERSISTKIT_ENCRYPTION_KEYS": ENC_KEYS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    for thread in threads:
        subprocess.run(
            [sys.executable, "-c", STORE_ONE, shared_url, thread, value, "1" if encrypt else "0"],
            check=True, env=env, timeout=120,
        )
    os.environ["PERSISTKIT_ENCRYPTION_KEYS"] = ENC_KEYS
    try:
        store = pk.connect(shared_url, encryption=bool(encrypt))  # False: plain, whatever the environment holds
        store.codec.reveal = False
        notes = [store.get_state(t)["note"] for t in threads]
    finally:
        del os.environ["PERSISTKIT_ENCRYPTION_KEYS"]
    assert all("$CRED{" in n for n in notes) and not any(value in n for n in notes)
    if encrypt or stable_unencrypted:
        assert notes[0] == notes[1]
    else:
        assert notes[0] != notes[1]  # a per-process key: a store reader cannot test guesses
    store.close()


def test_the_handle_key_is_sealed_in_an_encrypted_store(tmp_path: Path) -> None:
    import sqlite3

    os.environ["PERSISTKIT_ENCRYPTION_KEYS"] = ENC_KEYS
    try:
        store = pk.connect(f"sqlite:///{tmp_path}/e.db", encryption=True)
        with pk.resume(uid("enc"), store=store) as run:
            run.state["note"] = "key " + KEY
        store.close()
    finally:
        del os.environ["PERSISTKIT_ENCRYPTION_KEYS"]
    raw = b"".join(
        bytes(r[0]) for r in sqlite3.connect(f"{tmp_path}/e.db").execute("select data from pk_blobs where key = ?", (HANDLE_BLOB,))
    )
    assert raw and b"pk-handle-key" not in raw
    plain = pk.connect(f"sqlite:///{tmp_path}/p.db")
    with pk.resume(uid("plain"), store=plain) as run:
        run.state["note"] = "key " + KEY
    assert plain.backend.get_blobs(HANDLE_THREAD, [HANDLE_BLOB])[HANDLE_BLOB].startswith(b"pk-handle-key")
    assert HANDLE_THREAD not in plain.threads()
    plain.close()


def test_a_handle_read_back_has_the_digest_of_the_value_it_stands_for(local_store: pk.Store) -> None:
    """A key inside a longer text replays as text with its handle (nothing can resolve it);
    passed on to the next step, its argument digest is the live text's, so replay goes on."""
    thread = uid("digest")
    seen: list[str] = []

    @pk.checkpointed
    def fetch() -> str:
        return f"the key is {KEY} (do not share)"

    @pk.checkpointed
    def use(text: str) -> int:
        seen.append(text)
        return len(text)

    with pk.resume(thread, store=local_store) as run:
        use(fetch())
    _secrets._memory.clear()  # as in a new process
    with pk.resume(thread, store=local_store, run_id=run.run_id) as again:
        use(fetch())
    assert again.replayed and not again.executed
    assert seen == [f"the key is {KEY} (do not share)"]


@pytest.mark.parametrize("name", ["openai", "llm_key", "x-y.z"])
def test_registering_under_any_name_afterwards_resolves_and_replays(local_store: pk.Store, name: str) -> None:
    thread = uid("later")
    handed: list[str] = []

    @pk.checkpointed
    def fetch() -> str:
        return KEY

    @pk.checkpointed
    def use(key: str, i: int) -> int:
        handed.append(key)
        return i

    with pk.resume(thread, store=local_store) as run:
        k = fetch()
        use(k, 1)
    _secrets._memory.clear()
    with pk.resume(thread, store=local_store, run_id=run.run_id):
        k = fetch()  # replaying never needs the value: the handle stays handle text
    assert k.startswith("$CRED{openai-") and KEY not in k
    with pytest.raises(pk.SecretResolutionError) as info:
        pk.secrets.resolve(k)
    assert info.value.handle.startswith("openai-") and KEY not in str(info.value)
    pk.secrets.register(name, KEY)
    try:
        with pk.resume(thread, store=local_store, run_id=run.run_id) as again:
            use(fetch(), 1)
        assert again.replayed and not again.executed and handed == [KEY]
    finally:
        pk.secrets.unregister(name)


@dataclass
class _Creds:
    api_key: str
    region: str


def test_an_unknown_handle_inside_a_dataclass_replays_and_refuses_to_resolve(local_store: pk.Store) -> None:
    """Not a SerializationError about a 'malformed dc value': the data is fine, a resolver is
    missing. Replaying does not need it; resolving says what to configure."""
    thread = uid("dc")

    @pk.checkpointed
    def creds() -> _Creds:
        return _Creds(KEY, "eu")

    with pk.resume(thread, store=local_store) as run:
        creds()
    _secrets._memory.clear()  # as in a new process
    with pk.resume(thread, store=local_store, run_id=run.run_id):
        got = creds()
    assert isinstance(got, _Creds) and got.api_key.startswith("$CRED{openai-") and got.region == "eu"
    with pytest.raises(pk.SecretResolutionError) as info:
        pk.secrets.resolve(got)
    assert KEY not in str(info.value) and "from_env" in str(info.value)


class _WithSecretStr(pk.State):
    token: SecretStr = SecretStr("")
    keys: list[SecretBytes] = []


def test_secret_str_fields_survive_the_next_run_and_a_new_process(local_store: pk.Store) -> None:
    """A SecretStr read back (lazily resolved) is stored again as its handle, never refused."""
    thread = uid("ss")

    @pk.checkpointed
    def step(i: int) -> int:
        return i

    with pk.resume(thread, store=local_store, state=_WithSecretStr) as run:
        run.state.token = SecretStr("hunter2-not-a-pattern-9xQ")
        run.state.keys.append(SecretBytes(b"bytes-secret-value"))
        step(0)
    for i in (1, 2):  # the next runs read the fields back lazily and store them again
        with pk.resume(thread, store=local_store, state=_WithSecretStr) as run:
            step(i)
            run.state.keys.append(SecretBytes(b"another-secret-%d" % i))
    assert run.state.token.get_secret_value() == "hunter2-not-a-pattern-9xQ"
    _secrets._memory.clear()  # as in a new process: a value registered by name before comes back
    with pytest.raises(pk.SecretResolutionError, match="vault"):
        local_store.get_state(thread, state=_WithSecretStr).token.get_secret_value()


def test_a_registered_secret_str_keeps_its_name(local_store: pk.Store) -> None:
    thread = uid("ssn")
    pk.secrets.register("llm_key", "registered-secret-value-77")
    with pk.resume(thread, store=local_store, state=_WithSecretStr) as run:
        run.state.token = SecretStr("registered-secret-value-77")
    _secrets._memory.clear()
    assert local_store.get_state(thread, state=_WithSecretStr).token.get_secret_value() == "registered-secret-value-77"
