"""persistkit: durable steps for AI agents.

Put ``@pk.checkpointed`` on the functions of an agent loop and run a turn in
``with pk.resume(thread_id):``. Every finished step is written to durable
storage; a retry or a later invocation resumes at the first unfinished step.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from . import secrets
from ._api import checkpointed, current_run, current_step, resume
from ._errors import (
    BackendError,
    BackendNotFoundError,
    BackendUnavailableError,
    ConfigurationError,
    ConflictError,
    IntegrityError,
    LeaseLostError,
    NonDeterminismError,
    NotFoundError,
    PersistkitError,
    RetryableError,
    RunAbandonedError,
    SchemaVersionError,
    SecretResolutionError,
    SerializationError,
    StepFailedError,
    StoreClosedError,
    StoreOptionsError,
    ThreadBusyError,
)
from ._keys import KeyRing, generate_key
from ._records import Checkpoint
from ._retry import Retry, set_testing
from ._run import Run, StepEvent, StepInfo
from ._secrets import Secret
from ._serde import register
from ._state import Reducer, TrackedList, add, append, merge, migration, replace
from ._store import Store, connect, default_store

if _TYPE_CHECKING:
    from ._model import State
    from .coordination import LeaseInfo
    from .wrappers._encryption import RotationReport
    from .wrappers._verify import IntegrityProblem, IntegrityReport
    from .wrappers._witness import FileWitness, Witness, WitnessEntry

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "Checkpoint",
    "ConfigurationError",
    "ConflictError",
    "FileWitness",
    "IntegrityError",
    "IntegrityProblem",
    "IntegrityReport",
    "KeyRing",
    "LeaseInfo",
    "LeaseLostError",
    "NonDeterminismError",
    "NotFoundError",
    "PersistkitError",
    "Reducer",
    "Retry",
    "RetryableError",
    "RotationReport",
    "Run",
    "RunAbandonedError",
    "SchemaVersionError",
    "Secret",
    "SecretResolutionError",
    "SerializationError",
    "State",
    "StepEvent",
    "StepFailedError",
    "StepInfo",
    "Store",
    "StoreClosedError",
    "StoreOptionsError",
    "ThreadBusyError",
    "TrackedList",
    "Witness",
    "WitnessEntry",
    "add",
    "append",
    "checkpointed",
    "connect",
    "current_run",
    "current_step",
    "default_store",
    "generate_key",
    "merge",
    "migration",
    "register",
    "replace",
    "resume",
    "secrets",
    "set_testing",
]


# Names whose modules only a store with encryption or integrity needs: imported on
# first use, so that `import persistkit` stays cheap (pk.State: pydantic, likewise).
_LAZY = {
    "State": "._model",
    "IntegrityProblem": ".wrappers._verify",
    "IntegrityReport": ".wrappers._verify",
    "RotationReport": ".wrappers._encryption",
    "FileWitness": ".wrappers._witness",
    "Witness": ".wrappers._witness",
    "WitnessEntry": ".wrappers._witness",
    "LeaseInfo": ".coordination",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'persistkit' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
