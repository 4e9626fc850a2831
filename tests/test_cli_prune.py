"""``persistkit prune``: the retention verb, as a script sees it (exit codes, --json)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import persistkit as pk

ROOT = Path(__file__).resolve().parent.parent


@pk.checkpointed
def cli_step(i: int) -> str:
    run = pk.current_run()
    assert run is not None
    run.state["log"].append(f"entry {i} " + "x" * 200)
    return f"result {i}"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "persistkit", *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


@pytest.fixture
def url(tmp_path: Path) -> str:
    u = f"sqlite:///{tmp_path}/p.db"
    store = pk.connect(u)
    for turn in range(3):
        with pk.resume("cli-t", store=store, state={"log": []}):
            for i in range(3):
                cli_step(turn * 10 + i)
    store.close()
    return u


def test_dry_run_then_prune(url: str) -> None:
    dry = _cli("prune", "--url", url, "--keep-last", "2", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert report["dry_run"] is True and report["checkpoints"] == 10 and report["kept"] == 2
    assert report["bytes_after"] < report["bytes_before"]
    done = _cli("prune", "--url", url, "--keep-last", "2")
    assert done.returncode == 0, done.stderr
    assert "deleted 10 checkpoint(s) (2 kept)" in done.stdout
    store = pk.connect(url)
    assert len(store.history("cli-t")) == 2
    assert len(store.get_state("cli-t")["log"]) == 9


def test_usage_errors_exit_2(url: str) -> None:
    none = _cli("prune", "--url", url)
    assert none.returncode == 2 and "no rule given" in none.stderr
    bad = _cli("prune", "--url", url, "--max-age", "soon")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    zero = _cli("prune", "--url", url, "--keep-last", "0")
    assert zero.returncode == 2 and "--keep-last" in zero.stderr


def test_no_store_exits_3(tmp_path: Path) -> None:
    missing = _cli("prune", "--url", f"sqlite:///{tmp_path}/none.db", "--keep-last", "1")
    assert missing.returncode == 3, missing.stderr


def test_durations() -> None:
    from persistkit._cli._prune import duration

    assert [duration(d) for d in ("90", "45s", "30m", "12h", "7d", "2w", "1.5h")] == [
        90, 45, 1800, 43200, 604800, 1209600, 5400,
    ]


def test_a_pruned_thread_exports_and_imports_whole(tmp_path: Path) -> None:
    """Rooted lists travel with the thread; the integrity anchors stay behind (the target
    chains the thread anew) and the target verifies."""
    keys = {"encryption": {"e1": bytes(range(32))}, "integrity": {"m1": bytes(range(40, 72))}}
    src, dst = f"sqlite:///{tmp_path}/src.db", f"sqlite:///{tmp_path}/dst.db"
    store = pk.connect(src, **keys)
    for turn in range(4):
        with pk.resume("pruned", store=store, state={"log": []}):
            for i in range(3):
                cli_step(turn * 10 + i)
    assert store.prune(pk.Retention(keep_last=3), thread_id="pruned").checkpoints == 13
    before = store.get_state("pruned")
    store.close()
    import base64

    env = {
        "PERSISTKIT_ENCRYPTION_KEYS": "e1:" + base64.b64encode(bytes(range(32))).decode(),
        "PERSISTKIT_INTEGRITY_KEYS": "m1:" + base64.b64encode(bytes(range(40, 72))).decode(),
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "persistkit", *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **env},
        )

    out = cli("export", "pruned", "--url", src, "-o", str(tmp_path / "t.jsonl"))
    assert out.returncode == 0, out.stderr
    assert '"~pa:' not in (tmp_path / "t.jsonl").read_text()  # no anchor leaves its store
    done = cli("import", str(tmp_path / "t.jsonl"), "--url", dst)
    assert done.returncode == 0, done.stderr
    target = pk.connect(dst, **keys)
    assert target.get_state("pruned") == before
    assert target.verify("pruned").ok
    with pk.resume("pruned", store=target, state={"log": []}):
        cli_step(99)
    assert len(target.get_state("pruned")["log"]) == len(before["log"]) + 1


def test_an_export_missing_a_row_is_refused_by_import(url: str, tmp_path: Path) -> None:
    """The file's lines are each well formed, but a row is missing: the thread would not
    read back, so it is not imported (found from outside: it was, and verified)."""
    dump = tmp_path / "t.jsonl"
    assert _cli("export", "cli-t", "--url", url, "-o", str(dump)).returncode == 0
    lines, rows = [], 0
    for line in dump.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "row":
            rows += 1
            if rows == 3:  # a step's row: a segment of the list the head reads
                continue
        if rec.get("type") == "thread":
            rec["rows"] -= 1
        lines.append(json.dumps(rec))
    hole = tmp_path / "hole.jsonl"
    hole.write_text("\n".join(lines) + "\n")
    target = f"sqlite:///{tmp_path}/target.db"
    done = _cli("import", str(hole), "--url", target)
    assert done.returncode == 1 and "cli-t" in done.stderr, (done.stdout, done.stderr)
    assert pk.connect(target).history("cli-t") == []


class Chat(pk.State):
    messages: list[str] = []


@pk.checkpointed
def chat_step() -> str:
    return "ok"


def test_fork_update_of_a_field_the_state_class_lacks_is_a_usage_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/chat.db"
    store = pk.connect(url)
    with pk.resume("chat", store=store, state=Chat) as run:
        run.state.messages.append("hi")
        chat_step()
    store.close()
    bad = _cli("fork", "chat", "--to", "chat-2", "--update", '{"nochannel": 1}', "--url", url)
    assert bad.returncode == 2 and "no such field" in bad.stderr, bad.stderr
    good = _cli("fork", "chat", "--to", "chat-2", "--update", '{"messages": ["hello"]}', "--url", url)
    assert good.returncode == 0, good.stderr
    with pk.resume("chat-2", store=pk.connect(url), state=Chat) as run:
        assert run.state.messages == ["hello"]
