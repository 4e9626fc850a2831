"""The shipped prune conformance checks (persistkit.testing.prune_suite) on every store."""

from __future__ import annotations

from persistkit.testing import PruneConformance


class TestPrune(PruneConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""
