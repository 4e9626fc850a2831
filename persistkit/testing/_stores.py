"""The fixtures the store-level conformance suites share (turns, suspend, sagas, outbox, patches).

``backend_options``: keyword options for opening the store (a subclass overrides it to
configure its store); ``stores``: two ``pk.Store`` objects opened on ``persistkit_url``, as
two processes see one store (what one writes, the other reads).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..engine._store import Store, connect

__all__ = ["TwoStores"]


class TwoStores:
    """Mixed into a conformance suite that needs a test class providing ``persistkit_url``."""

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        return {}

    @pytest.fixture
    def stores(self, persistkit_url: str, backend_options: dict[str, Any]) -> Iterator[tuple[Store, Store]]:
        a, b = connect(persistkit_url, **backend_options), connect(persistkit_url, **backend_options)
        yield a, b
        a.close()
        b.close()
