"""A local encrypted vault file: where detected secrets go so a resumed run can have them back.

The vault is kept apart from the checkpoint store: the store holds handles
(``$CRED{openai-3f9a...}``), the vault holds what they stand for, each value
sealed with AES-256-GCM (the ``cryptography`` package, ``persistkit[crypto]``)
under the vault key, with the handle name as authenticated data (a sealed
value moved to another name fails to open). The file is rewritten atomically
(temporary file, fsync, rename), so a crash leaves the old or the new file.

File format (JSON)::

    {"persistkit_vault": 1, "entries": {"<name>": {"t": "s" | "b", "c": "<base64 nonce+ciphertext>"}}}
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._errors import BackendNotFoundError, ConfigurationError, IntegrityError

__all__ = ["FileVault"]

_FORMAT = 1


def _aesgcm(key: bytes) -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:
        raise BackendNotFoundError(
            "pk.secrets.FileVault encrypts with the 'cryptography' package, which is not "
            'installed: pip install "persistkit[crypto]"'
        ) from exc
    return AESGCM(key)


def _key_bytes(key: bytes | str | None) -> bytes:
    if key is None:
        raise ConfigurationError(
            "FileVault needs a key: 32 random bytes, or their base64 text "
            "(make one with pk.secrets.FileVault.generate_key()); keep it outside the store"
        )
    if isinstance(key, str):
        try:
            raw = base64.b64decode(key.strip(), validate=True)
        except ValueError as exc:
            raise ConfigurationError("FileVault key text must be base64 of 32 bytes") from exc
    elif isinstance(key, bytes | bytearray):
        raw = bytes(key)
    else:
        raise ConfigurationError(f"FileVault key must be bytes or base64 text, got {type(key).__name__}")
    if len(raw) != 32:
        raise ConfigurationError(f"FileVault key must be 32 bytes (AES-256), got {len(raw)}")
    return raw


class FileVault:
    """An AES-256-GCM encrypted file of secrets, keyed by handle name.

    ``key`` is 32 bytes or their base64 text; ``key_env`` names an environment
    variable holding that text instead. The key also keys the names of
    detected secrets' handles, so the same secret gets the same handle in every
    process that uses this vault.
    """

    def __init__(self, path: str | os.PathLike[str], *, key: bytes | str | None = None, key_env: str | None = None) -> None:
        if key is None and key_env is not None:
            key = os.environ.get(key_env)
            if key is None:
                raise ConfigurationError(f"FileVault key_env: environment variable {key_env} is not set")
        self._key = _key_bytes(key)
        self._aead = _aesgcm(self._key)
        self.path = Path(path)
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, str]] | None = None
        self._mtime: float | None = None

    def __repr__(self) -> str:
        return f"<persistkit.secrets.FileVault {str(self.path)!r}>"

    @staticmethod
    def generate_key() -> str:
        """A new random vault key, as base64 text."""
        return base64.b64encode(os.urandom(32)).decode("ascii")

    def handle_key(self) -> bytes:
        """The key that names detected secrets' handles (derived, never the encryption key itself)."""
        return hashlib.blake2b(self._key, digest_size=32, person=b"pk-handle-name").digest()

    # -- entries ------------------------------------------------------------------

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._load())

    def get(self, name: str) -> str | bytes | None:
        """The value stored under ``name``, or None."""
        with self._lock:
            entry = self._load().get(name)
            if entry is None:
                self._entries = None  # another process may have added it since: reread once
                entry = self._load().get(name)
        if entry is None:
            return None
        try:
            blob = base64.b64decode(entry["c"], validate=True)
            raw: bytes = self._aead.decrypt(blob[:12], blob[12:], name.encode("utf-8"))
        except Exception as exc:  # InvalidTag, bad base64, short blob: all mean "not ours"
            raise IntegrityError(
                f"vault {self.path}: the entry for handle $CRED{{{name}}} does not decrypt with "
                "this key (wrong key, or the file was edited)"
            ) from exc
        return raw if entry.get("t") == "b" else raw.decode("utf-8")

    def put(self, name: str, value: str | bytes) -> None:
        """Store ``value`` under ``name`` and rewrite the file atomically."""
        raw = value if isinstance(value, bytes) else value.encode("utf-8")
        nonce = os.urandom(12)
        sealed = nonce + self._aead.encrypt(nonce, raw, name.encode("utf-8"))
        entry = {"t": "b" if isinstance(value, bytes) else "s", "c": base64.b64encode(sealed).decode("ascii")}
        with self._lock, self._file_lock():
            self._entries = None  # merge with what other processes wrote
            entries = dict(self._load())
            entries[name] = entry
            self._write(entries)
            self._entries = entries

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        """Serialize read-merge-write across processes (else two writers lose an entry)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(self.path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                import fcntl
            except ImportError:  # pragma: no cover - Windows: in-process lock only
                yield
                return
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _load(self) -> dict[str, dict[str, str]]:
        if self._entries is not None:
            return self._entries
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            self._entries = {}
            return self._entries
        except OSError as exc:
            raise ConfigurationError(f"cannot read vault file {self.path}: {exc.strerror}") from exc
        try:
            doc = json.loads(text)
            if doc.get("persistkit_vault") != _FORMAT or not isinstance(doc.get("entries"), dict):
                raise ValueError("not a persistkit vault")
        except (ValueError, AttributeError) as exc:
            raise IntegrityError(f"vault file {self.path} is not a persistkit vault (or is corrupt)") from exc
        self._entries = doc["entries"]
        return self._entries

    def _write(self, entries: dict[str, dict[str, str]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"persistkit_vault": _FORMAT, "entries": entries}, sort_keys=True).encode()
        import tempfile  # ~10 ms to import: only when a vault is written

        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
