"""Backends, registered by URL scheme and imported lazily.

``import persistkit`` imports no database driver. A backend module is
imported the first time a URL with its scheme is opened; if its driver is
missing, :class:`~persistkit.BackendNotFoundError` names the extra to install.
Third-party stores register with :func:`register_backend`.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from .._errors import BackendNotFoundError, ConfigurationError
from ._protocol import Backend, CheckpointRow, Head, LeaseRecord, ThreadedAsync

__all__ = [
    "Backend",
    "CheckpointRow",
    "Head",
    "LeaseRecord",
    "ThreadedAsync",
    "open_backend",
    "register_backend",
]

# scheme -> (module path, class name, extra that installs its driver, driver module)
_BUILTIN: dict[str, tuple[str, str, str | None, str | None]] = {
    "memory": ("persistkit.backends.memory", "MemoryBackend", None, None),
    "sqlite": ("persistkit.backends.sqlite", "SQLiteBackend", None, None),
    "postgresql": ("persistkit.backends.postgres", "PostgresBackend", "postgres", "psycopg"),
    "postgres": ("persistkit.backends.postgres", "PostgresBackend", "postgres", "psycopg"),
    "redis": ("persistkit.backends.redis", "RedisBackend", "redis", "redis"),
    "rediss": ("persistkit.backends.redis", "RedisBackend", "redis", "redis"),
    "s3": ("persistkit.backends.s3", "S3Backend", "s3", "boto3"),
}

_REGISTERED: dict[str, type[Backend]] = {}


def register_backend(scheme: str, backend: type[Backend]) -> None:
    """Make ``pk.connect("<scheme>://...")`` open ``backend``."""
    if not scheme or not scheme.isascii() or not scheme.replace("+", "").isalnum():
        raise ConfigurationError(f"invalid URL scheme {scheme!r}: use letters and digits")
    if not (isinstance(backend, type) and issubclass(backend, Backend)):
        raise ConfigurationError(
            f"{backend!r} is not a persistkit.backends.Backend subclass"
        )
    _REGISTERED[scheme.lower()] = backend


def backend_class(url: str) -> type[Backend]:
    """The backend class for ``url``'s scheme, importing its module on first use."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"invalid store URL {url!r}: expected '<scheme>://...', e.g. 'sqlite:///agent.db', "
            "'memory://', 'postgresql://host/db', 'redis://host:6379/0' or 's3://bucket/prefix'"
        )
    scheme = urlsplit(url).scheme.lower()
    if scheme in _REGISTERED:
        return _REGISTERED[scheme]
    if scheme not in _BUILTIN:
        known = ", ".join(sorted({*_BUILTIN, *_REGISTERED}))
        raise BackendNotFoundError(
            f"no store is registered for the URL scheme {scheme!r} in {_mask(url)!r}; "
            f"known schemes: {known}. Third-party stores register with "
            "persistkit.backends.register_backend()."
        )
    module_name, class_name, extra, driver = _BUILTIN[scheme]
    if driver is not None:
        try:
            importlib.import_module(driver)
        except ImportError as exc:
            raise BackendNotFoundError(
                f"the {scheme!r} store needs the {driver!r} package, which is not installed: "
                f"pip install 'persistkit[{extra}]'"
            ) from exc
    module = importlib.import_module(module_name)
    cls: type[Backend] = getattr(module, class_name)
    return cls


def open_backend(url: str, **options: Any) -> Backend:
    """Open the backend named by ``url`` with backend-specific ``options``."""
    return backend_class(url).from_url(url, **options)


#: What replaces a password in a shown URL: the handle the secret scrubber gives
#: a URL password in messages, so ``store.url``, reprs and errors read the same.
URL_PASSWORD_MASK = "$CRED{url_password}"

#: The options ``pk.connect()`` takes itself (every other keyword goes to the store).
CONNECT_OPTIONS = (
    "blobs", "blob_threshold", "allow_pickle", "allow_modules", "compress_threshold", "redact",
    "vault", "encryption", "accept_plaintext", "integrity", "witness",
)


def _mask(url: str) -> str:
    """``url`` with any password replaced by :data:`URL_PASSWORD_MASK` (safe for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":" + URL_PASSWORD_MASK + "@", 1)
    return parts._replace(netloc=netloc).geturl()


mask_url = _mask


def unknown_options(
    store: str, url: str, unknown: Iterable[str], accepted: Sequence[str], passthrough: str = ""
) -> ConfigurationError:
    """The one error for options a store does not take: names them, lists what
    ``store`` accepts (and ``passthrough``, what else goes to its driver) and
    ``pk.connect()``'s own options, with a close match when there is one."""
    names = sorted(set(unknown))
    known = [*accepted, *CONNECT_OPTIONS]
    close = {n: m[0] for n in names if (m := difflib.get_close_matches(n, known, 1, 0.75))}
    hint = "".join(f" Did you mean {m!r} for {n!r}?" for n, m in close.items())
    return ConfigurationError(
        f"unknown option(s) {', '.join(map(repr, names))} for the {store} store {_mask(url)!r}.{hint} "
        f"The store's options, in the URL query or as keywords: "
        + (f"accepted: {', '.join(accepted)}" if accepted else "none")
        + (f"; {passthrough}" if passthrough else "")
        + f". pk.connect() itself takes: {', '.join(CONNECT_OPTIONS)}"
    )
