"""The optional capabilities of a store: their names, how each is detected, and ``require``.

A store declares what it has in ``Backend.capabilities``; a wrapper (encryption,
integrity, offload) has what its inner store has. The conformance suite
(``persistkit.testing``) fails a store whose declaration and overridden methods
disagree, so a layer may trust ``has``: it asks the methods, which wrappers forward.
"""

from __future__ import annotations

from .._errors import ConfigurationError
from ._protocol import Backend

__all__ = ["BUILT_IN", "NAMES", "declared", "detected", "has", "require"]

#: capability -> the primitive methods a store overrides to have it
NAMES: dict[str, tuple[str, ...]] = {
    "leases": ("lease_get", "lease_swap", "lease_list"),
    "fencing": ("write_fenced",),
    "kv": ("kv_get", "kv_history", "kv_list", "kv_write", "kv_drop"),
    "watch": ("watch_open",),
    "prune": ("prune_rows", "delete_blobs", "blob_sizes"),
}

#: capability -> the built-in stores that have it (for the error's "ways forward")
BUILT_IN: dict[str, tuple[str, ...]] = {
    "leases": ("memory", "sqlite", "postgresql", "redis", "s3", "dynamodb"),
    "fencing": ("memory", "sqlite", "postgresql", "redis", "s3", "dynamodb"),
    "kv": ("memory", "sqlite", "postgresql", "redis", "s3", "dynamodb"),
    "watch": ("memory", "sqlite", "postgresql", "redis", "s3", "dynamodb"),
    "prune": ("memory", "sqlite", "postgresql", "redis", "s3", "dynamodb"),
}


def detected(backend: Backend) -> frozenset[str]:
    """The capabilities whose primitive methods ``backend``'s class overrides."""
    cls = type(backend)
    return frozenset(
        name for name, methods in NAMES.items() if all(getattr(cls, m) is not getattr(Backend, m) for m in methods)
    )


def declared(backend: Backend) -> frozenset[str]:
    return type(backend).capabilities


def has(backend: Backend, name: str) -> bool:
    """Whether ``backend`` (a store or a wrapper over one) has capability ``name``."""
    if name not in NAMES:
        raise ConfigurationError(f"unknown store capability {name!r}; known: {', '.join(sorted(NAMES))}")
    if name in ("leases", "fencing"):
        return backend.supports_leases
    if name == "kv":
        return backend.supports_kv
    if name == "prune":
        return backend.supports_prune
    return backend.supports_watch


def require(backend: Backend, name: str, needed_by: str) -> None:
    """Raise ``ConfigurationError`` unless ``backend`` has ``name``: names the store, the
    capability, what needs it and the built-in stores that have it."""
    if has(backend, name):
        return
    raise ConfigurationError(
        f"the store {type(backend).__name__} ({backend.url or 'no URL'}) does not have the "
        f"{name!r} capability, which {needed_by} needs. The built-in stores that have it: "
        f"{', '.join(BUILT_IN.get(name, ()))}; a third-party store implements "
        f"{', '.join(NAMES[name])} (see persistkit.backends.Backend) and passes persistkit.testing's suite for it."
    )
