"""The shipped lease conformance checks (persistkit.testing.lease_suite) on every store."""

from __future__ import annotations

from persistkit.testing.lease_suite import LeaseConformance


class TestLeases(LeaseConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""
