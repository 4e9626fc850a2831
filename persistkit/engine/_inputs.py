"""A live step's inputs: its arguments and its run's state with read-back secret handles
resolved before the body runs (``pk.secrets.live`` applied where a step starts).

Kept in the engine, not in ``secrets/``: it knows a run (its codec's redactor, its state's
channels) and the arguments' recorded form (``_args``); ``secrets/`` knows neither.
"""

from __future__ import annotations

from typing import Any

from .._errors import SecretResolutionError
from ..secrets._live import live
from ..secrets._registry import _unresolved_live
from ._args import FINGERPRINT_ITEMS

__all__ = ["live_inputs"]


def live_inputs(
    run: Any, position: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], raw: bytes | str | None = None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A live step's arguments with read-back handles resolved, and its run's state
    resolved in place, before the body runs; ``SecretResolutionError`` if one cannot be.

    ``raw``: the arguments' JSON bytes when the caller has them (``Run.arguments``):
    without a ``$CRED{`` in them the arguments are not walked (unless a long list
    stood there only by its ends: then they are). The state is walked
    only while a live load left a handle unresolved in this process (a process
    that merely inspected threads pays one substring test per step).
    """
    try:
        return _resolved(run, position, name, args, kwargs, raw)
    except SecretResolutionError as exc:
        # This process cannot resolve a handle the run stored: a setting of this process (an
        # unset variable, a missing vault), not a failure of the run: the step did not run,
        # and the run writes nothing more (as for a recorded value it cannot load), so the
        # resume with the secret configured continues it
        run.load_error = exc
        raise


def _resolved(
    run: Any, position: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], raw: bytes | str | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    where = f"step {name!r} at position {position} of thread {run.thread_id!r} (run {run.run_id})"
    red = run.codec.redactor  # the run's store: its vault and handle key resolve too
    if isinstance(raw, bytes) and raw.find(b"$CRED{") < 0 and not _fingerprinted(args, kwargs):
        new_args, new_kwargs = args, kwargs
    else:
        new_args, new_kwargs = live((args, kwargs), where=where, redactor=red)
    if not _unresolved_live:
        return new_args, new_kwargs
    current = run.spec.channels(run.state)
    for channel, value in list(current.items()):
        try:
            resolved = live(value, where=where, redactor=red)
        except SecretResolutionError as exc:
            raise SecretResolutionError(
                f"{exc} The handle is in run.state[{channel!r}], which the step's body may read: "
                "configure what resolves it, or remove the value from the thread's state "
                "(store.update_state) if it is not needed any more",
                handle=exc.handle,
            ) from None
        if resolved is not value:
            run._set(current, channel, resolved)
    return new_args, new_kwargs


def _fingerprinted(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``Run.arguments``' bytes hold a long list by its ends only (``_args.fingerprints``)."""
    return any(
        isinstance(v, list | tuple) and len(v) > FINGERPRINT_ITEMS for v in (*args, *kwargs.values())
    )
