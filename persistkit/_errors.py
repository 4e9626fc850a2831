"""The one exception tree persistkit raises.

::

    PersistkitError
    ├── ConfigurationError        bad options, arguments or URL (also a ValueError)
    │   ├── BackendNotFoundError      no store for that URL scheme, or its driver is not installed
    │   └── StoreClosedError          the store was closed
    ├── BackendError              storage failed; the driver error is ``__cause__``
    │   ├── BackendUnavailableError   transient (connection, timeout, "database is locked"): retried
    │   ├── ConflictError             another writer moved the thread head first
    │   └── StoreLostError            the store lost its data under this process (a Redis restarted empty)
    ├── NotFoundError             no such thread / checkpoint / run (also a LookupError)
    ├── SerializationError        a value cannot be encoded, or stored bytes cannot be decoded
    │   ├── ValueTooLargeError        a value is larger than the store's max_value_bytes=: nothing written
    │   └── StoreOptionsError         a record needs an option the store was opened without
    │                                 (encryption or integrity keys, blobs=); also a ConfigurationError
    ├── SchemaVersionError        stored version newer than the code, no migration path, or a stored value its class no longer fits
    ├── NonDeterminismError       on replay, the step at a position is not the recorded one
    ├── IntegrityError            a stored record failed authentication or its chain is broken
    ├── SecretResolutionError     a secret handle ($CRED{name}) that no resolver or vault knows
    ├── StepFailedError           a recorded failure whose exception class cannot be revived
    ├── ThreadBusyError           another live run holds the thread's lease (names holder and expiry),
    │   │                         or the thread's newest run is unfinished (``unfinished_run``)
    │   └── ConcurrencyLimitError every slot of a concurrency limit (pk.resume(concurrency=)) was taken
    ├── RunAbandonedError         the run was given up with ``store.abandon``: it never runs again
    ├── RunCancelledError         ``store.cancel`` (or a second message under busy="interrupt") stopped the run at a step boundary
    ├── AnswerError               store.answer refused an answer (not suspended, answered, unknown question, wrong type): nothing stored
    ├── RunAbortedError           ``run.abort(reason)``: the run fails for good (its compensations run)
    ├── RunCompensatedError       the run failed for good and was rolled back: a redelivery runs nothing
    ├── CompensationError         a saga rollback could not undo everything (lists what was and was not undone)
    ├── EffectError               an after-commit effect failed for good (it stays pending), or a
    │                             stored one cannot be resolved in this process (a RetryableError)
    ├── LeaseLostError            this run's lease expired and another holder took over: stop, write nothing
    │   └── ClaimLostError        a board claim expired and another worker claimed the item: its complete/release is refused
    ├── RateLimitedError          a rate limit (store.limits) had no capacity within the call's timeout (a RetryableError)
    ├── LimitNotFoundError        a rate limit named in a step or pk.limited was never set (also a NotFoundError)
    ├── AccessDeniedError         a scoped board handle (board.scoped) or the database refused a key outside the grants
    └── WriteRejectedError        a board write failed a validator (schema or content check) of its prefix: nothing stored

Errors raised by the user's own step functions pass through untouched; they
are never wrapped in these classes.

Every message passes through the secret scrubber (``pk.secrets.scrub``) when
the error is created: registered values and detected secrets become handles,
so no secret value reaches a log line or a traceback through persistkit.

This module is the ground floor: it imports nothing of persistkit's, so every
other module can raise these errors. The scrubber lives above it (``_redact``
raises these errors) and installs itself with :func:`install_scrubber` when it
is imported, which ``import persistkit`` does first, before anything can raise.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = [
    "AccessDeniedError",
    "AnswerError",
    "BackendError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "ClaimLostError",
    "CompensationError",
    "ConcurrencyLimitError",
    "ConfigurationError",
    "ConflictError",
    "EffectError",
    "IntegrityError",
    "LeaseLostError",
    "LimitNotFoundError",
    "NonDeterminismError",
    "NotFoundError",
    "PersistkitError",
    "RateLimitedError",
    "RetryableError",
    "RunAbandonedError",
    "RunAbortedError",
    "RunCancelledError",
    "RunCompensatedError",
    "RunPrunedError",
    "SchemaVersionError",
    "SecretResolutionError",
    "SerializationError",
    "StepFailedError",
    "StoreClosedError",
    "StoreLostError",
    "StoreOptionsError",
    "ThreadBusyError",
    "ValueTooLargeError",
    "WriteRejectedError",
]


class PersistkitError(Exception):
    """Base class of every error persistkit raises itself. Messages never carry secret values."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(_scrub(a) if isinstance(a, str) else a for a in args))

    @property
    def retryable(self) -> bool:
        """True when calling again later can succeed with nothing changed (a busy thread, a
        lost lease, a store briefly unavailable): a job queue should retry the message rather
        than ack it as failed. The same as ``isinstance(err, pk.RetryableError)``."""
        return isinstance(self, RetryableError)


class RetryableError(PersistkitError):
    """Base of the errors after which the same call, made again later, can succeed unchanged:
    ``ThreadBusyError``, ``LeaseLostError`` and ``BackendUnavailableError``. Nothing of the
    failed attempt is lost (committed steps replay). On a job queue, retry on it (Celery:
    ``autoretry_for=(pk.RetryableError,)``) instead of acking the message as failed. A
    ``resume`` block that ends with one writes no failed end: its run stays unfinished
    (the thread's next turns wait for it) and the retry of its ``run_id`` continues it."""

    #: Seconds after which persistkit suggests the retry (a queue's countdown), or None: no
    #: suggestion, use the queue's own backoff. Set by a turn that gave its worker slot back
    #: instead of waiting for another turn's unfinished run (``pk.resume(unfinished_timeout=)``).
    retry_after: float | None = None


_scrub: Callable[[str], str] = str
"""What every message passes through: ``pk.secrets.scrub`` once ``_redact`` is imported."""


def install_scrubber(scrub: Callable[[str], str]) -> None:
    """Make every error message created from now on pass through ``scrub``."""
    global _scrub
    _scrub = scrub


class ConfigurationError(PersistkitError, ValueError):
    """An option, argument or URL is invalid. The message says which and what is accepted."""


class BackendNotFoundError(ConfigurationError):
    """No store is registered for a URL scheme, or its driver is not installed."""


class StoreClosedError(ConfigurationError):
    """The store was closed; open a new one with ``pk.connect(...)``."""


class BackendError(PersistkitError):
    """The storage backend failed. The driver's exception is ``__cause__``."""


class BackendUnavailableError(BackendError, RetryableError):
    """A transient backend failure (connection lost, timeout, lock busy). Safe to retry."""


class StoreLostError(BackendError):
    """The store lost its data while this process had it open: its identity record (written
    once, with the first write) is gone or another one is there when a connection is
    re-established (a Redis restarted without persistence, a flushed database). Raised
    instead of running again steps that had committed; not retryable (a retry would run
    them again): the message says what to do."""


class ConflictError(BackendError):
    """Another writer moved the thread head first, so this write was not made.

    Only the write that raised is refused: checkpoints committed before it
    stay. Raised inside a run, the message says what of the run is committed
    and what to do (``pk.resume(thread, run_id=...)`` with the same run id
    never runs a committed step again). ``expected`` is the head version this writer based its write on, ``found``
    the version in the store (0 means the thread has no head).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        thread_id: str = "",
        namespace: str = "",
        expected: int = 0,
        found: int = 0,
        found_checkpoint: str | None = None,
        key: str | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.namespace = namespace
        self.expected = expected
        self.found = found
        self.found_checkpoint = found_checkpoint
        #: the key of a shared space (store.board()) whose compare-and-swap failed; None for a thread head
        self.key = key
        if message is None and key is not None:
            where = repr(key) + (f" (board {namespace!r})" if namespace else "")
            message = (
                f"key {where}: expected version {expected}, found version {found}"
                + (" (0: the key does not exist)" if found == 0 else "")
                + ". Another writer changed it first, so nothing was written. Read it again "
                "(board.get) and retry, or let board.update(key, fn) retry for you."
            )
        if message is None:
            where = repr(thread_id) + (f" (namespace {namespace!r})" if namespace else "")
            message = (
                f"thread {where}: expected head version {expected}, found version {found}"
                + (f" at checkpoint {found_checkpoint}" if found_checkpoint else "")
                + ". Another writer moved the thread's head first, so this write was not made "
                "(checkpoints committed before it stay). Read the head again "
                "(store.get_checkpoint(thread_id)) before writing on top of it."
            )
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_conflict,
            (
                str(self),
                self.thread_id,
                self.namespace,
                self.expected,
                self.found,
                self.found_checkpoint,
                self.key,
            ),
        )


def _rebuild_conflict(
    message: str,
    thread_id: str,
    namespace: str,
    expected: int,
    found: int,
    found_checkpoint: str | None,
    key: str | None = None,
) -> ConflictError:
    return ConflictError(
        message,
        thread_id=thread_id,
        namespace=namespace,
        expected=expected,
        found=found,
        found_checkpoint=found_checkpoint,
        key=key,
    )


class NotFoundError(PersistkitError, LookupError):
    """No such thread, checkpoint or run."""


class SerializationError(PersistkitError):
    """A value cannot be encoded, or stored bytes cannot be decoded.

    ``path`` names the offending field, e.g. ``state.messages[3].when``.
    """

    def __init__(self, message: str, *, path: str = "") -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class StoreOptionsError(SerializationError, ConfigurationError):
    """A stored record needs an option the store was opened without (its encryption or
    integrity keys, its blob store): the record is fine, the ``pk.connect`` call is not.
    ``option`` names it: ``"encryption"``, ``"integrity"`` or ``"blobs"``."""

    def __init__(self, message: str, *, path: str = "", option: str = "") -> None:
        self.option = option
        super().__init__(message, path=path)


class ValueTooLargeError(SerializationError):
    """A value to store is larger than the store's ``max_value_bytes=`` (``pk.connect``):
    refused before anything was written. ``size`` and ``limit`` are in bytes; ``path``
    names the value (``step 'fetch' result``, ``state.messages``)."""

    def __init__(self, message: str, *, path: str = "", size: int = 0, limit: int = 0) -> None:
        self.size = size
        self.limit = limit
        super().__init__(message, path=path)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_too_large, (str(self), self.size, self.limit))


def _rebuild_too_large(message: str, size: int, limit: int) -> ValueTooLargeError:
    return ValueTooLargeError(message, size=size, limit=limit)


class SchemaVersionError(PersistkitError):
    """A stored state or value cannot become what the code declares: its version is newer
    than the code's, no migration reaches the code's version, a migration failed, or its
    class changed shape since it was stored (the message names the field, where it sits,
    and the migration to register)."""


class NonDeterminismError(PersistkitError):
    """On replay, the code does not do what the run recorded: another step (or other
    arguments) at a position, a step past a completed run's end, or a deprecated patch
    reached by a run recorded before the patch. ``position`` and ``step`` say where
    (None when the error was revived from a record)."""

    def __init__(self, *args: object, position: str | None = None, step: str | None = None) -> None:
        super().__init__(*args)
        self.position = position
        self.step = step


class IntegrityError(PersistkitError):
    """A stored record failed authentication, or a thread's chain of records is broken."""


class SecretResolutionError(PersistkitError):
    """A handle (``$CRED{name}``) that no registered value, resolver or vault knows.

    ``handle`` is the handle's name; the message names it and never holds a value.
    """

    def __init__(self, message: str, *, handle: str = "") -> None:
        self.handle = handle
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_secret_error, (str(self), self.handle))


def _rebuild_secret_error(message: str, handle: str) -> SecretResolutionError:
    return SecretResolutionError(message, handle=handle)


class StepFailedError(PersistkitError):
    """A step failed on an earlier attempt and its exception class could not be revived.

    Raised on replay in place of the original exception; ``type_name`` and
    ``message`` describe the original.
    """

    def __init__(self, message: str, *, type_name: str = "", original_message: str = "") -> None:
        self.type_name = type_name
        self.original_message = _scrub(original_message)
        super().__init__(message)


class ThreadBusyError(RetryableError):
    """Another live run holds the thread's lease (``busy="reject"``, or a wait that timed out).

    ``holder`` names the lease's owner (host, process and a tag; None when no live
    run holds it: the thread waits for an unfinished run), ``expires_at`` when its
    lease runs out unless renewed (seconds since the epoch, 0.0 without a holder),
    and ``waiting`` how many runs queue before this one.

    ``unfinished_run`` is set (a run id; None for a thread that is merely busy) when the thread's newest run did not finish
    (its holder died or was interrupted) and this run, another turn, waited for it to
    be continued first: redeliver that run (``pk.resume(thread_id, run_id=...)``), or
    give it up with ``store.abandon(thread_id, run_id)`` if it never will be.

    ``retry_after`` (seconds) is set when the turn gave its worker slot back instead of
    waiting for that run (``pk.resume(unfinished_timeout=)``): retry it after that long.
    """

    def __init__(
        self, message: str, *, thread_id: str = "", holder: str | None = None, expires_at: float = 0.0,
        waiting: int = 0, unfinished_run: str | None = None, retry_after: float | None = None,
    ) -> None:
        self.thread_id = thread_id
        self.holder = holder
        self.expires_at = expires_at
        self.waiting = waiting
        self.unfinished_run = unfinished_run
        self.retry_after = retry_after
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        args = (
            str(self), self.thread_id, self.holder, self.expires_at, self.waiting, self.unfinished_run, self.retry_after,
        )
        return (_rebuild_busy, args)


def _rebuild_busy(
    message: str, thread_id: str, holder: str | None, expires_at: float, waiting: int,
    unfinished_run: str | None = None, retry_after: float | None = None,
) -> ThreadBusyError:
    # (errors pickled by an older version carry "" for "none")
    return ThreadBusyError(
        message, thread_id=thread_id, holder=holder or None, expires_at=expires_at, waiting=waiting,
        unfinished_run=unfinished_run or None, retry_after=retry_after,
    )


class ConcurrencyLimitError(ThreadBusyError):
    """A concurrency limit (``pk.resume(concurrency=(name, key, limit))``, docs/flow-control.md)
    had every slot taken: under ``busy="reject"`` at once, else once ``busy_timeout`` ran out.
    ``limit`` names it, ``key`` the key (a tenant id), ``capacity`` its number of slots,
    ``holders`` how many turns held one, ``waiting`` how many queued before this turn, and
    ``retry_after`` the seconds after which a slot is likely free (from how long the key's
    turns held one lately). A ``ThreadBusyError``, so a ``RetryableError``: the block ran
    nothing and wrote nothing; retry the turn."""

    def __init__(
        self, message: str, *, thread_id: str = "", limit: str = "", key: str = "", capacity: int = 0,
        holders: int = 0, waiting: int = 0, retry_after: float | None = None,
    ) -> None:
        self.limit = limit
        self.key = key
        self.capacity = capacity
        self.holders = holders
        super().__init__(message, thread_id=thread_id, waiting=waiting, retry_after=retry_after)

    def __reduce__(self) -> tuple[object, ...]:
        args = (str(self), self.thread_id, self.limit, self.key, self.capacity, self.holders, self.waiting, self.retry_after)
        return (_rebuild_concurrency, args)


def _rebuild_concurrency(
    message: str, thread_id: str, limit: str, key: str, capacity: int, holders: int, waiting: int,
    retry_after: float | None,
) -> ConcurrencyLimitError:
    return ConcurrencyLimitError(
        message, thread_id=thread_id, limit=limit, key=key, capacity=capacity, holders=holders, waiting=waiting,
        retry_after=retry_after,
    )


class RunAbandonedError(PersistkitError):
    """The run was given up with ``store.abandon(thread_id, run_id)``: a redelivery of it
    runs nothing (not retryable: drop the message). Its committed steps stay in the thread.
    """

    def __init__(self, message: str, *, thread_id: str = "", run_id: str = "") -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_abandoned, (str(self), self.thread_id, self.run_id))


def _rebuild_abandoned(message: str, thread_id: str, run_id: str) -> RunAbandonedError:
    return RunAbandonedError(message, thread_id=thread_id, run_id=run_id)


class RunCancelledError(PersistkitError):
    """The run was stopped at a step boundary: ``store.cancel(thread_id, run_id)``
    (``status == "cancelled"``: its compensations run, a redelivery runs nothing) or a second
    message under ``busy="interrupt"`` (``status == "interrupted"``: its finished steps stay,
    the new turn runs next). Raised inside the block at the next step; let it escape (a
    ``finally`` runs). Not retryable: drop the message."""

    def __init__(self, message: str, *, thread_id: str = "", run_id: str = "", status: str = "cancelled") -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.status = status
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_cancelled, (str(self), self.thread_id, self.run_id, self.status))


def _rebuild_cancelled(message: str, thread_id: str, run_id: str, status: str) -> RunCancelledError:
    return RunCancelledError(message, thread_id=thread_id, run_id=run_id, status=status)


class RunPrunedError(NotFoundError):
    """A finished run whose records retention pruned (``store.prune``) was resumed again by
    its ``run_id`` (a redelivered message): it cannot be replayed, and it never runs again.
    Not retryable: the message was handled; drop it, or keep checkpoints longer than your
    queue redelivers (``pk.Retention(max_age=...)``)."""

    def __init__(self, message: str, *, thread_id: str = "", run_id: str = "") -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_pruned, (str(self), self.thread_id, self.run_id))


def _rebuild_pruned(message: str, thread_id: str, run_id: str) -> RunPrunedError:
    return RunPrunedError(message, thread_id=thread_id, run_id=run_id)


class AnswerError(PersistkitError):
    """``store.answer(...)`` refused an answer, and stored nothing: the thread is not
    suspended (or its question was answered already, expired, or is a timer), the question
    id is unknown, or the value does not fit the question's ``answer_type``.

    ``thread_id`` and ``question`` (the question id, or None) say which; the message says
    what to do (``store.pending()`` lists the open questions).
    """

    def __init__(self, message: str, *, thread_id: str = "", question: str | None = None) -> None:
        self.thread_id = thread_id
        self.question = question
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_answer, (str(self), self.thread_id, self.question))


def _rebuild_answer(message: str, thread_id: str, question: str | None) -> AnswerError:
    return AnswerError(message, thread_id=thread_id, question=question)
class RunAbortedError(PersistkitError):
    """Raised by ``run.abort(reason)``: the run fails for good. When it escapes the ``resume``
    block, the compensations of the run's completed steps run (docs/long-runs.md, Sagas).
    ``reason`` is the text given to ``abort`` (None without one)."""

    def __init__(self, message: str, *, thread_id: str = "", run_id: str = "", reason: str | None = None) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.reason = reason
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_aborted, (str(self), self.thread_id, self.run_id, self.reason))


def _rebuild_aborted(message: str, thread_id: str, run_id: str, reason: str | None) -> RunAbortedError:
    return RunAbortedError(message, thread_id=thread_id, run_id=run_id, reason=reason)


class RunCompensatedError(PersistkitError):
    """The run failed for good and its compensations ran (its end status is ``compensated``):
    a redelivery of it (the same ``run_id``) runs nothing, and neither does the resume that
    finished a rollback a crash had interrupted. Not retryable: drop the message.
    ``failure`` is the text of the failure that started the rollback."""

    def __init__(self, message: str, *, thread_id: str = "", run_id: str = "", failure: str = "") -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.failure = _scrub(failure)
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_compensated, (str(self), self.thread_id, self.run_id, self.failure))


def _rebuild_compensated(message: str, thread_id: str, run_id: str, failure: str) -> RunCompensatedError:
    return RunCompensatedError(message, thread_id=thread_id, run_id=run_id, failure=failure)


class CompensationError(PersistkitError):
    """A saga rollback could not undo everything: a compensation still failed after its retries.

    ``undone`` lists the compensations that ran (descriptions such as ``"shop:cancel_flight
    (undoes step 'book_flight' at 1)"``), ``not_undone`` the ones that did not, each with
    the error that stopped it, and ``failure`` is the text of the failure that started the
    rollback (the original exception is also ``__cause__`` when raised at the block's end).
    The run stays unfinished (status ``compensating``): resuming its ``run_id`` runs only the
    compensations not undone yet, again; ``store.abandon`` gives it up.
    """

    def __init__(
        self, message: str, *, thread_id: str = "", run_id: str = "", undone: list[str] | None = None,
        not_undone: list[tuple[str, str]] | None = None, failure: str = "",
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.undone = list(undone or [])
        self.not_undone = [(_scrub(what), _scrub(why)) for what, why in not_undone or []]
        self.failure = _scrub(failure)
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        args = (str(self), self.thread_id, self.run_id, self.undone, self.not_undone, self.failure)
        return (_rebuild_compensation, args)


def _rebuild_compensation(
    message: str, thread_id: str, run_id: str, undone: list[str], not_undone: list[tuple[str, str]], failure: str
) -> CompensationError:
    return CompensationError(
        message, thread_id=thread_id, run_id=run_id, undone=undone, not_undone=not_undone, failure=failure
    )


class EffectError(RetryableError):
    """An after-commit effect (``run.after_commit``) failed for good under its retry policy, or
    a stored effect cannot be resolved here (its module is not allowlisted).

    The effect stays pending, never dropped: the next resume of its run, or
    ``store.drain_outbox()``, runs it again with the same idempotency ``key``. The effect's own
    exception is ``__cause__``. A ``RetryableError``: a block it escapes writes no end record,
    so the run stays unfinished, the thread's next turns wait for it (no later reply is posted
    before this one), and the queue's retry of the run posts it first.
    """

    def __init__(
        self, message: str, *, thread_id: str = "", run_id: str = "", position: str = "",
        index: int = 0, function: str = "", key: str = "",
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.position = position
        self.index = index
        self.function = function
        self.key = key
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_effect, (str(self), self.thread_id, self.run_id, self.position, self.index, self.function, self.key))


def _rebuild_effect(
    message: str, thread_id: str, run_id: str, position: str, index: int, function: str, key: str
) -> EffectError:
    return EffectError(
        message, thread_id=thread_id, run_id=run_id, position=position, index=index, function=function, key=key
    )


class LeaseLostError(RetryableError):
    """This run's lease expired and another holder took over: the store refused the write.

    Nothing this run writes lands any more; stop. ``token`` is this run's
    fencing token, ``found`` the thread's current one (0 if unknown).
    """

    def __init__(self, message: str | None = None, *, thread_id: str = "", namespace: str = "", token: int = 0, found: int = 0) -> None:
        self.thread_id = thread_id
        self.namespace = namespace
        self.token = token
        self.found = found
        if message is None:
            where = repr(thread_id) + (f" (namespace {namespace!r})" if namespace else "")
            message = (
                f"thread {where}: this run's lease (fencing token {token}) was taken over by another "
                f"run (token {found}) after it expired, so the store refused the write and nothing was "
                "written. Stop this run: the new holder continues the thread. Raise lease_ttl= in "
                "pk.resume(...) if this process pauses longer than the lease lasts"
            )
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_lost, (str(self), self.thread_id, self.namespace, self.token, self.found))


def _rebuild_lost(message: str, thread_id: str, namespace: str, token: int, found: int) -> LeaseLostError:
    return LeaseLostError(message, thread_id=thread_id, namespace=namespace, token=token, found=found)


def _shell_word(text: str) -> str:
    if "'" not in text:
        return f"'{text}'"
    import shlex

    return shlex.quote(text)


def damaged_record_advice(
    thread_id: str, namespace: str, parent_id: str | None, url: str | None, *, integrity: bool
) -> str:
    """The ways forward named by every error about one stored checkpoint that is damaged
    or altered (a flipped bit, an edit outside persistkit): what to run, with the call."""
    # single-quoted for a shell (as repr shows a plain URL); keys come from the environment
    where = f"--url {_shell_word(url)} " if url else "--url URL "
    ns = f", namespace={namespace!r}" if namespace else ""
    if parent_id:
        fork = (
            f"fork the thread from the checkpoint before this one and go on there: "
            f"store.fork({thread_id!r}, {parent_id!r}{ns}) returns the new thread's first "
            "checkpoint (pass new_thread_id= to name it; resume that thread)"
        )
    else:
        fork = (
            "this is the thread's first checkpoint, so there is nothing earlier to fork from: "
            f"start the thread again (`persistkit delete {thread_id!r}`)"
        )
    if integrity:
        return (
            f"Ways forward: `persistkit verify {where}--thread {thread_id!r}` (with the store's keys in "
            "$PERSISTKIT_INTEGRITY_KEYS, and in $PERSISTKIT_ENCRYPTION_KEYS when it is encrypted) lists every "
            f"broken record of the thread; {fork} (or from any earlier checkpoint that verifies); or restore "
            "the store from a trusted backup. Nothing was written."
        )
    return (
        f"Ways forward: {fork}; or restore the store from a trusted backup. Nothing was written. "
        "Without integrity, damage that still decodes goes unnoticed: to have every damaged or "
        "edited record caught by an authentication tag and listed by `persistkit verify`, keep "
        "agent state in a store opened with pk.connect(url, integrity=True) (keys in "
        "$PERSISTKIT_INTEGRITY_KEYS); store.copy_from(old_url) moves threads there, but copies "
        "records as they are, so repair or fork this thread first (a copied damaged record is "
        "then sealed as if it were sound)"
    )


class ClaimLostError(LeaseLostError):
    """A board claim (``board.claim``) expired and another worker claimed the item since:
    this worker's ``complete`` / ``release`` / ``renew`` is refused and nothing is written.

    ``key`` is the item, ``token`` this claim's fencing token, ``found`` the item's current
    version (0: the item is gone).
    """

    def __init__(self, message: str | None = None, *, key: str = "", board: str = "", token: int = 0, found: int = 0) -> None:
        self.key = key
        self.board = board
        if message is None:
            message = (
                f"board {board!r}: the claim on {key!r} (fencing token {token}) is no longer held: "
                + ("the item is gone" if found == 0 else f"the item moved on to version {found}")
                + " (the claim expired and another worker took it, or it was released), so nothing "
                "was written. Drop this item: its new claimer finishes it. Raise lease_ttl= in "
                "board.claim(...) (or call claim.renew()) if work on one item takes longer than that"
            )
        super().__init__(message, thread_id="", namespace=board, token=token, found=found)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_claim_lost, (str(self), self.key, self.board, self.token, self.found))


def _rebuild_claim_lost(message: str, key: str, board: str, token: int, found: int) -> ClaimLostError:
    return ClaimLostError(message, key=key, board=board, token=token, found=found)


class AccessDeniedError(PersistkitError, PermissionError):
    """A scoped board handle (``board.scoped``) was asked for a key outside its grants, or
    the database's own access rules (PostgreSQL row-level security) refused it. Names the
    agent, the key, the operation and the grants; nothing was read or written."""

    def __init__(self, message: str, *, agent: str = "", key: str = "", operation: str = "") -> None:
        self.agent = agent
        self.key = key
        self.operation = operation
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_denied, (str(self), self.agent, self.key, self.operation))


def _rebuild_denied(message: str, agent: str, key: str, operation: str) -> AccessDeniedError:
    return AccessDeniedError(message, agent=agent, key=key, operation=operation)


class WriteRejectedError(PersistkitError):
    """A board write failed a validator of its key's prefix (a pydantic schema or a content
    check such as ``pk.instruction_check``): nothing was stored. Names the key and the rule."""

    def __init__(self, message: str, *, key: str = "", rule: str = "") -> None:
        self.key = key
        self.rule = rule
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_rejected, (str(self), self.key, self.rule))


def _rebuild_rejected(message: str, key: str, rule: str) -> WriteRejectedError:
    return WriteRejectedError(message, key=key, rule=rule)


class RateLimitedError(RetryableError):
    """A shared rate limit (``store.limits``, docs/flow-control.md) had no capacity for this call
    within its timeout: nothing was drawn and the call did not run. ``limit`` names the limit,
    ``key`` the key drawn under ("" without one), ``retry_after`` the seconds until the draw
    would have fitted (a queue's countdown). A ``RetryableError``: retry the call or the turn."""

    def __init__(self, message: str, *, limit: str = "", key: str = "", retry_after: float | None = None) -> None:
        self.limit = limit
        self.key = key
        self.retry_after = retry_after
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_rate_limited, (str(self), self.limit, self.key, self.retry_after))


def _rebuild_rate_limited(message: str, limit: str, key: str, retry_after: float | None) -> RateLimitedError:
    return RateLimitedError(message, limit=limit, key=key, retry_after=retry_after)


class LimitNotFoundError(NotFoundError):
    """A rate limit was drawn from (``@pk.checkpointed(limit=)``, ``pk.limited``, ``pk.throttle``)
    but never declared on the store: ``store.limits.set(name, rate=...)`` first. ``limit`` names it."""

    def __init__(self, message: str, *, limit: str = "") -> None:
        self.limit = limit
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_limit_missing, (str(self), self.limit))


def _rebuild_limit_missing(message: str, limit: str) -> LimitNotFoundError:
    return LimitNotFoundError(message, limit=limit)
