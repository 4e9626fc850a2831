"""The shipped rate limit conformance checks (persistkit.testing.limits_suite) on every store."""

from __future__ import annotations

from persistkit.testing.limits_suite import LimitsConformance


class TestLimits(LimitsConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""
