"""Write validators of a board prefix: a pydantic schema and content checks (``board.policy``).

A write is validated before anything is stored; a value that fails raises
``pk.WriteRejectedError`` naming the key and the rule, and nothing of the write (or of
its batch) is stored. Validators run in the writing process: they keep honest agents'
mistakes and text injected through tools out of the shared space, they do not stop a
process that writes the store without them (docs/shared-state.md).

``instruction_check`` is a heuristic, off unless a policy lists it: it refuses text that
looks written to steer a model that will read it later (an instruction override, a chat
role tag, tool-call syntax). It has false positives (a document about prompt injection)
and misses paraphrases; treat it as a tripwire, not a filter you can rely on.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .._errors import WriteRejectedError

if TYPE_CHECKING:
    from ._entries import Policy

__all__ = ["instruction_check", "validate"]


def validate(policy: Policy, key: str, value: Any, board: str) -> Any:
    """``value`` as it will be stored (validated into the policy's schema), or raise."""
    if policy.schema is not None and not isinstance(value, policy.schema):
        name = getattr(policy.schema, "__name__", repr(policy.schema))
        problems = None
        try:
            value = policy.schema.model_validate(value)
        except Exception as exc:  # pydantic.ValidationError, or whatever the schema raises
            problems = _problems(exc)
        if problems is not None:
            # Raised outside the except block: the schema's own error (which quotes the input,
            # secrets included) is neither the cause nor the context of ours.
            raise WriteRejectedError(
                f"board {board!r}: the value for {key!r} does not fit the schema {name} of prefix "
                f"{policy.prefix!r}, so nothing was stored: {problems}",
                key=key, rule=f"schema {name}",
            )
    for check in policy.checks:
        reason = check(key, value)
        if reason:
            rule = getattr(check, "__name__", repr(check))
            raise WriteRejectedError(
                f"board {board!r}: the write of {key!r} was refused by the check {rule} of prefix "
                f"{policy.prefix!r}: {reason}. Nothing was stored.",
                key=key, rule=rule,
            )
    return value


def _problems(exc: Exception) -> str:
    """What a schema refused, by field and reason, without the input values (they may hold a
    secret, and pydantic shortens long ones before any redaction could recognise them)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            found = errors(include_input=False, include_url=False)
        except TypeError:
            found = None
        if isinstance(found, list):
            return "; ".join(
                f"{'.'.join(str(p) for p in e.get('loc', ())) or '(the value)'}: {e.get('msg', '?')}" for e in found[:10]
            )
    return type(exc).__name__


_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("an instruction override", re.compile(
        r"\b(ignore|disregard|forget|override)\b[^.\n]{0,40}\b(previous|prior|above|earlier|all|your|system)\b"
        r"[^.\n]{0,20}\b(instructions?|prompts?|rules|directions|context)\b", re.I)),
    ("a new-instructions claim", re.compile(r"\b(new|updated|real)\s+(system\s+)?instructions?\s*:", re.I)),
    ("a role claim", re.compile(r"\byou\s+are\s+now\b|\bact\s+as\s+(the\s+)?(system|admin|developer)\b", re.I)),
    ("a chat role tag", re.compile(
        r"<\|?\s*/?\s*(system|assistant|user|im_start|im_end|endoftext)\s*\|?>|^\s*(system|assistant)\s*:"
        r"|\[/?INST\]|<<\s*/?SYS\s*>>", re.I | re.M)),
    ("tool-call syntax", re.compile(
        r"<\s*/?\s*(tool_call|function_call|tool_use|invoke)\b|\"(tool_calls|function_call)\"\s*:", re.I)),
]


def _texts(value: Any, depth: int = 0) -> Iterator[str]:
    if depth > 50:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _texts(k, depth + 1)
            yield from _texts(v, depth + 1)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            yield from _texts(v, depth + 1)
    elif hasattr(value, "model_dump"):
        yield from _texts(value.model_dump(), depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _texts(getattr(value, f.name, None), depth + 1)
    elif isinstance(value, bytes):
        yield value.decode("utf-8", "replace")


def instruction_check(key: str, value: Any) -> str | None:
    """A content check for ``board.policy(prefix, checks=[pk.instruction_check])``: the reason
    a value looks like instructions aimed at a model (in any string inside it), or None.
    A heuristic (see the module docstring)."""
    for text in _texts(value):
        for what, pattern in _PATTERNS:
            m = pattern.search(text)
            if m:
                return f"it holds {what} ({m.group(0).strip()[:60]!r}), text a model reading it later could take as instructions"
    return None
