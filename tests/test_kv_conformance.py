"""The shipped kv and watch conformance checks (persistkit.testing.kv_suite, watch_suite) on every store."""

from __future__ import annotations

from persistkit.testing import KvConformance, WatchConformance


class TestKv(KvConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""


class TestWatch(WatchConformance):
    """``persistkit_url`` comes from conftest."""
