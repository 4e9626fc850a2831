"""``persistkit show``, ``diff`` and ``fork``, run as users run them (a subprocess), on a
store written by an agent whose classes the command line cannot import; and tables
that fit the terminal."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cli import ROOT, cli

from persistkit._cli._output import ELLIPSIS, Output
from persistkit.ops._diff import state_diff

NOT_FOUND = 3
SECRET = "sk-live-" + "51c0ffee" * 5

AGENT = f"SECRET = {SECRET!r}\n" + textwrap.dedent('''
    import json, sys
    import pydantic
    import persistkit as pk

    pk.secrets.register("inspect_key", SECRET)

    class Msg(pydantic.BaseModel):      # defined in __main__: the CLI cannot import it
        role: str
        text: str

    class Chat(pk.State):
        messages: list[Msg] = []
        user: dict = {}
        notes: str | None = None

    @pk.checkpointed
    def reply(x: str) -> Msg:
        return Msg(role="ai", text=x.upper())

    @pk.checkpointed
    def report(n: int) -> str:
        return "y" * n                  # over the inline limit: the result is stored as a blob

    @pk.checkpointed
    def submit(key: str) -> str:
        raise ValueError(f"rejected {key}")

    store = pk.connect(sys.argv[1])
    if sys.argv[2] == "write":
        with pk.resume("chat", state=Chat, store=store) as run:
            run.state.user = {"name": "Ada", "prefs": {"lang": "en"}}
            for i in range(3):
                run.state.messages.append(reply(f"hi {i}"))
                run.state.user["prefs"]["lang"] = "fr" if i else "en"
            run.state.notes = report(70_000)[:3]
        try:
            with pk.resume("chat", state=Chat, store=store) as run:
                submit(SECRET)
        except ValueError:
            pass
    else:                               # resume a fork and go on
        with pk.resume(sys.argv[3], state=Chat, store=store) as run:
            run.state.messages.append(reply("after the fork"))
            print(json.dumps({"types": sorted({type(m).__name__ for m in run.state.messages}),
                              "texts": [m.text for m in run.state.messages], "notes": run.state.notes}))
''')


def agent(url: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, str(cwd / "agent.py"), url, *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, cwd=cwd, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def chat(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/agent.db"
    (tmp_path / "agent.py").write_text(AGENT)
    agent(url, "write", cwd=tmp_path)
    return url


def history(url: str, thread: str, cwd: Path) -> list[dict[str, Any]]:
    out = cli("history", "--url", url, "--json", thread, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return list(reversed(json.loads(out.stdout)))  # oldest first


def step(rows: list[dict[str, Any]], name: str, pos: str) -> str:
    return next(r["checkpoint_id"] for r in rows if r["step"] == name and r["position"] == pos)


def test_show_tells_one_checkpoint_with_its_result_error_and_state(chat: str, tmp_path: Path) -> None:
    rows = history(chat, "chat", tmp_path)
    one = cli("show", "--url", chat, "--json", "chat", step(rows, "reply", "1"), cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    shown = json.loads(one.stdout)
    assert shown["kind"] == "step" and shown["step"].endswith("reply") and shown["position"] == "1"
    assert shown["status"] == "completed" and shown["run_id"] == rows[0]["run_id"] and shown["run_status"] == "running"
    assert shown["result"] == {"role": "ai", "text": "HI 1"} and shown["args_digest"].startswith(("x:", "r:"))
    # a step's checkpoint holds the state as the step returned (before the caller appended it)
    assert [m["text"] for m in shown["state"]["messages"]] == ["HI 0"]
    assert shown["state"]["user"] == {"name": "Ada", "prefs": {"lang": "en"}}

    big = json.loads(cli("show", "--url", chat, "--json", "chat", step(rows, "report", "3"), cwd=tmp_path).stdout)
    assert big["result"] == "y" * 70_000  # read from the result's blob

    failed = next(r["checkpoint_id"] for r in rows if r["status"] == "failed")
    table = cli("show", "--url", chat, "chat", failed, cwd=tmp_path)
    assert table.returncode == 0 and SECRET not in table.stdout
    assert "ValueError: rejected $CRED{inspect_key}" in table.stdout
    assert "status       failed" in table.stdout and "\nstate:\n{" in table.stdout

    head = json.loads(cli("show", "--url", chat, "--json", "chat", cwd=tmp_path).stdout)
    assert head["checkpoint_id"] == rows[-1]["checkpoint_id"] and head["kind"] == "end" and head["run_status"] == "failed"


def test_show_of_what_is_not_there(chat: str, tmp_path: Path) -> None:
    gone = cli("show", "--url", chat, "chat", "01a0000000000000000000ff", cwd=tmp_path)
    assert gone.returncode == NOT_FOUND and gone.stdout == ""
    assert "has no checkpoint '01a0000000000000000000ff'" in gone.stderr and "persistkit history chat" in gone.stderr
    assert cli("show", "--url", chat, "nobody", cwd=tmp_path).returncode == NOT_FOUND
    assert cli("diff", "--url", chat, "chat", "nonsense", cwd=tmp_path).returncode == NOT_FOUND
    usage = cli("show", "--url", chat, "   ", cwd=tmp_path)
    assert usage.returncode == 2 and "thread_id must be a non-empty string" in usage.stderr


def test_diff_shows_appends_as_appends_and_nested_paths(chat: str, tmp_path: Path) -> None:
    rows = history(chat, "chat", tmp_path)
    a, b = step(rows, "reply", "1"), step(rows, "report", "3")  # messages [HI 0] -> [HI 0, HI 1, HI 2]
    out = cli("diff", "--url", chat, "chat", a, b, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"--- {a} (step ") and lines[1].startswith(f"+++ {b} (step ")
    assert "messages: changed" in lines
    assert '  + [1] {"role": "ai", "text": "HI 1"}' in lines and '  + [2] {"role": "ai", "text": "HI 2"}' in lines
    assert '  + [0] {"role": "ai", "text": "HI 0"}' not in lines  # kept items are not rewritten
    assert "user: changed" in lines and '  ~ .prefs.lang "en" -> "fr"' in lines

    data = json.loads(cli("diff", "--url", chat, "--json", "chat", a, b, cwd=tmp_path).stdout)
    assert (data["from"], data["to"]) == (a, b)
    by_name = {c["channel"]: c for c in data["channels"]}
    assert [c["op"] for c in by_name["messages"]["changes"]] == ["append", "append"]
    assert by_name["messages"]["changes"][0] == {"op": "append", "path": [1], "new": {"role": "ai", "text": "HI 1"}}
    assert by_name["user"]["changes"] == [{"op": "change", "path": ["prefs", "lang"], "old": "en", "new": "fr"}]
    assert "notes" not in by_name  # unchanged channels are left out
    end = json.loads(cli("diff", "--url", chat, "--json", "chat", b, rows[-1]["checkpoint_id"], cwd=tmp_path).stdout)
    assert {"op": "change", "path": [], "old": None, "new": "yyy"} in end["channels"][0]["changes"]

    same = cli("diff", "--url", chat, "chat", a, a, cwd=tmp_path)
    assert same.returncode == 0 and same.stdout.splitlines()[2] == "no differences"
    to_head = json.loads(cli("diff", "--url", chat, "--json", "chat", a, cwd=tmp_path).stdout)
    assert to_head["to"] == rows[-1]["checkpoint_id"]


def test_fork_copies_the_state_as_stored_and_the_agent_goes_on_there(chat: str, tmp_path: Path) -> None:
    rows = history(chat, "chat", tmp_path)
    at = step(rows, "reply", "1")
    made = cli("fork", "--url", chat, "chat", at, "--to", "chat-b", "--update", '{"notes": "edited"}',
               "--metadata", '{"why": "retry from here"}', "--json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    fork = json.loads(made.stdout)
    assert fork["thread_id"] == "chat-b" and fork["forked_from"] == {"thread_id": "chat", "checkpoint_id": at}
    shown = json.loads(cli("show", "--url", chat, "--json", "chat-b", cwd=tmp_path).stdout)
    assert shown["kind"] == "fork" and shown["metadata"] == {"why": "retry from here"}
    assert shown["forked_from"] == {"thread_id": "chat", "checkpoint_id": at} and shown["state"]["notes"] == "edited"

    # the models of the agent's __main__ were copied as stored: the agent revives them on the fork
    went_on = json.loads(agent(chat, "resume", "chat-b", cwd=tmp_path).stdout)
    assert went_on == {"types": ["Msg"], "texts": ["HI 0", "AFTER THE FORK"], "notes": "edited"}

    again = cli("fork", "--url", chat, "chat", "--to", "chat-b", cwd=tmp_path)
    assert again.returncode == 1 and "already exists" in again.stderr
    fresh = cli("fork", "--url", chat, "chat", cwd=tmp_path)  # the head, into a new id
    assert fresh.returncode == 0 and fresh.stdout.startswith("forked chat at ") and "into chat~" in fresh.stdout
    bad = cli("fork", "--url", chat, "chat", "--update", "[1]", cwd=tmp_path)
    assert bad.returncode == 1 and "--update must be a JSON object" in bad.stderr


def test_a_table_fits_the_terminal_and_a_pipe_gets_whole_rows(chat: str, tmp_path: Path) -> None:
    long = "x" * 70
    narrow = Output(stream=io.StringIO(), width=40)
    narrow.table(("thread", "checkpoint", "note"), [("t-1", "01a21689b9c000efb19d1402", long)], widths=(6, 24))
    lines = narrow.stream.getvalue().splitlines()  # type: ignore[attr-defined]
    assert all(len(line) <= 40 for line in lines) and lines[1].endswith(ELLIPSIS)
    assert lines[1].startswith("t-1")
    piped = Output(stream=io.StringIO())  # not a terminal, no $COLUMNS: rows whole, as scripts read them
    piped.table(("thread", "note"), [("t-1", long)], widths=(6,))
    assert piped.stream.getvalue().splitlines()[1].endswith(long)  # type: ignore[attr-defined]

    code, text = on_a_terminal("history", "--url", chat, "chat", cwd=tmp_path, columns=70)
    assert code == 0 and all(len(line) <= 70 for line in text.splitlines())
    assert ELLIPSIS in text
    ids = {r["checkpoint_id"] for r in history(chat, "chat", tmp_path)}
    assert {line.split()[0] for line in text.splitlines()[1:]} == ids  # ids are never cut
    code, text = on_a_terminal("show", "--url", chat, "chat", step(history(chat, "chat", tmp_path), "report", "3"),
                               cwd=tmp_path, columns=50)
    result = next(line for line in text.splitlines() if line.startswith("result"))
    assert len(result) == 50 and result.endswith(ELLIPSIS)
    piped = cli("history", "--url", chat, "chat", cwd=tmp_path, env={"COLUMNS": "40"})  # a pipe: whole rows
    assert ELLIPSIS not in piped.stdout and any(len(line) > 40 for line in piped.stdout.splitlines())


def on_a_terminal(*args: str, cwd: Path, columns: int) -> tuple[int, str]:
    """The CLI with its stdout on a pseudo-terminal ``columns`` wide ($COLUMNS)."""
    import os
    import pty

    master, slave = pty.openpty()
    env = {**{k: v for k, v in os.environ.items() if k != "PERSISTKIT_URL"}, "COLUMNS": str(columns),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "adapters")])}
    proc = subprocess.Popen([sys.executable, "-m", "persistkit", *args], cwd=cwd, stdout=slave,
                            stderr=subprocess.DEVNULL, env=env)
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=120), b"".join(chunks).decode().replace("\r\n", "\n")


def test_every_verb_speaks_json_for_scripts() -> None:
    from persistkit._cli import parser

    sub = next(a for a in parser()._actions if a.dest == "command")
    verbs: dict[str, Any] = dict(sub.choices)  # type: ignore[arg-type]
    missing = sorted(v for v, p in verbs.items() if "--json" not in p._option_string_actions)
    assert not missing, f"verbs without --json: {missing}"
    assert {"show", "diff", "fork", "export", "import"} <= set(verbs)


def test_verify_delete_and_keygen_in_json(chat: str, tmp_path: Path) -> None:
    key = json.loads(cli("keygen", "--json", "--id", "k9", cwd=tmp_path).stdout)
    assert key["id"] == "k9" and key["entry"].startswith("k9:") and len(key["entry"]) == 3 + 44
    env = {"PERSISTKIT_INTEGRITY_KEYS": "k1:" + "ab" * 32}
    sealed = f"sqlite:///{tmp_path}/sealed.db"
    assert cli("import", "--url", sealed, stdin=cli("export", "--url", chat, "chat", cwd=tmp_path).stdout,
               cwd=tmp_path, env=env).returncode == 0
    report = cli("verify", "--url", sealed, "--json", cwd=tmp_path, env=env)
    data = json.loads(report.stdout)
    assert report.returncode == 0 and data["ok"] is True and data["threads"] == 1 and data["problems"] == []
    assert data["records"] == len(history(chat, "chat", tmp_path))
    gone = cli("delete", "--url", sealed, "--json", "chat", cwd=tmp_path, env=env)
    assert gone.returncode == 0 and json.loads(gone.stdout) == [{"thread": "chat", "deleted": True}]


# -- the diff itself (ops/_diff.py): a property over random states --------------------------

_leaf = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=3)
_json = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner,
                                                                                         max_size=4), max_leaves=12)
_state = st.dictionaries(st.sampled_from(["a", "b", "messages", "x y"]), _json, max_size=4)


def _apply(state: dict[str, Any], channels: list[Any]) -> dict[str, Any]:
    """The older state with the diff's changes made: must be the newer state."""
    out = json.loads(json.dumps(state))
    for ch in channels:
        if ch.status == "removed":
            del out[ch.channel]
            continue
        if ch.status == "added":
            out[ch.channel] = ch.changes[0].new
            continue
        removals = []
        for c in ch.changes:
            *parent_path, last = (ch.channel, *c.path)
            parent: Any = out
            for p in parent_path:
                parent = parent[p]
            if c.op == "remove":
                removals.append((parent, last))  # list tails: removed after, from the end
            elif c.op == "append":
                assert isinstance(parent, list) and last == len(parent)  # an append is at the end
                parent.append(c.new)
            else:
                parent[last] = c.new
        for parent, last in reversed(removals):
            del parent[last]
    return out


@settings(max_examples=300, deadline=None)
@given(_state, _state)
def test_a_diff_applied_to_the_older_state_gives_the_newer(old: dict[str, Any], new: dict[str, Any]) -> None:
    channels = state_diff(old, new)
    assert _apply(old, channels) == json.loads(json.dumps(new))
    assert (channels == []) == (json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True))


@given(_state, st.lists(_json, min_size=1, max_size=5))
def test_a_list_that_grew_is_only_appends(old: dict[str, Any], items: list[Any]) -> None:
    old = {**old, "messages": [1, {"k": "v"}]}
    new = {**old, "messages": [*old["messages"], *items]}
    (ch,) = state_diff(old, new)
    assert [(c.op, c.path) for c in ch.changes] == [("append", (2 + i,)) for i in range(len(items))]


def test_options_between_positionals_and_json_keys_named_as_in_the_api(chat: str, tmp_path: Path) -> None:
    """``show THREAD --url URL CKPT`` said "unrecognized arguments"; ``history --json`` and
    ``show --json`` named fields ``checkpoint``, ``run``, ``created`` where pk.Checkpoint
    has ``checkpoint_id``, ``run_id``, ``created_at`` (issue #34)."""
    import dataclasses

    import persistkit as pk

    api = {f.name for f in dataclasses.fields(pk.Checkpoint)}
    rows = history(chat, "chat", tmp_path)
    assert set(rows[0]) == {"thread_id", "checkpoint_id", "run_id", "kind", "position", "step", "status",
                            "run_status", "created_at", "resumed"} and set(rows[0]) <= api
    at = step(rows, "reply", "1")
    one = cli("show", "chat", "--url", chat, at, "--json", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    shown = json.loads(one.stdout)
    assert shown["checkpoint_id"] == at and shown["run_id"] == rows[0]["run_id"]
    assert {"thread_id", "checkpoint_id", "parent_id", "run_id", "created_at"} <= set(shown) and "run" not in shown
    table = cli("show", "chat", "--namespace", "", at, "--url", chat, cwd=tmp_path)
    assert table.returncode == 0 and f"checkpoint   {at}" in table.stdout  # a table keeps short labels
    both = cli("diff", "chat", "--url", chat, at, "--json", rows[-1]["checkpoint_id"], cwd=tmp_path)
    assert both.returncode == 0 and json.loads(both.stdout)["to"] == rows[-1]["checkpoint_id"]
    extra = cli("show", "chat", "--url", chat, at, "surplus", cwd=tmp_path)
    assert extra.returncode == 2 and "unrecognized arguments: surplus" in extra.stderr
