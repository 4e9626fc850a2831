"""The end-to-end store contract, run over every backend (see tests/conftest.py)."""

from persistkit.testing.store_suite import StoreConformance


class TestStores(StoreConformance):
    pass
