"""The shipped message and event conformance checks (persistkit.testing.messages_suite) on every store."""

from __future__ import annotations

from persistkit.testing.messages_suite import MessagesConformance


class TestMessages(MessagesConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""
