"""persistkit: durable steps for AI agents.

Put ``@pk.checkpointed`` on the functions of an agent loop and run a turn in
``with pk.resume(thread_id):``. Every finished step is written to durable
storage; a retry or a later invocation resumes at the first unfinished step.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from . import secrets
from ._errors import (
    AccessDeniedError,
    AnswerError,
    BackendError,
    BackendNotFoundError,
    BackendUnavailableError,
    ClaimLostError,
    CompensationError,
    ConcurrencyLimitError,
    ConfigurationError,
    ConflictError,
    EffectError,
    IntegrityError,
    LeaseLostError,
    LimitNotFoundError,
    NonDeterminismError,
    NotFoundError,
    PersistkitError,
    RateLimitedError,
    RetryableError,
    RunAbandonedError,
    RunAbortedError,
    RunCancelledError,
    RunCompensatedError,
    RunPrunedError,
    SchemaVersionError,
    SecretResolutionError,
    SerializationError,
    StepFailedError,
    StoreClosedError,
    StoreLostError,
    StoreOptionsError,
    ThreadBusyError,
    ValueTooLargeError,
    WriteRejectedError,
)
from ._retry import Retry, set_testing
from .codec._serde import register
from .codec._sizes import LargeValueWarning
from .coordination._children import ChildInfo
from .coordination._concurrency import Concurrency
from .coordination._debounce import Debounced
from .coordination._outbox import EffectInfo, current_effect
from .coordination._outbox_store import OutboxEffect, OutboxReport
from .coordination._suspend import DueRun, Question, Suspended
from .engine._api import checkpointed, current_run, current_step, resume
from .engine._children import ChildHandle, agather, arun_child, astart, gather, run_child, start
from .engine._emit import emit
from .engine._flow import athrottle, limited, throttle
from .engine._messages import areceive, aset_event, cancelled, receive, set_event
from .engine._outbox import after_commit
from .engine._patches import deprecate_patch, patched
from .engine._replay_check import ReplayReport, RunReplay
from .engine._run import Run, StepEvent, StepInfo
from .engine._saga import compensate
from .engine._store import Store, connect, default_store
from .engine._suspend import asleep, asuspend, asuspend_all, sleep, suspend, suspend_all
from .flow._limits import LimitDraw, LimitInfo, Limits
from .secrets._redact import Secret
from .state._records import Checkpoint, ResumeInfo
from .state._spec import Reducer, TrackedList, add, append, merge, migration, replace
from .streams._format import StreamEvent
from .streams._format import check_stream as check_stream_name
from .streams._sse import sse
from .wrappers._keys import KeyRing, generate_key

if _TYPE_CHECKING:
    from .blackboard._acl import ScopedBoard
    from .blackboard._board import Batch as BoardBatch
    from .blackboard._claims import Claim
    from .blackboard._entries import BoardChange, BoardEntry
    from .blackboard._space import Board
    from .blackboard._validate import instruction_check
    from .blackboard._watch import BoardWatch
    from .coordination import LeaseInfo
    from .coordination._inbox import Message
    from .coordination._thread_lease import ThreadLease
    from .ops._retention import PruneReport, Retention
    from .state._model import State
    from .wrappers._encryption import RotationReport
    from .wrappers._verify import IntegrityProblem, IntegrityReport
    from .wrappers._witness import FileWitness, Witness, WitnessEntry

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "AnswerError",
    "BackendError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "Board",
    "BoardBatch",
    "BoardChange",
    "BoardEntry",
    "BoardWatch",
    "Checkpoint",
    "ChildHandle",
    "ChildInfo",
    "Claim",
    "ClaimLostError",
    "CompensationError",
    "Concurrency",
    "ConcurrencyLimitError",
    "ConfigurationError",
    "ConflictError",
    "Debounced",
    "DueRun",
    "EffectError",
    "EffectInfo",
    "FileWitness",
    "IntegrityError",
    "IntegrityProblem",
    "IntegrityReport",
    "KeyRing",
    "LargeValueWarning",
    "LeaseInfo",
    "LeaseLostError",
    "LimitDraw",
    "LimitInfo",
    "LimitNotFoundError",
    "Limits",
    "Message",
    "NonDeterminismError",
    "NotFoundError",
    "OutboxEffect",
    "OutboxReport",
    "PersistkitError",
    "PruneReport",
    "Question",
    "RateLimitedError",
    "Reducer",
    "ReplayReport",
    "ResumeInfo",
    "Retention",
    "Retry",
    "RetryableError",
    "RotationReport",
    "Run",
    "RunAbandonedError",
    "RunAbortedError",
    "RunCancelledError",
    "RunCompensatedError",
    "RunPrunedError",
    "RunReplay",
    "SchemaVersionError",
    "ScopedBoard",
    "Secret",
    "SecretResolutionError",
    "SerializationError",
    "State",
    "StepEvent",
    "StepFailedError",
    "StepInfo",
    "Store",
    "StoreClosedError",
    "StoreLostError",
    "StoreOptionsError",
    "StreamEvent",
    "Suspended",
    "ThreadBusyError",
    "ThreadLease",
    "TrackedList",
    "ValueTooLargeError",
    "Witness",
    "WitnessEntry",
    "WriteRejectedError",
    "add",
    "after_commit",
    "agather",
    "append",
    "areceive",
    "arun_child",
    "aset_event",
    "asleep",
    "astart",
    "asuspend",
    "asuspend_all",
    "athrottle",
    "cancelled",
    "check_stream_name",
    "checkpointed",
    "compensate",
    "connect",
    "current_effect",
    "current_run",
    "current_step",
    "default_store",
    "deprecate_patch",
    "emit",
    "gather",
    "generate_key",
    "instruction_check",
    "limited",
    "merge",
    "migration",
    "patched",
    "receive",
    "register",
    "replace",
    "resume",
    "run_child",
    "secrets",
    "set_event",
    "set_testing",
    "sleep",
    "sse",
    "start",
    "suspend",
    "suspend_all",
    "throttle",
]


# Names whose modules only a store with encryption or integrity needs: imported on
# first use, so that `import persistkit` stays cheap (pk.State: pydantic, likewise).
_LAZY = {
    "State": ".state._model",
    "IntegrityProblem": ".wrappers._verify",
    "IntegrityReport": ".wrappers._verify",
    "RotationReport": ".wrappers._encryption",
    "FileWitness": ".wrappers._witness",
    "Witness": ".wrappers._witness",
    "WitnessEntry": ".wrappers._witness",
    "LeaseInfo": ".coordination",
    "ThreadLease": ".coordination._thread_lease",
    "Message": ".coordination._inbox",
    "Board": ".blackboard._space",
    "BoardBatch": ".blackboard._board",
    "BoardEntry": ".blackboard._entries",
    "BoardChange": ".blackboard._entries",
    "BoardWatch": ".blackboard._watch",
    "Claim": ".blackboard._claims",
    "ScopedBoard": ".blackboard._acl",
    "instruction_check": ".blackboard._validate",
    "Retention": ".ops._retention",
    "PruneReport": ".ops._retention",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'persistkit' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
