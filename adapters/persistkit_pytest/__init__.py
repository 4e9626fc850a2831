"""The pytest plugin of persistkit (registered by the ``pytest11`` entry point): the
``crash_matrix`` fixture.

It imports nothing of persistkit until a test asks for the fixture, so a pytest session
that does not use it starts as fast as without it (``import persistkit`` is what costs).
The fixture is :func:`persistkit.testing.crash_matrix.crash_matrix` with this test's
temporary directory for SQLite files and the command line's ``--crash-matrix-url`` and
``--crash-matrix-seed`` as defaults (the seed for the calls that sample, ``positions=N``);
docs/testing.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

__all__ = ["crash_matrix", "pytest_addoption"]


def pytest_addoption(parser: pytest.Parser) -> None:
    """The plugin's options: ``--crash-matrix-url`` (the store the fixture runs agents on) and
    ``--crash-matrix-seed`` (repeat a ``positions=N`` sample a failure printed)."""
    group = parser.getgroup("persistkit", "persistkit crash matrix")
    group.addoption(
        "--crash-matrix-url",
        default=None,
        help="store URL the crash_matrix fixture runs agents on (default: memory:// inline, SQLite files in process mode)",
    )
    group.addoption(
        "--crash-matrix-seed",
        type=int,
        default=None,
        help="seed for crash_matrix(positions=N) samples: repeat a sample a failure printed",
    )


@pytest.fixture
def crash_matrix(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Any]:
    """``crash_matrix(agent, **options)``: crash ``agent`` at every step, resume it, and return
    a ``CrashMatrixResult`` (``.assert_exactly_once()``, ``.assert_same_outcome()``)."""
    from persistkit.testing.crash_matrix import crash_matrix as run

    url = request.config.getoption("crash_matrix_url")
    seed = request.config.getoption("crash_matrix_seed")

    def matrix(agent: Callable[..., Any], **options: Any) -> Any:
        options.setdefault("directory", str(tmp_path))
        if url is not None:
            options.setdefault("url", url)
        if seed is not None and isinstance(options.get("positions"), int):
            options.setdefault("seed", seed)  # it chooses what positions=N samples: nothing else
        return run(agent, **options)

    return matrix
