"""An agent application for tests/test_forged_names.py: its steps make this module
allowlisted, and it imports what real apps import (``os``, ``subprocess``, persistkit, a
helper module, re-exported names, a class attribute that is a foreign class). A stored
record must reach none of those through it."""

from __future__ import annotations

import dataclasses
import os
import subprocess

import forged_evil as evilmod
from forged_evil import Boom as Reexported
from forged_evil import BoomError as ReexportedError
from forged_evil import evil as evil_reexport

import persistkit as pk

__all__ = ["Reexported", "ReexportedError", "evil_reexport", "evilmod", "os", "subprocess"]

UNDONE: list[int] = []


@dataclasses.dataclass
class Safe:
    x: int


class Outer:
    """Holds foreign objects as class attributes: ``forged_app:Outer.Inner`` must not reach them."""

    Inner = evilmod.Boom
    InnerError = evilmod.BoomError
    run = staticmethod(evilmod.evil)


class St(pk.State):
    item: Safe | None = None


class AppError(Exception):
    pass


def run_tool(command: str) -> str:
    """An agent's tool: defined here, never registered, so no stored record may call it."""
    evilmod.touch("run_tool")
    return subprocess.getoutput(command)


@pk.register
def failing_effect(x: int) -> None:
    raise RuntimeError(f"the effect of {x} fails (stays pending)")


@pk.register
def undo(x: int) -> None:
    UNDONE.append(x)


@pk.checkpointed
def effect_step(x: int) -> int:
    pk.after_commit(failing_effect, x, retry=pk.Retry(attempts=1))
    return x


@pk.checkpointed
def booking(x: int) -> Safe:
    pk.compensate(undo, x, retry=pk.Retry(attempts=1))
    return Safe(x)


@pk.checkpointed
def failing(x: int) -> None:
    raise AppError(f"declined {x}")


@pk.checkpointed
def ask(x: int) -> Safe:
    """Asks a person for a Safe (the question's answer type is stored by name)."""
    answer: Safe = pk.suspend({"question": f"which x for {x}?"}, answer_type=Safe)
    return answer
