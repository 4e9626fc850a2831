"""The shipped saga conformance checks (persistkit.testing.saga_suite) on every store."""

from __future__ import annotations

from persistkit.testing.saga_suite import SagaConformance


class TestSagas(SagaConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""
