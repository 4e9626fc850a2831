"""Secrets that came from the process environment: redacted and resolved with zero configuration.

The common case is a key the process read from its environment (``OPENAI_API_KEY``,
``AWS_SECRET_ACCESS_KEY``) that ends up in state, in a tool call's arguments or in
an email body. Such a value is stored as ``$CRED{env:OPENAI_API_KEY}``: the handle
names the *variable*, not the value, so

* it resolves in any process whose environment has the variable (a new process
  after a crash, another host), inside longer text too, with nothing registered;
* the stored bytes hold no tag or hash of the value, so a reader of the store has
  nothing to test guesses against (a tag keyed by a key the store shows would
  let them test a guessed password offline);
* a key rotated in the environment between the crash and the resume resolves to
  the *new* value (the handle is "the value of OPENAI_API_KEY here and now");
  replay digests treat every secret as ``$CRED{}``, so replay is unaffected.

Which variables: those whose name says credential (``_NAME_HINT``: KEY, TOKEN,
SECRET, PASSWORD, CREDENTIALS, AUTH... as a ``_``-delimited word) and whose value
looks like one (``_value_ok``: 8+ characters, not a path, two character classes at
least), those whose value holds a secret a built-in detector knows (a
``postgresql://user:pw@…`` DSN in ``DATABASE_URL``), and the variables named in
``pk.secrets.configure(environment=[...])``. A handle resolves only for a variable
that passes the same test now, so a forged ``$CRED{env:HOME}`` written into the
store by someone who can write it resolves to nothing (they could only name a
variable that is a credential anyway; integrity= refuses their edit).

Cost: the environment is read again when the number of variables changes and at
most once a second otherwise (``sync``, called by the redactor's first pass:
``len(os.environ)`` and a clock read per step), not per step.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable

from ._detect import BUILTIN, matches

__all__ = ["PREFIX", "configure", "enabled", "resolve", "secrets", "status", "sync"]

PREFIX = "env:"
_NAME_HINT = re.compile(
    r"(?i)(?:^|_)(?:API_?KEYS?|KEYS?|TOKENS?|SECRETS?|PASSWORDS?|PASSWD|PASS|PASSPHRASE|"
    r"CREDENTIALS?|CREDS?|AUTH|DSN|PRIVATE)(?:_|$)"
)
_NEVER = frozenset({"PWD", "OLDPWD"})  # the working directory, not a password
_VAR_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,96}\Z")  # what fits in a handle name after "env:"
_PATH = re.compile(r"(?:[/~.]|[A-Za-z]:[\\/])")
_MAX_VALUE = 16384
_REFRESH = 1.0  # seconds between two reads of an environment of unchanged size

_lock = threading.Lock()
_enabled = [True]
_extra: set[str] = set()
#: (number of variables, next refresh time, {value: variable}) of the last read
_snapshot: list[object] = [-1, 0.0, {}]
_tick = [0]  # calls since the clock was last read


def _value_ok(value: str) -> bool:
    """A value a credential-named variable holds that looks like a credential, not a path,
    a flag or a word (``SSH_AUTH_SOCK=/tmp/…``, ``AUTH_MODE=disabled``)."""
    if not 8 <= len(value) <= _MAX_VALUE or _PATH.match(value):
        return False
    classes = (
        any(c.isdigit() for c in value)
        + any(c.isupper() for c in value)
        + any(c.islower() for c in value)
        + any(not c.isalnum() for c in value)
    )
    return classes >= 2


def _detected(value: str) -> bool:
    """Whether a built-in detector finds a secret in ``value`` (any variable's name)."""
    if len(value) < 8 or len(value) > _MAX_VALUE:
        return False
    return any(matches(det, value) for det in BUILTIN)


def eligible(variable: str, value: str) -> bool:
    """Whether environment variable ``variable`` holding ``value`` is a secret handled here."""
    if not _VAR_NAME.match(variable) or variable in _NEVER:
        return False
    if variable in _extra:
        return len(value) >= 4
    return bool(_NAME_HINT.search(variable) and _value_ok(value)) or _detected(value)


def enabled() -> bool:
    return _enabled[0]


def configure(environment: bool | Iterable[str]) -> None:
    """``True``/``False``: environment secrets on/off; names: on, and these variables
    are secrets whatever their names and values look like."""
    if isinstance(environment, bool):
        _enabled[0] = environment
    else:
        names = [environment] if isinstance(environment, str) else list(environment)
        for name in names:
            if not isinstance(name, str) or not _VAR_NAME.match(name):
                from .._errors import ConfigurationError

                raise ConfigurationError(
                    "configure(environment=...) takes True, False or names of environment variables "
                    f"(1-96 characters of letters, digits and _ . : -), got {name!r}"
                )
        _enabled[0] = True
        _extra.update(names)
    _snapshot[0] = -1  # read the environment again at the next first pass


#: Variables SDKs read by these names: when one value sits in several variables, the
#: handle names one of these, which a resuming process most likely sets as well.
_WELL_KNOWN = frozenset(
    {
        "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AZURE_OPENAI_API_KEY", "GOOGLE_API_KEY",
        "GEMINI_API_KEY", "MISTRAL_API_KEY", "COHERE_API_KEY", "GROQ_API_KEY", "HF_TOKEN",
        "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "GITHUB_TOKEN", "SLACK_BOT_TOKEN",
    }
)  # fmt: skip


def _preference(variable: str) -> tuple[bool, int, str]:
    return (variable not in _WELL_KNOWN, len(variable), variable)


def secrets() -> dict[str, str]:
    """``{value: variable}`` of the environment's secrets as last read; a value held by
    several variables is named by a well-known one, else the shortest, else the first."""
    return _snapshot[2]  # type: ignore[return-value]


def sync() -> bool:
    """Read the environment again if it may have changed; True when its secrets changed."""
    n = len(os.environ)
    if n == _snapshot[0]:
        _tick[0] += 1
        if _tick[0] & 255 or time.monotonic() < _snapshot[1]:  # type: ignore[operator]
            return False  # the clock is read once per 256 calls: a step makes a few
    with _lock:
        found: dict[str, str] = {}
        if _enabled[0]:
            try:
                pairs = sorted(os.environ.items())
            except RuntimeError:  # another thread is changing the environment: next time
                return False
            # One value in several variables: the handle names the one other processes most
            # likely have too (a provider's own name first, then the shortest name).
            for variable, value in sorted(pairs, key=lambda p: _preference(p[0])):
                if value and value not in found and eligible(variable, value):
                    found[value] = variable
        changed = found != _snapshot[2]
        _snapshot[:] = [n, time.monotonic() + _REFRESH, found]
        return changed


def resolve(name: str) -> str | None:
    """The value handle ``env:VAR`` stands for in this process, or None."""
    variable = name[len(PREFIX) :]
    if not _enabled[0]:
        return None
    value = os.environ.get(variable)
    if value is None or not eligible(variable, value):
        return None
    return value


def status(name: str) -> str:
    """What to configure for an ``env:VAR`` handle that does not resolve (for the error)."""
    variable = name[len(PREFIX) :]
    if not _enabled[0]:
        return (
            "It stands for the value of the environment variable "
            f"{variable!r}, and environment secrets are turned off in this process: "
            "turn them on (pk.secrets.configure(environment=True))"
        )
    if variable not in os.environ:
        return (
            f"It stands for the value of the environment variable {variable!r}, which is not set "
            f"in this process: set {variable} (the same key, or its rotated value: the handle "
            "names the variable, not the value) before resuming"
        )
    return (
        f"It stands for the value of the environment variable {variable!r}, which is set here "
        "but does not look like a credential (too short, a path, or one kind of character): "
        f"name it as one with pk.secrets.configure(environment=[{variable!r}])"
    )
