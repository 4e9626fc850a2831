"""The shipped stream conformance checks (persistkit.testing.stream_suite) on every store."""

from __future__ import annotations

from persistkit.testing.stream_suite import StreamConformance


class TestStreams(StreamConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""
