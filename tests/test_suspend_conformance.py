"""The shipped suspend conformance checks (persistkit.testing.suspend_suite) on every store."""

from __future__ import annotations

from persistkit.testing.suspend_suite import SuspendConformance


class TestSuspend(SuspendConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""
