"""Wrappers: Backends that stack on any store and seal or move its bytes.

Each wrapper is itself a :class:`~persistkit.backends.Backend` around another
one, so it works on every store and covers every record whatever wrote it:

=================  ===============================  =========================================
module             ``pk.connect`` option            what it does
=================  ===============================  =========================================
``_offload``       ``blobs=``, ``blob_threshold=``  large blobs to a second store, a pointer in the first
``_encryption``    ``encryption=``                  AES-256-GCM on every row payload and blob; key rotation
``_integrity``     ``integrity=``, ``witness=``     keyed hash chain per thread, checked on every read
``_witness``       (``witness=``)                   the newest head tag per thread, kept outside the store
``_verify``        (``store.verify``)               offline walk of an integrity store's chains
``_kv``            (the three above)                kv values sealed, tagged and moved like records
=================  ===============================  =========================================

:func:`stack` is the one place that puts them together, innermost first
(:data:`ORDER`)::

    store  <-  offload  <-  encryption  <-  integrity
    (innermost)                             (outermost)

* offload inside encryption: what goes to the blob store is already sealed,
  so the blob store never sees plaintext;
* integrity outside encryption: its tags cover plaintext, so rotating
  encryption keys re-seals bytes without re-chaining any thread.

The module paths are not API: users reach these through ``pk.connect`` options
and the names ``persistkit`` re-exports (``pk.FileWitness``, ``pk.Witness``,
``pk.WitnessEntry``, ``pk.RotationReport``, ``pk.IntegrityReport``,
``pk.IntegrityProblem``). Each wrapper module is imported only when its option
is used, so ``import persistkit`` stays cheap.
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigurationError
from ..backends import Backend, open_backend

__all__ = ["ORDER", "stack"]

ORDER = ("offload", "encryption", "integrity")
"""The wrappers :func:`stack` applies, innermost first."""


def stack(
    backend: Backend,
    *,
    blobs: str | Backend | None = None,
    blob_threshold: int = 256 * 1024,
    encryption: Any = None,
    accept_plaintext: bool = False,
    integrity: Any = None,
    witness: Any = None,
) -> Backend:
    """``backend`` wrapped as ``pk.connect``'s options ask, in :data:`ORDER`."""
    # -- offload (innermost) -------------------------------------------------------------
    if blobs is not None:
        from ._offload import OffloadBackend

        if not isinstance(blob_threshold, int) or blob_threshold < 1:
            raise ConfigurationError(f"blob_threshold must be a positive int, got {blob_threshold!r}")
        blob_backend = blobs if isinstance(blobs, Backend) else open_backend(blobs)
        backend = OffloadBackend(backend, blob_backend, threshold=blob_threshold)
    # -- encryption: wraps offload, so offloaded objects are sealed too ------------------
    if encryption is not None and encryption is not False:
        from ._encryption import EncryptedBackend
        from ._keys import KeyRing

        keyring = KeyRing.coerce(encryption, purpose="encryption")
        backend = EncryptedBackend(backend, keyring, accept_plaintext=accept_plaintext)
    elif accept_plaintext:
        raise ConfigurationError("accept_plaintext=True only applies together with encryption=...")
    # -- integrity (outermost): its tags cover plaintext ------------------------------------
    if integrity is not None and integrity is not False:
        from ._integrity import wrap_integrity

        backend = wrap_integrity(backend, integrity, witness)
    elif witness is not None:
        raise ConfigurationError("witness= needs integrity= (the witness records integrity tags)")
    return backend
