"""A plain ``Runner.run`` on a ``PersistkitSession`` never hands the model a handle as text.

The session's items go to the model: in a process where a stored key's handle
resolves (the variable is set, maybe rotated) the model gets the key; where
nothing resolves it, ``get_items`` raises ``pk.SecretResolutionError`` naming the
variable and the model is never called. Also: a negative ``session_settings.limit``
is no limit, as in the SDK's ``SQLiteSession``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import uid

pytest.importorskip("agents")

from agents import SessionSettings

import persistkit as pk
from persistkit_openai_agents import PersistkitSession

SCRIPT = Path(__file__).with_name("openai_session_secret.py")
KEY = "sk-proj-" + "Zq8vT3kW" * 6


def _process(mode: str, url: str, session: str, out: Path, key: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "PK_TEST_OPENAI_API_KEY"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "adapters"), env.get("PYTHONPATH", "")])
    if key is not None:
        env["PK_TEST_OPENAI_API_KEY"] = key
    done = subprocess.run(
        [sys.executable, str(SCRIPT), mode, url, session, str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_the_model_gets_the_key_or_nothing(tmp_path: Path) -> None:
    url, session, out = f"sqlite:///{tmp_path}/s.db", uid("sess"), tmp_path / "model.jsonl"
    assert _process("write", url, session, out, KEY) == {"done": True}
    assert KEY.encode() not in (tmp_path / "s.db").read_bytes()

    refused = _process("run", url, session, out, None)  # a new process without the variable
    assert refused["error"] == "SecretResolutionError" and "PK_TEST_OPENAI_API_KEY" in str(refused["message"])
    assert not out.exists()  # the model was never called

    rotated = KEY[:-4] + "R0t8"
    assert _process("run", url, session, out, rotated) == {"done": True}
    handed = [json.loads(line) for line in out.read_text().splitlines()]
    assert handed == [[f"my key is {rotated}", "what is my key?"]]
    assert "$CRED" not in out.read_text()


def test_a_negative_limit_is_no_limit(tmp_path: Path) -> None:
    async def go() -> None:
        session = PersistkitSession(uid("lim"), pk.connect(f"sqlite:///{tmp_path}/l.db"))
        await session.add_items([{"role": "user", "content": str(i)} for i in range(5)])
        session.session_settings = SessionSettings(limit=-1)
        assert len(await session.get_items()) == 5
        assert len(await session.get_items(limit=-1)) == 5
        assert len(await session.get_items(limit=2)) == 2

    asyncio.run(go())
