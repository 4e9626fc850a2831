"""The shipped message and event conformance checks (persistkit.testing.messages_suite) on every store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import persistkit as pk
from persistkit.testing.messages_suite import MessagesConformance


class TestMessages(MessagesConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""


def test_the_cancel_verb(tmp_path: Path) -> None:
    """`persistkit cancel THREAD [RUN]`: a suspended run is ended now; again, nothing more."""
    url = f"sqlite:///{tmp_path}/cli.db"
    store = pk.connect(url)
    with pk.resume("ticket", store=store) as run:
        pk.receive("reply")
    store.close()
    assert run.status == "suspended"

    def cancel(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "persistkit", "cancel", "ticket", *args, "--url", url],
                              capture_output=True, text=True, timeout=120)

    first = cancel()
    assert first.returncode == 0 and "status cancelled" in first.stdout, first.stderr
    again = cancel(run.run_id, "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["outcome"] == "cancelled", again.stderr
    with pk.connect(url) as check:
        assert check.history("ticket")[0].run_status == "cancelled"
