"""The digest of a model request's message history: what a recorded request must have been
recorded for (``model:<n>:<digest>``), computed once per message rather than once per
request over the whole history."""

from __future__ import annotations

import hashlib
import json
import re
import weakref
from dataclasses import dataclass
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

import persistkit as pk


def _comparable(node: Any) -> Any:
    """The parts of a message history that a replay must see again: kinds, texts, tool names,
    arguments and call ids, with secrets as a bare ``$CRED{}`` (so no digest hashes one and a
    key read back as its handle compares equal). Timestamps and provider ids are left out: a
    replayed run rebuilds its requests at other times."""
    if isinstance(node, str):
        text = pk.secrets.scrub(node)
        return text if "$CRED{" not in text else _HANDLE.sub("$CRED{}", text)
    if isinstance(node, dict):
        return {k: _comparable(v) for k, v in node.items() if k in _KEPT or not isinstance(k, str)}
    if isinstance(node, list):
        return [_comparable(v) for v in node]
    return node


_HANDLE = re.compile(r"\$CRED\{[^{}\s]{1,200}\}")
_KEPT = frozenset(
    {"kind", "parts", "part_kind", "content", "tool_name", "args", "tool_call_id", "instructions"}
)


def message_text(message: ModelMessage) -> str:
    """One message's comparable JSON, as it appears in its history's digested text."""
    data = _comparable(ModelMessagesTypeAdapter.dump_python([message], mode="json")[0])
    return json.dumps(data, ensure_ascii=False, sort_keys=True, default=str)


def digest_of(texts: list[str]) -> str:
    """The digest of a history given its messages' texts: the hash of the JSON list they
    make (``json.dumps`` of the whole list writes each item as alone, joined by ``", "``),
    so it equals the digest of the whole history dumped at once, as recorded before."""
    text = "[" + ", ".join(texts) + "]"
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@dataclass(frozen=True)
class _Seen:
    """A message's text and what it was computed from. Pydantic AI changes a message already
    in the history by giving it new parts (``request.parts = [*request.parts, delta]``) or new
    instructions, so the text is reused only while the message still has both."""

    message: ModelMessage  # held, so no other message takes its id while this entry lives
    parts: object
    instructions: object
    text: str


class HistoryDigests:
    """The history digests of one persistkit run's model requests. Each request sends the
    whole conversation so far; each message is scrubbed and dumped once, when first seen,
    so a turn of n requests costs O(n) scrubbing instead of O(n²)."""

    def __init__(self) -> None:
        self._seen: dict[int, _Seen] = {}

    def digest(self, messages: list[ModelMessage]) -> str:
        return digest_of([self._text(message) for message in messages])

    def _text(self, message: ModelMessage) -> str:
        parts, instructions = message.parts, getattr(message, "instructions", None)
        seen = self._seen.get(id(message))
        if seen is None or seen.parts is not parts or seen.instructions is not instructions:
            seen = _Seen(message, parts, instructions, message_text(message))
            self._seen[id(message)] = seen
        return seen.text


_DIGESTS: weakref.WeakKeyDictionary[pk.Run, HistoryDigests] = weakref.WeakKeyDictionary()


def history_digest(run: pk.Run, messages: list[ModelMessage]) -> str:
    """The digest of ``messages`` sent by a model request of ``run``: the same for the same
    history in any process (a timestamp or provider id may differ, a secret's value is
    never hashed)."""
    digests = _DIGESTS.get(run)
    if digests is None:
        digests = _DIGESTS[run] = HistoryDigests()
    return digests.digest(messages)
