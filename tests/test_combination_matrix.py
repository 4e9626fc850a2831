"""The combination matrix (persistkit.testing.combination_suite) over every store.

memory:// runs its jobs inline (a crash is an exception); the other stores run
each job in a new process, the crash a real SIGKILL. Adapter-state migrations
(tests/adapters/matrix_adapter_features.py) join the design where their
framework is installed.
"""

import sys
from pathlib import Path

import pytest

from persistkit.testing import CombinationConformance

sys.path.insert(0, str(Path(__file__).resolve().parent / "adapters"))


class TestCombinations(CombinationConformance):
    combination_modules = ("matrix_adapter_features",)

    @pytest.fixture
    def persistkit_url(self, store_url: str) -> str:
        if store_url.startswith("dynamodb://"):
            # Known gap (issue 24's note): every case of the matrix shares the test's one table,
            # and moto's server deep-copies a table for each action of each transaction and
            # serves DynamoDB requests one at a time, so the matrix on it runs past the 600 s
            # limit. The DynamoDB store is crossed with SIGKILLs at every step by test_crash.py
            # and with the wrappers by the shipped suites; a table per case would bring it here.
            pytest.skip("the combination matrix on moto's DynamoDB server: too slow (one shared table)")
        return store_url
