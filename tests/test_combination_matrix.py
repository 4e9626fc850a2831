"""The combination matrix (persistkit.testing.combination_suite) over every store.

memory:// runs its jobs inline (a crash is an exception); the other stores run
each job in a new process, the crash a real SIGKILL.
"""

from persistkit.testing import CombinationConformance


class TestCombinations(CombinationConformance):
    pass
