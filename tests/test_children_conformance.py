"""The shipped child-run conformance checks (persistkit.testing.children_suite) on every store."""

from __future__ import annotations

from persistkit.testing.children_suite import ChildrenConformance


class TestChildren(ChildrenConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""
