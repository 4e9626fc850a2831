"""A third-party store (tests/plain_store.py: the bare protocol, no leases) passes the shipped suites."""

from __future__ import annotations

from pathlib import Path

import plain_store  # noqa: F401 -- registers plainfile://
import pytest

from persistkit.testing.backend_suite import BackendConformance
from persistkit.testing.store_suite import StoreConformance


@pytest.fixture
def persistkit_url(tmp_path: Path) -> str:
    return f"plainfile://{tmp_path}/store.json"


class TestPlainStore(BackendConformance, StoreConformance):
    pass
