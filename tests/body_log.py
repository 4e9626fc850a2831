"""One line per run of a step body, appended to a log file that several processes share: the
process tests' agents (busy_agent, cancel_agent, children_agent) count bodies with it. One
``write`` with O_APPEND, so the lines of processes never mix and a SIGKILL leaves whole lines."""

from __future__ import annotations

import os
from pathlib import Path


def note(log: Path, label: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (label + "\n").encode())
    finally:
        os.close(fd)
