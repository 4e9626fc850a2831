"""Every backend against the shipped conformance suite (``persistkit_url`` comes from conftest)."""

from persistkit.testing.backend_suite import BackendConformance


class TestBackends(BackendConformance):
    pass
