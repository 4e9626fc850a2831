"""The shipped conformance suites, run through the integrity wrapper: sealing must not
change any behaviour the protocol and the store promise."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_backend_conformance import mark_known_gaps

import persistkit as pk
from persistkit.backends import Backend, open_backend
from persistkit.testing.backend_suite import BackendConformance
from persistkit.testing.store_suite import StoreConformance
from persistkit.wrappers._integrity import IntegrityBackend
from persistkit.wrappers._keys import KeyRing

KEY = bytes(range(32))


@pytest.fixture(autouse=True)
def _known_gaps(request: pytest.FixtureRequest) -> None:
    mark_known_gaps(request)  # the stores' gaps show through the wrapper too


class TestIntegrityBackend(BackendConformance):
    @pytest.fixture
    def open_another(
        self, persistkit_url: str, backend_options: dict[str, Any]
    ) -> Iterator[Callable[[], Backend]]:
        opened: list[Backend] = []

        def _open() -> Backend:
            b = IntegrityBackend(open_backend(persistkit_url, **backend_options),
                                 KeyRing({"k1": KEY}, purpose="integrity"))
            opened.append(b)
            return b

        yield _open
        for b in opened:
            b.close()

    def test_declares_schemes_and_flags(self, backend: Backend) -> None:
        pytest.skip("a wrapper is not registered under a URL scheme")


class TestIntegrityStore(StoreConformance):
    @pytest.fixture
    def store(self, persistkit_url: str) -> Iterator[pk.Store]:
        pk.set_testing(True)
        s = pk.connect(persistkit_url, integrity=KEY)
        yield s
        s.close()
