"""The shipped outbox conformance checks (persistkit.testing.outbox_suite) on every store."""

from __future__ import annotations

from persistkit.testing.outbox_suite import OutboxConformance


class TestOutbox(OutboxConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""
