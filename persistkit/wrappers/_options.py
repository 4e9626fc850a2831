"""What the sealing wrappers tell about the store's other options (no crypto, no I/O).

* :func:`offloaded`: encryption and integrity sit *above* offload (``wrappers``'
  ``ORDER``), so a store written with ``blobs=`` holds offload's plaintext pointer
  (:data:`MARKER`) where such a wrapper expects its own envelope whenever it is
  opened without ``blobs=``. That is a missing option (``StoreOptionsError``
  naming ``blobs=``), not a forged or damaged record.
* :func:`command_url`: the ``--url`` that ``persistkit`` verbs open a wrapped store
  with (the store's masked URL, with ``blobs=`` and ``witness=`` when it has them), for the ways forward
  an error names; a wrapper's own ``url`` is a display name, not a URL.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from .._errors import StoreOptionsError
from ..backends import Backend, mask_url

__all__ = ["ENCRYPTED", "MARKER", "command_url", "offloaded"]

#: The first byte of an encrypted record (``wrappers._encryption.MAGIC``), which the
#: integrity wrapper meets when encryption sits above it and the store was opened without it
ENCRYPTED = 0xE1

#: What the store holds in place of a value offload moved to its blob store (``wrappers._offload``)
MARKER = b"\x00PKREF1:"


def offloaded(at: str, opened_with: str) -> StoreOptionsError:
    """An offload pointer met by the ``opened_with`` wrapper (``"encryption="``, ...)."""
    return StoreOptionsError(
        f"{at}: the record was offloaded to a blob store (the store holds only a pointer to it) "
        f"and this store was opened with {opened_with} but without blobs=: open it with "
        "pk.connect(url, blobs=<the blob store's URL>, ...) and its other options, as it was written",
        option="blobs",
    )


def command_url(backend: Any) -> str:
    """The URL a ``persistkit`` verb opens ``backend``'s store with: the innermost store's
    masked URL, plus ``blobs=`` when an offload wrapper is in the stack and ``witness=`` when
    the (outermost) integrity wrapper has a file or store witness, both percent-encoded.
    Keys are not in it: the verbs take them from ``$PERSISTKIT_*_KEYS``."""
    extra: dict[str, str] = {}
    witness = _witness_source(getattr(backend, "witness", None))
    current = backend
    for _ in range(16):
        blobs = getattr(current, "blobs", None)  # OffloadBackend's blob store (not imported: _offload needs _kv)
        if isinstance(blobs, Backend):
            extra["blobs"] = mask_url(str(blobs.url))
        below = getattr(current, "inner", None)
        if below is None or below is current:
            break
        current = below
    if witness is not None:
        extra["witness"] = witness
    url = mask_url(str(current.url))
    if not extra:
        return url
    base, hash_sep, fragment = url.partition("#")
    query = "&".join(f"{name}={quote(value, safe='')}" for name, value in extra.items())
    return f"{base}{'&' if '?' in base else '?'}{query}{hash_sep}{fragment}"


def _witness_source(witness: Any) -> str | None:
    """``witness=`` as a URL option names it (a file or a store), or None (none, or a callback)."""
    from ._witness import FileWitness, StoreWitness

    if isinstance(witness, FileWitness):
        return f"file:{witness.path.absolute()}"
    if isinstance(witness, StoreWitness):
        return mask_url(str(witness.backend.url))
    return None
