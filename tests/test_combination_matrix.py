"""The combination matrix (persistkit.testing.combination_suite) over every store.

memory:// runs its jobs inline (a crash is an exception); the other stores run
each job in a new process, the crash a real SIGKILL. Adapter-state migrations
(tests/adapters/matrix_adapter_features.py) join the design where their
framework is installed.

The store is one more factor of the covering array (``design_per_level``): every pair of
features both ways on some store, every feature on and off on each store, 18 store-rows for
today's 11 features instead of 48 (docs/testing.md). ``PERSISTKIT_MATRIX=every-store`` runs
every row on every store; ``PERSISTKIT_MATRIX=full`` the power set.
"""

import sys
from pathlib import Path

from conftest import SERVER_BACKENDS

from persistkit.testing import CombinationConformance
from persistkit.testing.combination import design_per_level

#: The store kinds, by URL scheme, in conftest's order (every store, even in the quick
#: tier, so a store's share of the design does not depend on which stores run).
STORES = {"memory": "memory", "sqlite": "sqlite", "postgresql": "postgres", "postgres": "postgres",
          "redis": "redis", "s3": "s3", "dynamodb": "dynamodb"}
assert set(STORES.values()) == {"memory", "sqlite", *SERVER_BACKENDS}

sys.path.insert(0, str(Path(__file__).resolve().parent / "adapters"))


class TestCombinations(CombinationConformance):
    combination_modules = ("matrix_adapter_features",)

    def combination_design(self, names: list[str], url: str) -> list[tuple[str, ...]]:
        return design_per_level(names, list(dict.fromkeys(STORES.values())))[STORES[url.split(":", 1)[0]]]

    def combination_url(self, url: str, combo: str) -> str:
        if url.startswith("dynamodb://"):
            # moto's server backs every transaction up by copying its whole table, and serves
            # DynamoDB requests one at a time: one table per combination keeps each small
            # (one shared table took about 9 minutes on a loaded machine). Created on first use.
            table, rest = url.removeprefix("dynamodb://").split("?", 1)
            return f"dynamodb://{table}-{combo}?{rest}"
        return url
