"""Every backend against the shipped conformance suite (``persistkit_url`` comes from conftest)."""

import pytest

from persistkit.testing.backend_suite import BackendConformance

# Known departures from the protocol, found by the suite. Strict: the test fails
# as soon as the store is fixed, so this entry must go with the fix.
# (Redis and S3 accepted a reused checkpoint id until #13's session fixed both.)
KNOWN_GAPS: dict[tuple[str, str], str] = {}


def mark_known_gaps(request: pytest.FixtureRequest) -> None:
    callspec = getattr(request.node, "callspec", None)
    kind = callspec.params.get("store_url") if callspec else None
    reason = KNOWN_GAPS.get((kind, request.node.originalname))
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


@pytest.fixture(autouse=True)
def _known_gaps(request: pytest.FixtureRequest) -> None:
    mark_known_gaps(request)


class TestBackends(BackendConformance):
    pass
