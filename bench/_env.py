"""Imported first by every benchmark script: how to run it, instead of a bare traceback.

The benchmarks import persistkit and the peers they compare with (LangGraph,
DBOS, psycopg, redis, boto3, moto). Run them with ``python3 dev.py bench``,
which sets up ./.venv with all of it (``python3 dev.py bench sqlite`` runs one
script), or with a Python where ``pip install -e '.[bench]'`` was run. Under
any other Python a missing package ends the script with one message saying
which package and what to run, not a ``ModuleNotFoundError`` traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import TracebackType

_previous = sys.excepthook


def _how_to_run(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if not isinstance(exc, ModuleNotFoundError):
        _previous(kind, exc, tb)
        return
    script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "this benchmark"
    name = Path(script).stem.removeprefix("bench_")
    sys.stderr.write(
        f"{script} needs the package {exc.name!r}, which {sys.executable} does not have.\n"
        f"Run it with:  python3 dev.py bench {name}   (sets up ./.venv with persistkit and the peers; "
        "`python3 dev.py bench` runs them all)\n"
        f"or, in a virtualenv where `pip install -e '.[bench]'` was run:  python bench/{script}\n"
    )


sys.excepthook = _how_to_run
