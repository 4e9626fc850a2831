"""The shipped patch conformance checks (persistkit.testing.patch_suite) on every store."""

from __future__ import annotations

from persistkit.testing.patch_suite import PatchConformance


class TestPatches(PatchConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""
