"""Key rings: named keys for encryption at rest and for integrity tags.

A :class:`KeyRing` holds several keys at once, each under a short key id.
New records are sealed with the *active* key; records sealed with any other
key in the ring stay readable, which is what makes rotation possible (add a
new key, make it active, re-seal old records, then retire the old key).

Keys never come from the store itself. They come from:

* the environment — ``KeyRing.from_env("PERSISTKIT_ENCRYPTION_KEYS")``;
* a key file — ``KeyRing.from_file("/run/secrets/persistkit.keys")``;
* a callable, e.g. one that asks a KMS — ``KeyRing.from_callable(fn)`` and/or
  ``KeyRing(..., fetch=fn)`` for key ids met while reading;
* code — ``KeyRing({"2026-11": key_bytes})``.

Text form (environment variable or file): entries separated by commas or
newlines, each ``key_id:key`` with the key in base64 (standard or URL-safe)
or hex; the LAST entry is the active key. A single entry without ``key_id:``
gets an id derived from the key's fingerprint. ``#`` starts a comment line in
files. A JSON file ``{"active": "k2", "keys": {"k1": "...", "k2": "..."}}`` is
accepted too. ``python -m persistkit keygen`` prints a fresh entry.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .._errors import ConfigurationError, IntegrityError

__all__ = ["KeyRing", "generate_key"]

_KID = re.compile(r"^[A-Za-z0-9._-]{1,32}$")

#: Default environment variables read by ``encryption=True`` / ``integrity=True``.
ENV_ENCRYPTION = "PERSISTKIT_ENCRYPTION_KEYS"
ENV_INTEGRITY = "PERSISTKIT_INTEGRITY_KEYS"

_PURPOSES = {
    # purpose: (min length, max length) in bytes
    "encryption": (32, 32),  # AES-256-GCM
    "integrity": (32, 64),  # keyed BLAKE2b takes up to 64 bytes of key
}


def generate_key(purpose: str = "encryption") -> bytes:
    """A fresh random key for ``purpose`` (``"encryption"`` or ``"integrity"``)."""
    _check_purpose(purpose)
    return secrets.token_bytes(32)


def fingerprint_id(key: bytes) -> str:
    """A key id derived from the key: 8 hex digits of a hash (reveals nothing usable)."""
    return "k" + hashlib.blake2b(key, digest_size=4, person=b"pk-keyid").hexdigest()


def _check_purpose(purpose: str) -> None:
    if purpose not in _PURPOSES:
        raise ConfigurationError(f"key purpose must be one of {sorted(_PURPOSES)}, got {purpose!r}")


def _decode_key_text(text: str, where: str) -> bytes:
    text = text.strip()
    if re.fullmatch(r"[0-9a-fA-F]{64,128}", text) and len(text) % 2 == 0:
        return bytes.fromhex(text)
    padded = text + "=" * (-len(text) % 4)
    try:
        if "-" in text or "_" in text:
            return base64.urlsafe_b64decode(padded)
        return base64.b64decode(padded, validate=True)
    except (binascii.Error, ValueError):
        # Never echo the text: it is (almost) a key.
        raise ConfigurationError(
            f"{where}: a key must be base64 or hex text ({len(text)} characters given could not be decoded)"
        ) from None


def _parse_text(text: str, where: str) -> tuple[dict[str, bytes], str | None]:
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(stripped)
        except ValueError:
            raise ConfigurationError(f"{where}: not valid JSON") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), dict):
            raise ConfigurationError(f'{where}: JSON key files look like {{"active": "k2", "keys": {{"k1": "<base64>"}}}}')
        found = {str(k): _decode_key_text(str(v), f"{where} key {k!r}") for k, v in doc["keys"].items()}
        active = doc.get("active")
        return found, (str(active) if active is not None else None)
    keys: dict[str, bytes] = {}
    last: str | None = None
    for raw in re.split(r"[,\n]", text):
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        if ":" in entry:
            kid, _, material = entry.partition(":")
            kid = kid.strip()
            key = _decode_key_text(material, f"{where} key {kid!r}")
        else:
            key = _decode_key_text(entry, where)
            kid = fingerprint_id(key)
        keys[kid] = key
        last = kid
    if not keys:
        raise ConfigurationError(f"{where}: no keys found (expected 'key_id:base64key' entries)")
    return keys, last


class KeyRing:
    """Named keys for one purpose; the active one seals new records, every key opens old ones.

    ``keys`` maps key id → key (bytes, or base64/hex text). ``active`` names the
    key for new records (default: the last one given). ``fetch(key_id)`` is
    asked for key ids not in the ring (a KMS lookup); it returns the key or
    ``None``. ``purpose`` is ``"encryption"`` (32-byte AES-256 keys) or
    ``"integrity"`` (32 to 64-byte MAC keys).
    """

    __slots__ = ("_active", "_fetch", "_keys", "purpose")

    def __init__(
        self,
        keys: Mapping[str, bytes | str] | None = None,
        *,
        active: str | None = None,
        fetch: Callable[[str], bytes | str | None] | None = None,
        purpose: str = "encryption",
    ) -> None:
        _check_purpose(purpose)
        self.purpose = purpose
        self._fetch = fetch
        self._keys: dict[str, bytes] = {}
        for kid, key in (keys or {}).items():
            self._keys[self._check_id(kid)] = self._check_key(kid, key)
        if active is None:
            if not self._keys:
                raise ConfigurationError(f"{purpose} key ring: no keys given")
            active = next(reversed(self._keys))
        elif active not in self._keys:
            fetched = self._lookup(active)
            if fetched is None:
                raise ConfigurationError(
                    f"{purpose} key ring: active key id {active!r} is not among the keys {sorted(self._keys)}"
                )
        self._active = active

    # -- constructors ---------------------------------------------------------

    @classmethod
    def from_env(cls, var: str | None = None, *, purpose: str = "encryption") -> KeyRing:
        """Keys from an environment variable (text form, see the module docs)."""
        _check_purpose(purpose)
        var = var or (ENV_ENCRYPTION if purpose == "encryption" else ENV_INTEGRITY)
        text = os.environ.get(var)
        if not text:
            raise ConfigurationError(
                f"{purpose} keys: environment variable {var} is not set; set it to 'key_id:<base64 key>' "
                "(python -m persistkit keygen prints one)"
            )
        keys, active = _parse_text(text, f"${var}")
        return cls(keys, active=active, purpose=purpose)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, purpose: str = "encryption") -> KeyRing:
        """Keys from a file (text form or JSON, see the module docs)."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"{purpose} keys: cannot read key file {str(p)!r} ({exc.strerror})") from exc
        keys, active = _parse_text(text, f"key file {str(p)!r}")
        return cls(keys, active=active, purpose=purpose)

    @classmethod
    def from_callable(
        cls,
        fn: Callable[[], Mapping[str, bytes | str] | Iterable[tuple[str, bytes | str]]],
        *,
        active: str | None = None,
        fetch: Callable[[str], bytes | str | None] | None = None,
        purpose: str = "encryption",
    ) -> KeyRing:
        """Keys returned by ``fn()`` (called once, now): a mapping or pairs, the last one active."""
        got = fn()
        keys = dict(got.items() if isinstance(got, Mapping) else got)
        return cls(keys, active=active, fetch=fetch, purpose=purpose)

    @classmethod
    def coerce(cls, value: Any, *, purpose: str) -> KeyRing:
        """Turn what ``connect(encryption=..., integrity=...)`` accepts into a key ring.

        ``True`` reads the default environment variable; ``"env:VAR"`` and
        ``"file:PATH"`` read those; bytes is one key; a mapping is ``{id: key}``;
        a callable is ``from_callable``; a ``KeyRing`` is used as is.
        """
        if isinstance(value, KeyRing):
            if value.purpose != purpose:
                raise ConfigurationError(f"a key ring made for {value.purpose} was given for {purpose}")
            return value
        if value is True:
            return cls.from_env(purpose=purpose)
        if isinstance(value, bytes | bytearray):
            key = bytes(value)
            return cls({fingerprint_id(key): key}, purpose=purpose)
        if isinstance(value, str):
            if value.startswith("env:"):
                return cls.from_env(value[4:], purpose=purpose)
            if value.startswith("file:"):
                return cls.from_file(value[5:].removeprefix("//"), purpose=purpose)
            raise ConfigurationError(
                f"{purpose}= takes True, 'env:VAR', 'file:PATH', key bytes, a {{id: key}} mapping, a callable "
                "or a pk.KeyRing (key text is not accepted inline, so it cannot end up in code or logs)"
            )
        if isinstance(value, Mapping):
            return cls(value, purpose=purpose)
        if callable(value):
            return cls.from_callable(value, purpose=purpose)
        raise ConfigurationError(f"{purpose}= cannot be a {type(value).__name__}")

    # -- use --------------------------------------------------------------------

    @property
    def active_id(self) -> str:
        return self._active

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def active(self) -> tuple[str, bytes]:
        """``(key id, key)`` of the key that seals new records."""
        return self._active, self.key(self._active)

    def key(self, key_id: str) -> bytes:
        """The key with this id; ``IntegrityError`` if the ring does not have it."""
        key = self._lookup(key_id)
        if key is None:
            raise IntegrityError(
                f"record sealed with {self.purpose} key id {key_id!r}, which is not in the key ring "
                f"{sorted(self._keys)}: add that key (was it retired too early?), or treat the record as forged"
            )
        return key

    def has(self, key_id: str) -> bool:
        return self._lookup(key_id) is not None

    def _lookup(self, key_id: str) -> bytes | None:
        key = self._keys.get(key_id)
        if key is None and self._fetch is not None and _KID.match(key_id):
            got = self._fetch(key_id)
            if got is not None:
                key = self._check_key(key_id, got)
                self._keys[key_id] = key
        return key

    def _check_id(self, kid: str) -> str:
        if not isinstance(kid, str) or not _KID.match(kid):
            raise ConfigurationError(
                f"{self.purpose} key id {kid!r}: use 1-32 characters from A-Z a-z 0-9 . _ -"
            )
        return kid

    def _check_key(self, kid: str, key: bytes | str) -> bytes:
        if isinstance(key, str):
            key = _decode_key_text(key, f"{self.purpose} key {kid!r}")
        if not isinstance(key, bytes | bytearray):
            raise ConfigurationError(f"{self.purpose} key {kid!r} must be bytes or base64/hex text")
        lo, hi = _PURPOSES[self.purpose]
        if not lo <= len(key) <= hi:
            want = f"{lo}" if lo == hi else f"{lo} to {hi}"
            raise ConfigurationError(f"{self.purpose} key {kid!r} is {len(key)} bytes; it must be {want} bytes")
        return bytes(key)

    def __repr__(self) -> str:  # never the keys themselves
        return f"KeyRing(purpose={self.purpose!r}, ids={list(self._keys)!r}, active={self._active!r})"
