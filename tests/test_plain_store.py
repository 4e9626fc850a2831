"""A third-party store (tests/plain_store.py: the bare protocol, no leases) passes the shipped suites."""

from __future__ import annotations

from pathlib import Path

import plain_store  # noqa: F401 -- registers plainfile://
import pytest

from persistkit.testing import LongRunsConformance
from persistkit.testing.backend_suite import BackendConformance
from persistkit.testing.lease_suite import LeaseConformance
from persistkit.testing.store_suite import StoreConformance


@pytest.fixture
def persistkit_url(tmp_path: Path) -> str:
    return f"plainfile://{tmp_path}/store.json"


class TestPlainStore(BackendConformance, StoreConformance):
    pass


class TestPlainStoreLongRuns(LongRunsConformance):
    pass


class TestLeasedPlainStore(LeaseConformance, LongRunsConformance):
    """The same store with the lease primitives: leases, turns and the long runs under them."""

    @pytest.fixture
    def persistkit_url(self, tmp_path: Path) -> str:
        return f"plainleased://{tmp_path}/store.json"


def test_a_store_without_kv_refuses_a_board_and_says_what_to_do(tmp_path: Path) -> None:
    import persistkit as pk
    from persistkit.testing import KvConformance  # noqa: F401 -- named in the message's advice

    store = pk.connect(f"plainfile://{tmp_path}/store.json")
    assert not store.backend.supports_kv
    with pytest.raises(pk.ConfigurationError) as info:
        store.board()
    text = str(info.value)
    assert "'kv' capability" in text and "store.board()" in text and "kv_write" in text and "postgresql" in text
