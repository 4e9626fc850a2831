"""What the sealing wrappers tell about the store's other options (no crypto, no I/O).

* :func:`offloaded`: encryption and integrity sit *above* offload (``wrappers``'
  ``ORDER``), so a store written with ``blobs=`` holds offload's plaintext pointer
  (:data:`MARKER`) where such a wrapper expects its own envelope whenever it is
  opened without ``blobs=``. That is a missing option (``StoreOptionsError``
  naming ``blobs=``), not a forged or damaged record.
"""

from __future__ import annotations

from .._errors import StoreOptionsError

__all__ = ["MARKER", "offloaded"]

#: persistkit.wrappers._offload._MARKER: what the store holds in place of an offloaded value
MARKER = b"\x00PKREF1:"


def offloaded(at: str, opened_with: str) -> StoreOptionsError:
    """An offload pointer met by the ``opened_with`` wrapper (``"encryption="``, ...)."""
    return StoreOptionsError(
        f"{at}: the record was offloaded to a blob store (the store holds only a pointer to it) "
        f"and this store was opened with {opened_with} but without blobs=: open it with "
        "pk.connect(url, blobs=<the blob store's URL>, ...) and its other options, as it was written"
    )
