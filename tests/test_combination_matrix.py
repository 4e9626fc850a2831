"""The combination matrix (persistkit.testing.combination_suite) over every store.

memory:// runs its jobs inline (a crash is an exception); the other stores run
each job in a new process, the crash a real SIGKILL. Adapter-state migrations
(tests/adapters/matrix_adapter_features.py) join the design where their
framework is installed.
"""

import sys
from pathlib import Path

from persistkit.testing import CombinationConformance

sys.path.insert(0, str(Path(__file__).resolve().parent / "adapters"))


class TestCombinations(CombinationConformance):
    combination_modules = ("matrix_adapter_features",)
