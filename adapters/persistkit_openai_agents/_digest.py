"""The input digest of a durable model turn: a recorded turn replays only for the
conversation it was recorded for (``durable_run(..., check_input=)``)."""

from __future__ import annotations

import contextvars
import hashlib
import json
import re
from typing import Any

import persistkit as pk

#: Whether a replayed model turn must have been recorded for the same input (durable_run's check_input).
_CHECK_INPUT: contextvars.ContextVar[bool] = contextvars.ContextVar("persistkit_openai_agents_check_input", default=True)
_ANY_HANDLE = re.compile(r"\$CRED\{[^{}\s]{1,200}\}")


def _comparable(node: Any) -> Any:
    """``node`` as plain JSON with its secrets as bare ``$CRED{}`` (see :func:`_input_digest`)."""
    if isinstance(node, str):
        return _ANY_HANDLE.sub("$CRED{}", pk.secrets.scrub(node))
    if isinstance(node, dict):
        return {_comparable(str(k)): _comparable(v) for k, v in node.items()}
    if isinstance(node, list | tuple):
        return [_comparable(v) for v in node]
    if hasattr(node, "model_dump"):
        return _comparable(node.model_dump(mode="json", exclude_unset=True))
    if node is None or isinstance(node, bool | int | float):
        return node
    return type(node).__qualname__


def _input_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A digest of the whole conversation a model turn is called with (``input``).

    Every item counts, whatever the length (persistkit's own argument digest looks
    only at the ends of a long list). It is taken over the text with secrets
    replaced by a bare ``$CRED{}``: no stored digest hashes a secret, and a key
    that a replayed tool output brings back as its handle in a new process
    compares equal to the key itself.
    """
    conversation = kwargs["input"] if "input" in kwargs else args[1] if len(args) > 1 else None
    text = json.dumps(_comparable(conversation), ensure_ascii=False, sort_keys=True)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()



def _changed_input(run: pk.Run) -> pk.NonDeterminismError:
    return pk.NonDeterminismError(
        f"thread {run.thread_id!r} run {run.run_id}: a model turn of this unfinished run was "
        "recorded for a different input (the conversation passed to the model changed: the "
        "input given to durable_run, or an item before this turn). Its recorded answer would "
        "be replayed for the new input. Call durable_run with the input of the unfinished run "
        "to continue it, or pass a new run_id (durable_run(..., run_id=...)) to start a new "
        "run; durable_run(..., check_input=False) replays recorded turns whatever the input"
    )
