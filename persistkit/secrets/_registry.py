"""The process-wide secret registry and configuration (``pk.secrets.register``,
``from_env``, ``unregister``, ``configure``): what redaction (``_redact``) looks for
and what resolves a handle. Every change bumps ``_generation``, which keys the
redaction's scan cache.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable
from typing import Protocol

from .._errors import ConfigurationError
from . import _env as _envsecrets
from ._detect import BUILTIN, Detector

__all__ = ["Vault", "configure", "from_env", "register", "unregister"]

_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,100}\Z")
_MIN_REGISTERED = 4  # shorter registered values would rewrite ordinary words


class Vault(Protocol):
    """Where detected secrets are kept so another process can resolve their handles."""

    def get(self, name: str) -> str | bytes | None: ...

    def put(self, name: str, value: str | bytes) -> None: ...

    def handle_key(self) -> bytes: ...


# -- process-wide registry and configuration ---------------------------------------------

_lock = threading.Lock()
_values: dict[str, str | bytes] = {}  # name -> value (registered, or learned from a resolver)
_resolvers: dict[str, Callable[[], str | bytes | None]] = {}
_memory: dict[str, str | bytes] = {}  # handle name -> value this process redacted
_loaded: set[str] = set()  # handle texts read back unresolved: written again as handles, not escaped
#: Handle texts a live load (a resume's state, a replayed result) could not resolve: while
#: there are any, a live step checks the run's state too, not only its arguments (``_live``).
_unresolved_live: set[str] = set()
_search: list[tuple[bytes, str | bytes, str]] = []  # (JSON-escaped bytes, value, name), longest first
#: The entries of ``_search`` the first pass must look for when detection is on: the
#: environment secrets a built-in detector's first pass flags anyway are left out (a
#: record holding one has candidates, so it is walked, and the walk replaces it by name).
_search_hot: list[tuple[bytes, bytes, bytes]] = []  # (rare byte, rarer byte, JSON-escaped bytes)
#: Bytes by how often they occur in stored JSON (English text, JSON punctuation), most
#: common first; the rest are rarer still. A value is looked for only where its two
#: rarest bytes occur (two memchr calls), so most records cost no substring search.
_COMMON = b' etaoinsrhldcumfpgwybvk",:{}.x\njqz_-0123456789TASCIMOEPNRHLDBWGFUYVKJQXZ'
_RANK = {c: i for i, c in enumerate(_COMMON)}


def _gates(form: bytes) -> tuple[bytes, bytes]:
    rare = sorted(set(form), key=lambda c: -_RANK.get(c, 1000))
    return bytes([rare[0]]), bytes([rare[1 if len(rare) > 1 else 0]])
_generation = [0]  # bumped by every change of what redaction does: keys the scan cache


def _changed() -> None:
    _generation[0] += 1


def _order() -> None:
    """Longest value first (a value inside another is replaced after it); at equal
    length a registered name before an environment variable. Then ``_search_hot``."""
    from ._scan import candidates

    _search.sort(key=lambda e: (-len(e[1]), e[2].startswith(_envsecrets.PREFIX)))
    _search_hot[:] = [
        (*_gates(e[0]), e[0]) for e in _search if not (e[2].startswith(_envsecrets.PREFIX) and candidates(e[0]))
    ]


def _env_sync() -> None:
    """Bring the environment's secrets into ``_search`` when the environment changed
    (cheap when it did not: see ``_env.sync``)."""
    if not _envsecrets.sync():
        return
    with _lock:
        registered = {v for v in _values.values() if isinstance(v, str)}
        _search[:] = [e for e in _search if not e[2].startswith(_envsecrets.PREFIX)]
        for value, variable in _envsecrets.secrets().items():
            if value not in registered:
                forms = {_json_escaped(value, False), _json_escaped(value, True)}
                _search.extend((f, value, _envsecrets.PREFIX + variable) for f in forms)
        _order()
        _changed()


class _Config:
    detect: bool = True
    vault: Vault | None = None
    detectors: tuple[Detector, ...] = BUILTIN
    resolver: Callable[[str], str | bytes | None] | None = None


_config = _Config()


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name) or name == "$":
        raise ConfigurationError(
            f"secret names are 1-100 characters of letters, digits and _ . : -, got {type(name).__name__}"
            + (f" {name!r}" if isinstance(name, str) and len(name) <= 100 else "")
        )
    if name.startswith(_envsecrets.PREFIX):
        raise ConfigurationError(
            f"secret names starting with {_envsecrets.PREFIX!r} are reserved for environment secrets "
            f"(handles $CRED{{env:VAR}} resolve from the environment): got {name!r}; pick another name"
        )
    return name


def _learn(name: str, value: str | bytes) -> None:
    """Remember a registered value so every occurrence of it is redacted."""
    if isinstance(value, str) and len(value) < _MIN_REGISTERED:
        raise ConfigurationError(
            f"secret {name!r}: values shorter than {_MIN_REGISTERED} characters cannot be registered "
            "(every occurrence of them in stored text would be rewritten)"
        )
    with _lock:
        _values[name] = value
        _search[:] = [e for e in _search if e[2] != name]
        if isinstance(value, str):
            forms = {_json_escaped(value, False), _json_escaped(value, True)}
            _search.extend((f, value, name) for f in forms)
            _search[:] = [e for e in _search if not (e[2].startswith(_envsecrets.PREFIX) and e[1] == value)]
            _order()
        _changed()


def _json_escaped(value: str, ascii_only: bool) -> bytes:
    import json

    return json.dumps(value, ensure_ascii=ascii_only)[1:-1].encode("utf-8", "surrogatepass")


def register(
    name: str, value: str | bytes | None = None, *, resolver: Callable[[], str | bytes | None] | None = None
) -> None:
    """Register a secret by name: its value (every occurrence in stored text becomes
    ``$CRED{name}``) or a ``resolver`` called at the point of use (its value is redacted
    from then on)."""
    _check_name(name)
    if (value is None) == (resolver is None):
        raise ConfigurationError(f"pk.secrets.register({name!r}, ...) takes a value or resolver=, exactly one")
    if resolver is not None:
        if not callable(resolver):
            raise ConfigurationError(f"resolver for secret {name!r} must be callable")
        with _lock:
            _resolvers[name] = resolver
            _changed()
        return
    if not isinstance(value, str | bytes):
        raise ConfigurationError(f"secret {name!r} must be a str or bytes, got {type(value).__name__}")
    _learn(name, value)


def from_env(name: str, variable: str) -> None:
    """Register secret ``name`` as the environment variable ``variable`` (read at the point
    of use; its current value is redacted from now on)."""
    _check_name(name)
    if not isinstance(variable, str) or not variable:
        raise ConfigurationError("pk.secrets.from_env needs the name of an environment variable")

    def read() -> str | None:
        return os.environ.get(variable)

    with _lock:
        _resolvers[name] = read
    current = read()
    if current is not None and len(current) >= _MIN_REGISTERED:
        _learn(name, current)


def unregister(name: str) -> None:
    """Forget a registered secret (mostly for tests)."""
    with _lock:
        _values.pop(name, None)
        _resolvers.pop(name, None)
        _search[:] = [e for e in _search if e[2] != name]
        _order()
        _changed()
    _envsecrets.configure(_envsecrets.enabled())  # an environment secret of that value is one again


def configure(
    *,
    vault: Vault | bool | None = False,
    detect: bool | None = None,
    detectors: Iterable[Detector | tuple[str, str]] | None = None,
    resolver: Callable[[str], str | bytes | None] | bool | None = False,
    environment: bool | Iterable[str] | None = None,
) -> None:
    """Process-wide settings (stores opened without their own ``redact=``/``vault=`` follow them).

    ``vault``: where detected secrets are kept (None: nowhere). ``detect``: run the
    pattern detectors (registered values and Secret types are always handled).
    ``detectors``: extra ``Detector`` objects or ``(kind, regex)`` pairs, added to
    the built-in ones. ``resolver``: a callable ``name -> value or None`` asked for
    handles nothing else knows. ``environment``: secrets the process environment holds
    become ``$CRED{env:VAR}`` and resolve from the environment (on by default; False:
    off; names of variables: on, and these are secrets whatever they look like).
    """
    if environment is not None:
        _envsecrets.configure(environment)
    if vault is not False:
        if vault is not None and not all(hasattr(vault, a) for a in ("get", "put", "handle_key")):
            raise ConfigurationError("vault must be a pk.secrets.FileVault (or have get/put/handle_key)")
        _config.vault = vault  # type: ignore[assignment]
    if detect is not None:
        _config.detect = bool(detect)
    if detectors is not None:
        extra: list[Detector] = []
        for d in detectors:
            if isinstance(d, tuple):
                d = Detector(_check_name(d[0]), d[1])
            if not isinstance(d, Detector):
                raise ConfigurationError("detectors takes pk.secrets.Detector objects or (kind, regex) pairs")
            try:
                d.regex  # noqa: B018 - compile now: a bad pattern is a configuration error
            except re.error as exc:
                raise ConfigurationError(f"detector {d.kind!r}: invalid regular expression ({exc})") from exc
            extra.append(d)
        _config.detectors = BUILTIN + tuple(extra)
    if resolver is not False:
        if resolver is not None and not callable(resolver):
            raise ConfigurationError("resolver must be a callable name -> value or None")
        _config.resolver = resolver
    _changed()
