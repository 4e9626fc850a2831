"""Environment secrets (issue 18, section 2): zero configuration, a new process, every store.

A key the process read from its environment is stored as ``$CRED{env:VAR}`` wherever
it sits (a state field, a step's result, inside an email body or tool arguments),
resolves in a new process from that process's environment, and is never handed to a
live step as handle text. Loading a thread (resume, replay, inspection) never needs
the value. The cross-process cases run tests/env_secret_agent.py as real processes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_url, uid
from env_secret_agent import STEPS, VARIABLE, crash_and_resume, handed, run_agent
from pydantic import SecretStr

import persistkit as pk
from persistkit.secrets import _env as _envsecrets
from persistkit.secrets import _redact as _secrets

sys.path.insert(0, str(Path(__file__).with_name("adapters")))
from planted import raw_bytes

KEY = "sk-proj-Ab3dE6gH9jK2mN5pQ8sT1vW4yZ7cF0"
ROTATED = "sk-proj-Zz9yX8wV7uT6sR5qP4oN3mL2kJ1hG0"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    pk.secrets.configure(environment=True)
    _envsecrets._extra.clear()
    _secrets._memory.clear()


@pytest.fixture(params=["sqlite", "postgres", "redis", "s3"])
def shared_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store another process can open (memory:// lives in one process)."""
    return make_url(request.param, request, tmp_path_factory)


# -- which variables, and what is stored ----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "secret"),
    [
        ("OPENAI_API_KEY", KEY, True),
        ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", True),
        ("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE", True),
        ("GITHUB_TOKEN", "ghp_" + "a1B2" * 9, True),
        ("DB_PASSWORD", "hunter22-Correct", True),
        ("DATABASE_URL", "postgresql://app:s3cret-pw@db:5432/x", True),  # a detector finds the password
        ("ANY_NAME", "sk-ant-api03-" + "Q" * 30, True),  # a vendor prefix, whatever the name
        ("SSH_AUTH_SOCK", "/tmp/ssh-XXXX/agent.123", False),  # a path
        ("AUTH_MODE", "disabled", False),  # one kind of character: a word
        ("PWD", "/home/user", False),
        ("KEYBOARD_LAYOUT", "us-intl-2024", False),  # KEY is not a word of the name
        ("API_KEY", "short1", False),  # under 8 characters
        ("HOME", "/root", False),
        ("LANG", "C.UTF-8", False),
    ],
)
def test_which_variables_are_secrets(name: str, value: str, secret: bool) -> None:
    assert _envsecrets.eligible(name, value) is secret


def test_a_key_from_the_environment_is_stored_as_the_variables_handle(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PK_T_OPENAI_API_KEY", KEY)
    monkeypatch.setenv("PK_T_DB_PASSWORD", "hunter22-Correct")  # no detector knows this one
    url = f"sqlite:///{tmp_path}/s.db"
    store = pk.connect(url)

    class S(pk.State):
        key: pk.Secret[str] | None = None
        token: SecretStr | None = None
        note: str = ""

    with pk.resume("t", store=store, state=S) as run:
        run.state.key = pk.Secret(KEY)
        run.state.token = SecretStr("hunter22-Correct")
        run.state.note = f"use {KEY} with password hunter22-Correct please"
    state = store.get_state("t", state=S)  # inspection: handles stay handles
    assert state.note == "use $CRED{env:PK_T_OPENAI_API_KEY} with password $CRED{env:PK_T_DB_PASSWORD} please"
    assert state.key is not None and state.key.name == "env:PK_T_OPENAI_API_KEY"
    assert state.key.reveal() == KEY and state.token is not None and state.token.get_secret_value() == "hunter22-Correct"
    store.close()
    data = raw_bytes(url)
    assert KEY.encode() not in data and b"hunter22-Correct" not in data
    # The handle names the variable and holds nothing derived from the value: no tag.
    assert b"$CRED{env:PK_T_OPENAI_API_KEY}" in data
    for handle in re.findall(rb"\$CRED\{([^}]*)\}", data):
        assert handle.startswith(b"env:") or handle == b"$", handle


def test_turned_off_and_named_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PK_T_API_KEY", "hunter22-Correct")
    monkeypatch.setenv("PK_T_PLAIN", "plainlowercase")
    store = pk.connect("memory://")
    pk.secrets.configure(environment=False)
    with pk.resume("off", store=store) as run:
        run.state["n"] = "hunter22-Correct"
    assert store.get_state("off")["n"] == "hunter22-Correct"
    pk.secrets.configure(environment=["PK_T_PLAIN"])  # on again, and this one whatever it looks like
    with pk.resume("on", store=store) as run:
        run.state["n"] = "hunter22-Correct and plainlowercase"
    assert store.get_state("on")["n"] == "$CRED{env:PK_T_API_KEY} and $CRED{env:PK_T_PLAIN}"
    with pytest.raises(pk.ConfigurationError, match="reserved"):
        pk.secrets.register("env:X", "some-value")
    with pytest.raises(pk.ConfigurationError, match="environment"):
        pk.secrets.configure(environment=["BAD NAME"])


def test_a_registered_name_wins_over_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PK_T_LLM_API_KEY", KEY)
    pk.secrets.from_env("llm", "PK_T_LLM_API_KEY")
    try:
        store = pk.connect("memory://")
        with pk.resume("t", store=store) as run:
            run.state["n"] = f"k={KEY}"
        assert store.get_state("t")["n"] == "k=$CRED{llm}"
    finally:
        pk.secrets.unregister("llm")


def test_a_forged_handle_naming_any_variable_resolves_to_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only variables that are credentials now: $CRED{env:HOME} written into the store by
    someone who can write it does not pull HOME (or PATH) into a live call."""
    monkeypatch.setenv("HOME", "/home/someone-else")
    assert _secrets.default_redactor().lookup("env:HOME") is None
    with pytest.raises(pk.SecretResolutionError, match="does not look like a credential"):
        pk.secrets.resolve("$CRED{env:HOME}")
    with pytest.raises(pk.SecretResolutionError, match="not set in this process"):
        pk.secrets.resolve("$CRED{env:PK_T_NOT_SET_API_KEY}")


def test_the_environment_is_read_again_when_it_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    store = pk.connect("memory://")
    with pk.resume("a", store=store) as run:
        run.state["n"] = f"k={KEY}"
    assert store.get_state("a")["n"].startswith("k=$CRED{openai-")  # not in the environment yet: detected
    monkeypatch.setenv("PK_T_LATE_API_KEY", ROTATED)  # load_dotenv() after the first store write
    with pk.resume("b", store=store) as run:
        run.state["n"] = f"k={ROTATED}"
    assert store.get_state("b")["n"] == "k=$CRED{env:PK_T_LATE_API_KEY}"


# -- a new process on every store ----------------------------------------------------------


def _lines(outbox: Path, after: int) -> list[dict[str, object]]:
    return handed(outbox)[after:]


#: The crash positions each server store runs (pairwise, issue #35): every position on SQLite,
#: each position on some server store and each server store at least once; where the crash
#: falls is engine code, the same on every store, and what is stored (the handle, never the
#: key) is checked on each store.
SERVER_KILLS = {"postgresql": (1, 4), "redis": (2,), "s3": (3,)}


@pytest.mark.parametrize("kill_at", [1, 2, 3, 4])
def test_a_crash_resumes_in_a_new_process_with_the_key_from_the_environment(
    shared_url: str, tmp_path: Path, kill_at: int
) -> None:
    """Killed inside step k; the new process has the same environment and nothing registered.
    The call in flight re-runs with the real key (inside the email body and the tool's
    arguments too), never with $CRED{...} text; the store never holds the key."""
    store = shared_url.split(":", 1)[0].split("+", 1)[0]
    if not shared_url.startswith("sqlite") and kill_at not in SERVER_KILLS.get(store, (kill_at,)):
        pytest.skip("every crash position on SQLite; on the server stores each position once (SERVER_KILLS)")
    thread, outbox = uid("env"), tmp_path / "outbox"
    out = crash_and_resume(shared_url, thread, kill_at, outbox=outbox, key=KEY, resume_key=KEY)
    assert out.get("done"), out
    calls = handed(outbox)
    assert [c["step"] for c in calls] == list(STEPS[:kill_at]) + list(STEPS[kill_at - 1 :])
    texts = [t for c in calls for t in c["texts"]]  # type: ignore[attr-defined]
    assert all("$CRED{" not in t for t in texts), texts
    assert all(KEY in t for t in texts), texts
    data = raw_bytes(shared_url)
    assert KEY.encode() not in data and b"$CRED{env:" + VARIABLE.encode() + b"}" in data


@pytest.mark.parametrize("kill_at", [2, 3, 4])
def test_a_key_rotated_between_crash_and_resume_is_the_new_one(shared_url: str, tmp_path: Path, kill_at: int) -> None:
    """The handle names the variable: replayed steps replay (their argument digests treat every
    secret alike), and every call from the resume on gets the rotated key, never the old one."""
    if kill_at != 3 and not shared_url.startswith("sqlite"):
        pytest.skip("every crash position on SQLite; one on the server stores")
    thread, outbox = uid("rot"), tmp_path / "outbox"
    run_agent(shared_url, thread, kill_at, outbox=outbox, key=KEY)
    before = len(handed(outbox))
    out = run_agent(shared_url, thread, -1, outbox=outbox, key=ROTATED)
    assert out.get("done"), out
    after = _lines(outbox, before)
    assert [c["step"] for c in after] == list(STEPS[kill_at - 1 :])  # the in-flight step on: nothing else re-ran
    texts = [t for c in after for t in c["texts"]]  # type: ignore[attr-defined]
    assert texts and all(ROTATED in t and KEY not in t and "$CRED{" not in t for t in texts), texts


@pytest.mark.parametrize("kill_at", [2, 3, 4])
def test_a_variable_gone_fails_the_step_before_its_body(shared_url: str, tmp_path: Path, kill_at: int) -> None:
    if kill_at != 3 and not shared_url.startswith("sqlite"):
        pytest.skip("every crash position on SQLite; one on the server stores")
    thread, outbox = uid("gone"), tmp_path / "outbox"
    run_agent(shared_url, thread, kill_at, outbox=outbox, key=KEY)
    before = len(handed(outbox))
    out = run_agent(shared_url, thread, -1, outbox=outbox, key=None)
    assert out.get("error") == "SecretResolutionError", out
    message = str(out["message"])
    assert f"$CRED{{env:{VARIABLE}}}" in message and f"set {VARIABLE}" in message and "not run" in message
    assert STEPS[kill_at - 1] in message and KEY not in message
    assert _lines(outbox, before) == []  # the body never ran with handle text
    # Put the variable back: the same run goes on from where it stopped.
    out = run_agent(shared_url, thread, -1, outbox=outbox, key=KEY)
    assert out.get("done"), out
    assert [c["step"] for c in _lines(outbox, before)] == list(STEPS[kill_at - 1 :])


INSPECT = """
import json, sys, persistkit as pk
store = pk.connect(sys.argv[1])
state = store.get_state(sys.argv[2])
history = store.history(sys.argv[2])
print(json.dumps({"state": state, "steps": [cp.step for cp in history]}, default=str))
"""


def test_a_thread_is_inspected_in_a_process_that_cannot_resolve_it(shared_url: str, tmp_path: Path) -> None:
    """No variable, nothing registered: get_state, history and the CLI read the thread
    (before: SecretResolutionError), with handles where the key was."""
    thread, outbox = uid("insp"), tmp_path / "outbox"
    run_agent(shared_url, thread, 4, outbox=outbox, key=KEY)
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-c", INSPECT, shared_url, thread], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    handle = f"$CRED{{env:{VARIABLE}}}"
    assert seen["state"]["api_key"] == handle and handle in seen["state"]["messages"][0]
    assert len(seen["steps"]) >= 3 and KEY not in done.stdout
    cli = subprocess.run(
        [sys.executable, "-m", "persistkit", "state", "--url", shared_url, thread],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    assert handle in cli.stdout and KEY not in cli.stdout


@pytest.mark.parametrize(
    "value",
    [KEY, "AKIAIOSFODNN7EXAMPLE", "ghp_" + "a1B2" * 9, "hunter22-Correct", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
     "pässwört-Ünicode-77", 'quote"and\\backslash-9X'],
)
@pytest.mark.parametrize("detect", [True, False])
def test_the_first_pass_never_misses_an_environment_secret(monkeypatch: pytest.MonkeyPatch, value: str, detect: bool) -> None:
    """The per-step first pass skips values a detector flags anyway and looks for the rest
    only where their two rarest bytes occur: both are shortcuts, never a miss."""
    monkeypatch.setenv("PK_T_FIRST_PASS_TOKEN", value)
    # environment=True reads the environment again now: the previous case set the same variable
    # (the same number of variables), which the per-step check re-reads only after a second
    pk.secrets.configure(detect=detect, environment=True)
    try:
        codec = pk.connect("memory://").codec
        for text in (value, f"x{value}y", f"line\n{value}", f"{value}\n", f"le {value} dit «{value}»"):
            tree = {"r": text}
            out = codec.dump_tree(tree)
            assert value.encode() not in out and b"$CRED{env:PK_T_FIRST_PASS_TOKEN}" in out, (text, out)
            assert json.loads(out)["r"].count("$CRED{env:PK_T_FIRST_PASS_TOKEN}") == text.count(value)
    finally:
        pk.secrets.configure(detect=True)


def test_a_handle_read_back_never_reaches_a_live_step_inside_a_long_list() -> None:
    """Inspected (handle text) and passed on inside a 20-item list, of which the argument
    digest sees only the ends: the live step still refuses it before its body, and a
    replayed one would not have needed it. Registering the value then resolves it."""
    store = pk.connect("memory://")
    with pk.resume("src", store=store) as run:
        run.state["note"] = f"key {KEY} here"
    _secrets._memory.clear()  # as in a new process: nothing knows the value
    note = store.get_state("src")["note"]
    assert note.startswith("key $CRED{openai-") and KEY not in note
    ran: list[list[str]] = []

    @pk.checkpointed
    def send(lines: list[str]) -> int:
        ran.append(lines)
        return len(lines)

    lines = [f"line {i}" for i in range(20)]
    lines[10] = note
    with pytest.raises(pk.SecretResolutionError) as info, pk.resume("dst", store=store):
        send(lines)
    assert ran == [] and "not run" in str(info.value) and info.value.handle.startswith("openai-")
    pk.secrets.register("late", KEY)
    try:
        with pk.resume("dst2", store=store):
            send(lines)
        assert ran and ran[0][10] == f"key {KEY} here" and lines[10] == note  # the caller's list is untouched
    finally:
        pk.secrets.unregister("late")
