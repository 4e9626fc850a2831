"""Conformance suites a store must pass (they need pytest).

``BackendConformance`` checks the byte-level primitives of a backend;
``StoreConformance`` checks the end-to-end contract (steps, replay, runs,
history, fork, conflicts) through ``pk.connect``. Subclass either in your
test suite and provide a ``persistkit_url`` fixture; see docs/backends.md.
"""

from .backend_suite import BackendConformance
from .store_suite import StoreConformance

__all__ = ["BackendConformance", "StoreConformance"]
