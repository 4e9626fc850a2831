"""The crash matrix's fork server (``persistkit.testing._crash_fork.Zygote``): warmed once
with what the uncrashed runs imported, so that no crash run or resume imports it again,
unless warming started a thread (a fork would not copy it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from persistkit.testing._crash_fork import Zygote

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the fork server needs os.fork")


def _exits_with_whether_imported(command: list[Any]) -> None:
    """A child: exit 7 when the module was imported before it ran, 8 when not."""
    os._exit(7 if command[0] in sys.modules else 8)


def _module(root: Path, name: str, body: str) -> str:
    (root / f"{name}.py").write_text(body)
    return name


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _code(status: int) -> int:
    assert os.WIFEXITED(status), status
    return os.WEXITSTATUS(status)


def test_a_warmed_server_forks_children_that_have_the_modules_imported(modules: Path) -> None:
    name = _module(modules, "pk_warm_plain", "VALUE = 1\n")
    zygote = Zygote(_exits_with_whether_imported)
    try:
        assert _code(zygote.call([name], 10)) == 8  # not yet: each child imports it itself
        assert zygote.warm([name, "pk_no_such_module_anywhere"])  # one that fails stays lazy
        assert _code(zygote.call([name], 10)) == 7
        assert _code(zygote.call([name], 10)) == 7  # every child after it, not only the first
    finally:
        zygote.close()
    assert name not in sys.modules  # warming happened in the server, not here


def test_warming_that_starts_a_thread_is_declined_and_the_server_stays_cold(modules: Path) -> None:
    name = _module(
        modules,
        "pk_warm_threaded",
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n",
    )
    zygote = Zygote(_exits_with_whether_imported)
    try:
        assert not zygote.warm([name])  # its children would lack the thread a fresh process has
        assert _code(zygote.call([name], 10)) == 8  # so each child imports it (and starts it) itself
    finally:
        zygote.close()
