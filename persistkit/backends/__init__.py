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
from urllib.parse import unquote_plus, urlsplit

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
    "split_connect_options",
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
    "dynamodb": ("persistkit.backends.dynamodb", "DynamoBackend", "dynamodb", "boto3"),
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
            "'memory://', 'postgresql://host/db', 'redis://host:6379/0', 's3://bucket/prefix' or "
            "'dynamodb://table?region=…'"
        )
    scheme = urlsplit(url).scheme.lower()
    if scheme in _REGISTERED:
        return _REGISTERED[scheme]
    if scheme not in _BUILTIN:
        schemes = sorted({*_BUILTIN, *_REGISTERED})
        # the same close-match rule as unknown_options() uses for an option typo
        close = difflib.get_close_matches(scheme, schemes, 1, 0.75)
        hint = f" Did you mean '{close[0]}://'?" if close else ""
        raise BackendNotFoundError(
            f"no store is registered for the URL scheme {scheme!r} in {_mask(url)!r}.{hint} "
            f"The known schemes: {', '.join(schemes)}. Third-party stores register with "
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
    "vault", "encryption", "accept_plaintext", "integrity", "witness", "max_value_bytes",
)


_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})
_BOOLS = ("redact", "allow_pickle", "accept_plaintext")
_SIZES = ("blob_threshold", "compress_threshold", "max_value_bytes")
_KEYS = ("encryption", "integrity")


def split_connect_options(url: str) -> tuple[str, dict[str, Any]]:
    """``pk.connect()``'s own options taken out of ``url``'s query, typed: the URL
    without them (what the store is opened with) and ``{option: value}``.

    Booleans are ``true``/``false`` (also ``1/0``, ``yes/no``, ``on/off``), sizes
    positive integers (bytes), ``allow_modules`` a comma-separated list of module
    names, ``encryption``/``integrity`` ``true`` (keys from the environment),
    ``env:VAR`` or ``file:PATH`` (never key text: a URL is logged and shown),
    ``blobs`` and ``witness`` a store URL (percent-encoded) or, for the witness,
    ``file:PATH``. ``vault`` is an object: keyword only.
    """
    base, sep, query = url.partition("?")
    if not sep:
        return url, {}
    query, hash_sep, fragment = query.partition("#")
    kept: list[str] = []
    found: dict[str, Any] = {}
    for piece in query.split("&"):
        raw_name, _, raw_value = piece.partition("=")
        name = unquote_plus(raw_name)
        if name not in CONNECT_OPTIONS:
            kept.append(piece)
            continue
        if name in found:
            raise ConfigurationError(f"option {name!r} is given twice in the URL {_mask(url)!r}")
        found[name] = _connect_option(name, unquote_plus(raw_value), url)
    rest = "&".join(p for p in kept if p)
    return base + (f"?{rest}" if rest else "") + (hash_sep + fragment), found


def _connect_option(name: str, text: str, url: str) -> Any:
    def bad(expected: str) -> ConfigurationError:
        # a key source's value may be key text pasted by mistake: never echo it (nor the URL)
        shown = f"{name}=<{len(text)} characters> in the store URL" if name in _KEYS else (
            f"{name}={text!r} in the URL {_mask(url)!r}"
        )
        return ConfigurationError(f"{shown}: expected {expected}")

    low = text.strip().lower()
    if name in _BOOLS:
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise bad("true or false")
    if name in _SIZES:
        if text.strip().isdigit() and int(text) >= 1:
            return int(text)
        raise bad("a positive integer (bytes)")
    if name == "allow_modules":
        modules = tuple(m.strip() for m in text.split(",") if m.strip())
        if all(all(part.isidentifier() for part in m.split(".")) for m in modules):
            return modules
        raise bad("comma-separated module names, e.g. allow_modules=myapp.models,myapp.tools")
    if name in _KEYS:
        if low in _FALSE:
            return False  # off, even with $PERSISTKIT_*_KEYS set (pk.connect reads them otherwise)
        if low in _TRUE:
            return True
        if text.startswith(("env:", "file:")) and len(text) > len("file:"):
            return text
        raise bad(
            f"true (keys from ${'PERSISTKIT_ENCRYPTION_KEYS' if name == 'encryption' else 'PERSISTKIT_INTEGRITY_KEYS'}), "
            "env:VAR or file:PATH; key text never goes in a URL (pass it as a keyword)"
        )
    if name == "blobs":
        if "://" in text:
            return text
        raise bad("a store URL, percent-encoded, e.g. blobs=s3%3A%2F%2Fbucket%2Fblobs")
    if name == "witness":
        if "://" in text or text.startswith("file:"):
            return text
        raise bad("file:PATH or a store URL (percent-encoded)")
    raise ConfigurationError(
        f"{name}= cannot be given in the URL {_mask(url)!r}: it is an object; pass it as a keyword, "
        f"pk.connect(url, {name}=...)"
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
    own = [n for n in names if n in CONNECT_OPTIONS]
    if own:
        # pk.connect() takes these out of the URL itself: they reached the store because
        # it was opened some other way (open_backend, a backend's from_url)
        return ConfigurationError(
            f"{', '.join(map(repr, own))} {'is an option' if len(own) == 1 else 'are options'} of "
            f"pk.connect(), not of the {store} store {_mask(url)!r}: open it with "
            f"pk.connect({_mask(url)!r}), which reads them from the URL too"
        )
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
