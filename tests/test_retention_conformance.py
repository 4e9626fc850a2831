"""The shipped retention checks (persistkit.testing.retention_suite) on every store, plain
and with all three wrappers stacked (offload, encryption, integrity): what a prune keeps
must load, resume and verify through each of them."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from persistkit.testing import RetentionConformance


class TestRetention(RetentionConformance):
    """``persistkit_url`` comes from conftest: one fresh store per backend."""

    @pytest.fixture(autouse=True)
    def _examples(self, persistkit_url: str) -> None:
        # The random histories cost ~25x memory's on moto's S3 and DynamoDB (every read and
        # write an HTTP request to one Python process: 168 s for 25 examples on S3): 6 there,
        # as the all-wrappers class runs everywhere; 25 on the other stores (issue #35).
        self.retention_examples = 6 if persistkit_url.startswith(("s3:", "dynamodb:")) else 25


class TestRetentionAllWrappers(RetentionConformance):
    retention_examples = 6

    @pytest.fixture
    def backend_options(self) -> dict[str, Any]:
        return {
            "encryption": {"k1": bytes(range(32))},
            "integrity": {"m1": bytes(range(40, 72))},
            "blobs": f"memory://retention-blobs-{uuid.uuid4().hex[:12]}",
            "blob_threshold": 512,
        }
