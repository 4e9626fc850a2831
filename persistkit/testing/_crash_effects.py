"""What the crash matrix sees between steps (``persistkit.testing.crash_matrix``).

A side effect made outside a step — a file written, a socket connected, a process started —
happens again on every resume, since only a step's body is skipped once it committed.
Python's audit hooks (``sys.addaudithook``) see those operations wherever they are made; the
matrix installs one hook, once per process (a hook cannot be removed), which does nothing
unless an uncrashed run the matrix watches is current in this context (:data:`WATCHED`) and
no step body is running in it (:data:`IN_STEP`). persistkit's own I/O (the store) is not the
agent's: an operation whose innermost frame outside the standard library and installed
packages is persistkit's is left out, and so are Python's own bytecode-cache writes.
:func:`arg_prints` / :func:`mutated` tell a step that changed its own arguments in place.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import pickle
import sys
import sysconfig
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

__all__ = ["IN_STEP", "WATCHED", "arg_prints", "install", "mutated"]

#: The effects list of the uncrashed run being watched in this context (None: none is).
WATCHED: ContextVar[list[tuple[str, str]] | None] = ContextVar("persistkit_matrix_effects", default=None)
#: Whether a step body is running in this context (its effects are the step's).
IN_STEP: ContextVar[bool] = ContextVar("persistkit_matrix_in_step", default=False)
#: What was done last in the watched run, for a person: "after step `x` at position 2".
AFTER: ContextVar[str] = ContextVar("persistkit_matrix_after_step", default="before the first step")

_EVENTS = frozenset(
    {"open", "socket.connect", "socket.sendto", "subprocess.Popen", "os.system", "os.posix_spawn",
     "os.spawn", "os.exec", "os.remove", "os.rename", "shutil.rmtree"}
)
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_FILES = frozenset({"open", "os.remove", "os.rename", "shutil.rmtree"})
_installed = False
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: Installed packages, then the standard library (a venv's "platstdlib" holds site-packages:
#: the standard library is where ``os`` came from).
_SITE = tuple(
    sorted({os.path.realpath(p) + os.sep for k in ("purelib", "platlib") if (p := sysconfig.get_paths().get(k))})
)
_STDLIB = (os.path.dirname(os.path.realpath(os.__file__)) + os.sep,)


def install() -> None:
    """Add the hook to this process (once)."""
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True


def _what(event: str, args: tuple[Any, ...]) -> str | None:
    if event == "open":
        path, mode, flags = (*args, None, None, None)[:3]
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITES)
        if not writes or path is None or isinstance(path, int):
            return None
        name = os.fsdecode(path) if isinstance(path, str | bytes) else str(path)
        if "__pycache__" in name or name.endswith((".pyc", ".lock")):
            return None  # an import writing its bytecode cache, a lock file
        return f"a file opened for writing ({name!r})"
    if event in ("socket.connect", "socket.sendto"):
        return f"a network connection ({_short(args[-1])})"
    if event in ("os.remove", "os.rename", "shutil.rmtree"):
        return f"a file changed ({event}({_short(args[0])}))"
    return f"a process started ({event} {_short(args[0] if event == 'os.system' else args[:2])})"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event not in _EVENTS:
        return
    seen = WATCHED.get()
    if seen is None or IN_STEP.get():
        return
    found = _user_frame()
    if found is None:
        return
    where, direct = found
    if not direct and event in _FILES:
        return  # a library's own file (a lock, a cache): what the user's code did is what counts
    what = _what(event, args)
    if what is not None:
        seen.append((what, f"{where}, {AFTER.get()}"))


def _user_frame() -> tuple[str, bool] | None:
    """Where the agent's own code made the operation (and whether it made it itself, with
    the standard library, rather than through an installed package), or None when it is
    persistkit's."""
    frame = sys._getframe(2)
    direct = True
    while frame is not None:
        file = frame.f_code.co_filename
        if file.startswith(_PACKAGE) or "persistkit_" in file:
            return None  # the store, an adapter, the matrix
        if not file.startswith("<"):
            real = os.path.realpath(file)
            if real.startswith(_SITE):
                direct = False  # an installed package's code
            elif not real.startswith(_STDLIB):
                return f"{os.path.basename(file)}:{frame.f_lineno} in {frame.f_code.co_name}", direct
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _print(value: Any) -> bytes | None:
    try:
        return hashlib.blake2b(pickle.dumps(value, protocol=5), digest_size=16).digest()
    except Exception:  # not picklable: not compared
        return None


def arg_prints(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[bytes | None]:
    """A print of each argument (positional, then keyword in order), full depth."""
    return [_print(v) for v in (*args, *kwargs.values())]


def mutated(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], before: list[bytes | None]
) -> list[str]:
    """The names of the arguments whose print changed since ``before``."""
    after = arg_prints(args, kwargs)
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a is not None and a != b]
    if not changed:
        return []
    names: list[str] = []
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    for i in changed:
        if i >= len(args):
            names.append(list(kwargs)[i - len(args)])
        elif i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY, params[i].POSITIONAL_OR_KEYWORD):
            names.append(params[i].name)
        else:
            names.append(f"argument {i + 1}")
    return names
