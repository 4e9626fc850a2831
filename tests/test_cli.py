"""The command line, run as users run it: ``python -m persistkit ...`` in a subprocess."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOT_FOUND = 3


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, stdin: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "PERSISTKIT_URL"}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "adapters")])
    return subprocess.run([sys.executable, "-m", "persistkit", *args], cwd=cwd, capture_output=True,
                          text=True, env={**base, **(env or {})}, input=stdin, timeout=120)


AGENT = textwrap.dedent('''
    import datetime, sys
    import pydantic
    import persistkit as pk

    class Msg(pydantic.BaseModel):      # defined in __main__: the CLI cannot import it
        role: str
        text: str

    class Chat(pk.State):
        messages: list[Msg] = []
        when: datetime.datetime | None = None
        tags: set[str] = set()

    @pk.checkpointed
    def reply(x: str) -> Msg:
        return Msg(role="ai", text=x.upper())

    store = pk.connect(sys.argv[1])
    with pk.resume("thread-42", state=Chat, store=store) as run:
        for i in range(int(sys.argv[2])):
            run.state.messages.append(reply(f"hi {i}"))
        run.state.when = datetime.datetime(2026, 1, 2, 3, 4, 5)
        run.state.tags = {"b", "a"}
    with pk.resume("thread-43", store=store):
        reply("other")
    with pk.resume("graph-thread", namespace="lg:c:", store=store) as run:
        run.state["x"] = (1, 2)
''')


@pytest.fixture
def agent_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/agent.db"
    (tmp_path / "agent.py").write_text(AGENT)
    done = subprocess.run([sys.executable, str(tmp_path / "agent.py"), url, "30"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return url


def test_state_with_pydantic_models_of_the_users_program_prints_plain_json(agent_store: str, tmp_path: Path) -> None:
    import json

    out = cli("state", "--url", agent_store, "thread-42", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    state = json.loads(out.stdout)
    assert state["messages"][0] == {"role": "ai", "text": "HI 0"} and len(state["messages"]) == 30
    assert state["when"] == "2026-01-02T03:04:05" and sorted(state["tags"]) == ["a", "b"]
    legacy = cli("state", agent_store, "thread-42", cwd=tmp_path)  # the URL as first argument still works
    assert legacy.returncode == 0 and json.loads(legacy.stdout) == state


def test_namespaced_threads_are_listed_and_readable(agent_store: str, tmp_path: Path) -> None:
    import json

    listing = cli("threads", "--url", agent_store, cwd=tmp_path)
    assert listing.returncode == 0
    assert re.search(r"^graph-thread\s+namespaces: 'lg:c:'$", listing.stdout, re.M)
    assert re.search(r"^thread-42$", listing.stdout, re.M)
    as_json = json.loads(cli("threads", "--url", agent_store, "--json", cwd=tmp_path).stdout)
    assert {"thread": "graph-thread", "namespaces": ["lg:c:"]} in as_json
    plain = cli("state", "--url", agent_store, "graph-thread", cwd=tmp_path)
    assert plain.returncode == NOT_FOUND and "--namespace 'lg:c:'" in plain.stderr
    scoped = cli("state", "--url", agent_store, "--namespace", "lg:c:", "graph-thread", cwd=tmp_path)
    assert scoped.returncode == 0 and json.loads(scoped.stdout) == {"x": [1, 2]}
    hist = cli("history", "--url", agent_store, "--namespace", "lg:c:", "graph-thread", cwd=tmp_path)
    assert hist.returncode == 0 and "end" in hist.stdout
    rows = json.loads(cli("history", "--url", agent_store, "--json", "thread-42", cwd=tmp_path).stdout)
    assert rows[0]["kind"] == "end" and rows[0]["run_status"] == "completed"
    assert [r["position"] for r in rows if r["kind"] == "step"] == [str(i) for i in reversed(range(30))]


@pytest.mark.parametrize("verb", ["threads", "history", "state", "delete", "verify", "rotate-keys"])
def test_no_verb_but_migrate_creates_a_store(verb: str, tmp_path: Path) -> None:
    args = {"threads": [], "verify": [], "rotate-keys": []}.get(verb, ["thread-42"])
    env = {"PERSISTKIT_ENCRYPTION_KEYS": "k1:" + "A" * 43 + "=", "PERSISTKIT_INTEGRITY_KEYS": "k1:" + "ab" * 32}
    out = cli(verb, *args, cwd=tmp_path, env=env)  # no URL: the default ./.persistkit/ store
    assert out.returncode == NOT_FOUND, (out.stdout, out.stderr)
    assert "no store at sqlite:///.persistkit/persistkit.db" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / ".persistkit").exists()
    given = cli(verb, *args, "--url", f"sqlite:///{tmp_path}/typo.db", cwd=tmp_path, env=env)
    assert given.returncode == NOT_FOUND and not (tmp_path / "typo.db").exists()


def test_postgres_read_creates_no_schema(postgres_url: str, tmp_path: Path) -> None:
    import uuid

    import psycopg

    schema = f"pktest_cli_{uuid.uuid4().hex[:8]}"
    out = cli("history", "--url", f"{postgres_url}?schema={schema}", "thread-42", cwd=tmp_path)
    assert out.returncode == NOT_FOUND and "has no persistkit tables" in out.stderr
    with psycopg.connect(postgres_url) as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    assert found is None


@pytest.mark.parametrize("verb", ["history", "state", "delete"])
def test_an_unknown_thread_is_the_same_error_in_every_verb(agent_store: str, tmp_path: Path, verb: str) -> None:
    out = cli(verb, "--url", agent_store, "no-such-thread", cwd=tmp_path)
    assert out.returncode == NOT_FOUND and out.stdout == ""
    assert out.stderr.startswith("persistkit: NotFoundError: thread 'no-such-thread' not found in the store at ")


def test_a_closed_pipe_ends_quietly(agent_store: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = f"{sys.executable} -m persistkit history --url {agent_store} thread-42 | head -n 2"
    out = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=tmp_path, capture_output=True, text=True,
                         env=env, timeout=120)
    assert len(out.stdout.splitlines()) == 2
    assert "Traceback" not in out.stderr and "BrokenPipeError" not in out.stderr


def test_migrate_check_speaks_words_not_reprs(postgres_url: str, tmp_path: Path) -> None:
    import uuid

    import psycopg

    schema = f"pktest_cli_{uuid.uuid4().hex[:8]}"
    url = f"{postgres_url}?schema={schema}"
    try:
        assert cli("migrate", "--url", url, cwd=tmp_path).returncode == 0
        current = cli("migrate", url, "--check", cwd=tmp_path)  # the legacy positional URL
        assert current.returncode == 0 and "up to date" in current.stdout and "MigrationStatus(" not in current.stdout
        with psycopg.connect(postgres_url, autocommit=True) as conn:  # as if written by an older persistkit
            conn.execute(f"DELETE FROM {schema}.migrations WHERE version = (SELECT max(version) FROM {schema}.migrations)")
        behind = cli("migrate", "--check", "--url", url, cwd=tmp_path)
        assert behind.returncode == 1 and "MigrationStatus(" not in behind.stdout
        assert "is at version" in behind.stdout and "persistkit migrate --url" in behind.stdout
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.parametrize("where", ["sqlite-missing-dir", "sqlite-missing-file", "postgres-missing-schema"])
@pytest.mark.parametrize("as_json", [False, True])
def test_migrate_check_of_no_store_is_not_found_and_creates_nothing(
    where: str, as_json: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import uuid

    flags = ["--json"] if as_json else []
    if where.startswith("sqlite"):
        path = tmp_path / ("no-dir" if where == "sqlite-missing-dir" else "") / "nonexistent.db"
        out = cli("migrate", "--check", *flags, f"sqlite:///{path}", cwd=tmp_path)  # the legacy positional URL too
        assert not path.exists() and not path.parent.joinpath("nonexistent.db-journal").exists()
        assert where == "sqlite-missing-file" or not path.parent.exists()
    else:
        import psycopg

        postgres_url = request.getfixturevalue("postgres_url")
        schema = f"pktest_cli_{uuid.uuid4().hex[:8]}"
        out = cli("migrate", "--check", *flags, "--url", f"{postgres_url}?schema={schema}", cwd=tmp_path)
        with psycopg.connect(postgres_url) as conn:
            found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
        assert found is None
    assert out.returncode == NOT_FOUND, (out.stdout, out.stderr)
    assert out.stdout == "" and out.stderr.startswith("persistkit: NotFoundError: no store at ")
    assert "nothing to do" not in out.stderr and "Traceback" not in out.stderr


def test_usage_says_what_is_accepted(agent_store: str, tmp_path: Path) -> None:
    helped = cli("history", "--help", cwd=tmp_path)
    assert "--url URL" in helped.stdout and "THREAD [THREAD ...]" in helped.stdout
    assert "[URL] THREAD" not in helped.stdout and "$PERSISTKIT_URL" in helped.stdout
    two = cli("history", "--url", agent_store, "thread-42", "graph-thread", "--namespace", "", cwd=tmp_path)
    assert two.returncode == NOT_FOUND  # graph-thread lives under lg:c: ...
    both = cli("history", "thread-42", "thread-43", cwd=tmp_path, env={"PERSISTKIT_URL": agent_store})
    assert both.returncode == 0 and both.stdout.splitlines()[0].split()[:2] == ["thread", "checkpoint"]
    assert {line.split()[0] for line in both.stdout.splitlines()[1:]} == {"thread-42", "thread-43"}
    one_env = cli("history", "thread-42", cwd=tmp_path, env={"PERSISTKIT_URL": agent_store})
    assert one_env.returncode == 0 and "reply" in one_env.stdout
    cid = re.search(r"^([0-9a-f]{24})\s", one_env.stdout.splitlines()[2]).group(1)  # type: ignore[union-attr]
    mistaken = cli("state", "thread-42", cid, cwd=tmp_path, env={"PERSISTKIT_URL": agent_store})
    assert mistaken.returncode == 2 and f"use --checkpoint {cid}" in mistaken.stderr
    right = cli("state", "thread-42", "--checkpoint", cid, cwd=tmp_path, env={"PERSISTKIT_URL": agent_store})
    assert right.returncode == 0 and '"messages"' in right.stdout


@pytest.mark.parametrize("verb", ["threads", "history", "state"])
def test_every_read_verb_takes_json(agent_store: str, tmp_path: Path, verb: str) -> None:
    import json

    args = [] if verb == "threads" else ["thread-42"]
    plain = cli(verb, "--url", agent_store, *args, cwd=tmp_path)
    for flags in (["--json"], ["--json", "--namespace", ""] if verb != "threads" else ["--json", "--prefix", ""]):
        out = cli(verb, "--url", agent_store, *args, *flags, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        parsed = json.loads(out.stdout)
        if verb == "state":  # already JSON: --json prints the very same document
            assert out.stdout == plain.stdout and parsed["tags"] == ["a", "b"]
        else:
            assert isinstance(parsed, list) and parsed and out.stdout != plain.stdout


def test_state_usage_names_only_what_is_accepted(tmp_path: Path) -> None:
    out = cli("state", cwd=tmp_path)
    assert out.returncode == 2
    assert "the following arguments are required: THREAD\n" in out.stderr and "extra" not in out.stderr
    helped = cli("state", "--help", cwd=tmp_path)
    assert "extra" not in helped.stdout and "--json" in helped.stdout


@pytest.mark.parametrize("verb", ["threads", "history", "state"])
def test_a_reader_going_away_ends_a_read_verb_with_0(agent_store: str, tmp_path: Path, verb: str) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: every write fails (EPIPE)
    args = [] if verb == "threads" else ["thread-42"]
    env = {k: v for k, v in os.environ.items() if k != "PERSISTKIT_URL"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "adapters")])
    try:
        done = subprocess.run([sys.executable, "-m", "persistkit", verb, "--url", agent_store, *args],
                              cwd=tmp_path, stdout=write, stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    help_text = cli("--help", cwd=tmp_path).stdout
    assert "closed pipe" in help_text


def test_leases_shows_the_holder_while_a_run_is_live(tmp_path: Path) -> None:
    import json
    import threading

    import persistkit as pk

    url = f"sqlite:///{tmp_path}/leases.db"
    store = pk.connect(url)
    inside, leave = threading.Event(), threading.Event()

    def holder() -> None:
        with pk.resume("t-held", store=store, lease_ttl=30):
            inside.set()
            leave.wait(30)

    th = threading.Thread(target=holder)
    th.start()
    try:
        assert inside.wait(30)
        held = cli("leases", "--url", url, "--json", cwd=tmp_path)
        table = cli("leases", "--url", url, cwd=tmp_path)
    finally:
        leave.set()
        th.join(30)
    assert held.returncode == 0, held.stderr
    [row] = json.loads(held.stdout)
    assert row["thread"] == "t-held" and row["holder"] and row["token"] >= 1
    assert "t-held" in table.stdout and "(in " in table.stdout
    after = json.loads(cli("leases", "--url", url, "--json", cwd=tmp_path).stdout)
    assert after[0]["holder"] is None  # released with the block
    assert json.loads(cli("leases", "--url", url, "--json", "--held", cwd=tmp_path).stdout) == []


def test_abandon_ends_a_crashed_run_and_says_why_it_cannot(tmp_path: Path) -> None:
    import json
    import threading

    import persistkit as pk

    url = f"sqlite:///{tmp_path}/abandon.db"
    store = pk.connect(url)

    class Crash(BaseException):
        pass

    @pk.checkpointed(name="cli.item")
    def item(name: str) -> None:
        run = pk.current_run()
        assert run is not None
        run.state["items"] = [*run.state.get("items", []), name]

    try:
        with pk.resume("t", store=store, run_id="A"):
            item("A.0")
            raise Crash
    except Crash:
        pass
    unknown = cli("abandon", "t", "Z", "--url", url, cwd=tmp_path)
    assert unknown.returncode == 3 and "no checkpoint of that run" in unknown.stderr
    assert cli("abandon", "nope", "A", "--url", url, cwd=tmp_path).returncode == 3
    inside, leave = threading.Event(), threading.Event()

    def holder() -> None:  # the run's own redelivery, live
        with pk.resume("t", store=store, run_id="A"):
            item("A.0")  # replayed, not run
            inside.set()
            leave.wait(30)

    th = threading.Thread(target=holder)
    th.start()
    try:
        assert inside.wait(30)
        live = cli("abandon", "t", "A", "--url", url, cwd=tmp_path)
    finally:
        leave.set()
        th.join(30)
    assert live.returncode == 1 and "ThreadBusyError" in live.stderr and "live run holds" in live.stderr
    finished = cli("abandon", "t", "A", "--url", url, cwd=tmp_path)  # the redelivery completed it
    assert finished.returncode == 1 and "it finished (completed)" in finished.stderr
    try:
        with pk.resume("t", store=store, run_id="B"):
            item("B.0")
            raise Crash
    except Crash:
        pass
    done = cli("abandon", "t", "B", "--url", url, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["run_status"] == "abandoned"
    assert "abandoned" in cli("history", "t", "--url", url, cwd=tmp_path).stdout
    assert store.get_state("t") == {"items": ["A.0", "B.0"]}
    store.close()
    store.close()


# -- issue 18: what a new user hit -------------------------------------------------------------


def test_thread_ids_that_are_not_plain_text_are_escaped_in_tables(tmp_path: Path) -> None:
    import json

    import persistkit as pk

    url = f"sqlite:///{tmp_path}/odd.db"
    odd = ["two\nlines", "tab\there", "back\\slash", " padded", "'quoted'", "quote'", 'dq"', "plain-id"]
    with pk.connect(url) as store:
        for tid in odd:
            with pk.resume(tid, store=store):
                pass
    out = cli("threads", "--url", url, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(odd), out.stdout  # one line per thread: a newline in an id is not a second row
    assert sorted(line.strip() for line in lines) == sorted(["plain-id", *(repr(t) for t in odd if t != "plain-id")])
    as_json = cli("threads", "--url", url, "--json", cwd=tmp_path)
    assert sorted(r["thread"] for r in json.loads(as_json.stdout)) == sorted(odd)  # JSON: exact
    hist = cli("history", "--url", url, "two\nlines", "tab\there", cwd=tmp_path)
    assert hist.returncode == 0, hist.stderr
    rows = hist.stdout.splitlines()[1:]
    assert len(rows) == 2 and rows[0].startswith("'two\\nlines'") and rows[1].startswith("'tab\\there'"), hist.stdout
    deleted = cli("delete", "--url", url, "two\nlines", "plain-id", cwd=tmp_path)
    assert deleted.stdout.splitlines() == ["deleted 'two\\nlines'", "deleted plain-id"], deleted.stdout


@pytest.mark.parametrize("verb", ["threads", "history", "state", "delete", "migrate", "verify", "leases"])
def test_an_unknown_flag_after_a_verb_prints_that_verbs_usage(tmp_path: Path, verb: str) -> None:
    args = [verb, "--bogus"] + (["t1"] if verb in ("history", "state", "delete") else [])
    out = cli(*args, cwd=tmp_path)
    assert out.returncode == 2, out
    assert out.stderr.startswith(f"usage: persistkit {verb} "), out.stderr
    assert "unrecognized arguments: --bogus" in out.stderr and "VERB" not in out.stderr, out.stderr


def test_history_of_an_unknown_run_is_not_found(agent_store: str, tmp_path: Path) -> None:
    import json

    out = cli("history", "--url", agent_store, "thread-42", "--run", "no-such-run", cwd=tmp_path)
    assert out.returncode == NOT_FOUND and out.stdout == "", out
    assert "run 'no-such-run' not found on thread 'thread-42'" in out.stderr, out.stderr
    # A run id copied from the table (cut to 12 characters) is matched to the whole one.
    runs = json.loads(cli("history", "--url", agent_store, "thread-42", "--json", cwd=tmp_path).stdout)
    whole = runs[0]["run_id"]
    short = cli("history", "--url", agent_store, "thread-42", "--run", whole[:12], cwd=tmp_path)
    assert short.returncode == NOT_FOUND and f"--run {whole}" in short.stderr, short.stderr
    found = cli("history", "--url", agent_store, "thread-42", "--run", whole, cwd=tmp_path)
    assert found.returncode == 0 and len(found.stdout.splitlines()) == len(runs) + 1, found


def test_a_thread_id_with_nul_says_so(agent_store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The OS cannot pass a NUL byte in argv: call main() as a program embedding the CLI would.
    from persistkit._cli import main

    with pytest.raises(SystemExit) as usage:  # a usage error, as argparse's own
        main(["history", "--url", agent_store, "a\x00b"])
    assert usage.value.code == 2
    err = capsys.readouterr().err
    assert "thread_id must not contain a NUL character" in err and "'a\\x00b'" in err, err
    assert "512" not in err, err


@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_an_unknown_prefix_is_no_store_like_a_wrong_schema(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """issue 18: an unknown ?prefix= listed nothing with exit 0, where PostgreSQL and SQLite say 'no store' (3)."""
    from conftest import make_url

    import persistkit as pk

    url = make_url(kind, request, tmp_path_factory)  # a fresh prefix: nothing stored yet
    out = cli("threads", "--url", url, cwd=tmp_path)
    assert out.returncode == NOT_FOUND and out.stdout == "", out
    assert "nothing is stored under its prefix" in out.stderr and "prefix" in out.stderr, out.stderr
    with pk.connect(url) as store, pk.resume("first", store=store):  # a fresh store's first write works
        pass
    listed = cli("threads", "--url", url, cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout.split() == ["first"], listed


def test_a_redis_database_the_server_lacks_is_a_clear_error(redis_url: str, tmp_path: Path) -> None:
    import persistkit as pk

    base = redis_url.rsplit("/", 1)[0]
    url = f"{base}/999"
    with pk.connect(url) as store, pytest.raises(pk.ConfigurationError) as err:
        store.threads()
    text = str(err.value)
    assert "selects database 999, which the server does not have" in text and "ResponseError" not in text, text

    async def async_side() -> None:
        async with pk.connect(url) as astore:
            with pytest.raises(pk.ConfigurationError, match="selects database 999"):
                await astore.athreads()

    asyncio.run(async_side())
    out = cli("threads", "--url", url, cwd=tmp_path)
    assert out.returncode == 1 and "selects database 999" in out.stderr, out  # as a missing PostgreSQL database


def test_verify_reads_the_key_source_from_the_url_and_a_flipped_bit_names_the_way_forward(tmp_path: Path) -> None:
    import base64
    import sqlite3

    import persistkit as pk

    keys = tmp_path / "mac.keys"
    keys.write_text("m1:" + base64.b64encode(os.urandom(32)).decode() + "\n")
    db = tmp_path / "sealed.db"
    url = f"sqlite:///{db}?integrity=file:{keys}"
    with pk.connect(url) as store, pk.resume("t1", store=store) as run:
        run.state["notes"] = "hello"
    ok = cli("verify", "--url", url, cwd=tmp_path)  # no $PERSISTKIT_INTEGRITY_KEYS: the URL names the key
    assert ok.returncode == 0, ok
    con = sqlite3.connect(db)
    [(cid, payload)] = con.execute("SELECT checkpoint_id, payload FROM pk_checkpoints ORDER BY checkpoint_id DESC LIMIT 1")
    i = len(payload) // 2
    con.execute("UPDATE pk_checkpoints SET payload = ? WHERE checkpoint_id = ?",
                (payload[:i] + bytes([payload[i] ^ 1]) + payload[i + 1 :], cid))
    con.commit()
    con.close()
    broken = cli("verify", "--url", url, cwd=tmp_path)
    assert broken.returncode == 1 and cid in broken.stdout, broken
    read = cli("state", "--url", url, "t1", cwd=tmp_path)
    assert read.returncode == 1 and "IntegrityError" in read.stderr, read
    assert "Ways forward: `persistkit verify --url" in read.stderr and "--thread 't1'" in read.stderr, read.stderr


def test_every_verb_opens_a_sealed_store_with_the_key_variables(tmp_path: Path) -> None:
    """With $PERSISTKIT_ENCRYPTION_KEYS / $PERSISTKIT_INTEGRITY_KEYS set, state, history, threads,
    leases and abandon open the store as verify does; without them the error names both ways."""
    import base64
    import json

    import persistkit as pk

    env = {"PERSISTKIT_ENCRYPTION_KEYS": "e1:" + base64.b64encode(os.urandom(32)).decode(),
           "PERSISTKIT_INTEGRITY_KEYS": "m1:" + base64.b64encode(os.urandom(32)).decode()}
    url = f"sqlite:///{tmp_path}/sealed.db"
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with pk.connect(url, encryption=True, integrity=True) as store:
            with pk.resume("t", store=store, run_id="A") as run:
                run.state["notes"] = "sealed"

            @pk.checkpointed(name="cli.sealed")
            def step() -> int:
                return 1

            class Crash(BaseException):
                pass

            try:
                with pk.resume("t", store=store, run_id="B"):
                    step()
                    raise Crash
            except Crash:
                pass
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    for verb in (["state", "t"], ["history", "t"], ["threads"], ["leases"]):
        done = cli(*verb, "--url", url, "--json", cwd=tmp_path, env=env)
        assert done.returncode == 0, (verb, done.stderr)
    assert json.loads(cli("state", "t", "--url", url, "--json", cwd=tmp_path, env=env).stdout)["notes"] == "sealed"
    gone = cli("abandon", "t", "B", "--url", url, "--json", cwd=tmp_path, env=env)
    assert gone.returncode == 0, gone.stderr
    assert json.loads(gone.stdout)["run_status"] == "abandoned"
    keyless = cli("state", "t", "--url", url, cwd=tmp_path)
    assert keyless.returncode == 1 and "StoreOptionsError" in keyless.stderr
    assert "$PERSISTKIT_ENCRYPTION_KEYS" in keyless.stderr and "?encryption=true" in keyless.stderr
    assert "PERSISTKIT_INTEGRITY_KEYS" in cli("--help", cwd=tmp_path).stdout


def test_leases_shows_a_thread_reserved_for_an_unfinished_run(tmp_path: Path) -> None:
    import json

    import persistkit as pk

    url = f"sqlite:///{tmp_path}/reserved.db"

    class Crash(BaseException):
        pass

    with pk.connect(url) as store:
        with pk.resume("free", store=store):
            pass
        try:
            with pk.resume("t", store=store, run_id="A") as run:
                run.state["x"] = 1
                pk.checkpointed(name="cli.reserved")(lambda: 1)()
                raise Crash
        except Crash:
            pass
        # B finds A unfinished: the lease is reserved for A
        with pytest.raises(pk.ThreadBusyError), pk.resume("t", store=store, run_id="B", busy_timeout=0):
            pass
    table = cli("leases", "--url", url, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    header, *lines = table.stdout.splitlines()
    assert header.split() == ["thread", "namespace", "holder", "token", "expires", "reserved_for", "waiting"]
    [reserved] = [line.split() for line in lines if line.startswith("t ")]
    assert reserved[2] == "-" and reserved[-2] == "A"
    held = json.loads(cli("leases", "--url", url, "--held", "--json", cwd=tmp_path).stdout)
    assert [(r["thread"], r["holder"], r["reserved_for"]) for r in held] == [("t", None, "A")]


@pytest.mark.parametrize("argv", [["abandon", "", "r"], ["abandon", "t", " "], ["state", ""], ["history", "t", "--run", ""],
                                  ["delete", ""]])
def test_a_bad_id_argument_is_a_usage_error(argv: list[str], tmp_path: Path) -> None:
    done = cli(*argv, "--url", f"sqlite:///{tmp_path}/none.db", cwd=tmp_path)
    assert done.returncode == 2 and "must be a non-empty" in done.stderr and "usage:" in done.stderr, done
    assert not (tmp_path / "none.db").exists()


def test_history_marks_a_step_name_cut_to_fit() -> None:
    from persistkit._cli._threads import _tail

    assert _tail("agents.tools.search", 24) == "agents.tools.search"
    cut = _tail("my_company.agents.refunds.tools.search_orders", 24)
    assert cut == "…nds.tools.search_orders" and len(cut) == 24


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_verify_command_a_wrong_key_error_names_runs(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The ways forward of a record that fails its check name `persistkit verify --url ...`: the
    store's URL as the CLI opens it (blobs= and witness= in it), not the wrapped store's display
    name ('... (blobs: ...) (encrypted)'), which, pasted, was no store (exit 3)."""
    import base64
    import shlex

    from conftest import make_url, uid

    import persistkit as pk

    key, other = bytes(range(32)), bytes(range(1, 33))
    url = make_url(kind, request, tmp_path_factory, isolated=True)
    blobs = f"sqlite:///{tmp_path}/blobs store+1.db"  # a space and a '+': percent-encoded in the URL
    sealed: dict[str, object] = {
        "blobs": blobs, "blob_threshold": 64, "encryption": {"k": key}, "witness": f"file:{tmp_path}/witness.jsonl",
    }
    tid = uid("cmd")
    with pk.connect(url, integrity={"m": key}, **sealed) as writer, pk.resume(tid, store=writer) as run:  # type: ignore[arg-type]
        run.state["text"] = "x" * 4096
    with pk.connect(url, integrity={"m": other}, **sealed) as wrong, pytest.raises(pk.IntegrityError) as info:  # type: ignore[arg-type]
        wrong.get_state(tid)
    found = re.search(r"`persistkit verify ([^`]*)`", str(info.value))
    assert found is not None and "(encrypted)" not in found.group(1) and "(blobs:" not in found.group(1), info.value
    assert "witness=file%3A" in found.group(1), found.group(1)
    args = shlex.split(found.group(1))
    env = {"PERSISTKIT_ENCRYPTION_KEYS": f"k:{base64.b64encode(key).decode()}"}
    ok = cli("verify", *args, cwd=tmp_path, env={**env, "PERSISTKIT_INTEGRITY_KEYS": f"m:{base64.b64encode(key).decode()}"})
    assert ok.returncode == 0 and "all verified" in ok.stdout, ok
    broken = cli("verify", *args, cwd=tmp_path, env={**env, "PERSISTKIT_INTEGRITY_KEYS": f"m:{base64.b64encode(other).decode()}"})
    assert broken.returncode == 1 and "does not match" in broken.stdout, broken


def test_a_missing_postgres_database_is_no_store_like_a_missing_schema(postgres_url: str, tmp_path: Path) -> None:
    """issue 34: the docs promise exit 3 for a mistyped path or database name; a missing
    database exited 1 (a missing schema already gave 3)."""
    import uuid

    server = postgres_url.rsplit("/", 1)[0]
    url = f"{server}/no_such_db_{uuid.uuid4().hex[:8]}"
    for verb in (("threads",), ("history", "thread-42"), ("migrate", "--check")):
        out = cli(*verb, "--url", url, cwd=tmp_path)
        assert out.returncode == NOT_FOUND, (verb, out.stderr)
        assert "no store at" in out.stderr and "database does not exist" in out.stderr, out.stderr
