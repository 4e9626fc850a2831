"""Stored trees as plain JSON, for people and tools: no class revived, no secret resolved.

The CLI's read verbs (``_cli/_open.py``) and the timeline page (``ops/_timeline.py``)
show values as they are stored: a model or dataclass as its fields, a tuple or set as a
list, a datetime as its ISO text, a secret as its handle (``$CRED{…}``). Nothing of the
program that wrote them is imported, so no migration runs and no handle is looked up.
"""

from __future__ import annotations

import base64
from datetime import timedelta
from typing import Any

from ._pipeline import Codec
from ._stdtypes import TAG

__all__ = ["PlainCodec", "plain"]


class PlainCodec(Codec):
    """The store's codec, decoding stored trees to plain JSON values (see :func:`plain`)."""

    @classmethod
    def like(cls, codec: Codec) -> PlainCodec:
        return cls(
            codec.serializer,
            compress_threshold=codec.compress_threshold,
            compress_level=codec.compress_level,
            redactor=codec.redactor,
        )

    def decode(
        self, tree: Any, path: str = "value", *, reveal: bool | None = None, plain: bool = False, live: bool = False
    ) -> Any:
        return _as_json(tree)  # never revives a class, so no migration runs: stored data as stored


def plain(tree: Any) -> Any:
    """A stored tree as plain JSON: tagged values become their JSON payload
    (a model or dataclass its fields, a tuple or set a list, a datetime its
    ISO text, a secret its handle), and no class is imported or revived."""
    if isinstance(tree, str):
        return tree.replace("$CRED{$}", "$CRED{")  # stored escape of a literal "$CRED{"
    if isinstance(tree, list):
        return [plain(v) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if TAG not in tree:
        return {k: plain(v) for k, v in tree.items()}
    tag, v = tree[TAG], tree.get("v")
    if tag in ("m", "dc", "t", "s", "fs", "nt", "e"):
        return plain(v)
    if tag == "d" and isinstance(v, list):
        return {str(plain(k)) if not isinstance(k, str) else k: plain(x) for k, x in v}
    if tag == "i" and isinstance(v, str):
        return int(v, 16)
    if tag in ("dt", "tm") and isinstance(v, list) and v:
        return v[0]
    if tag == "td" and isinstance(v, list) and len(v) == 3:
        return str(timedelta(days=v[0], seconds=v[1], microseconds=v[2]))
    if tag == "pa" and isinstance(v, list) and len(v) == 2:
        return v[1]
    if tag == "sec":
        return f"$CRED{{{v}}}"
    if tag == "ex" and isinstance(v, dict):
        return f"{str(tree.get('c', '')).partition(':')[2]}: {v.get('str', '')}"
    if tag == "x" and isinstance(v, str):
        return f"<pickled object, {len(base64.b64decode(v))} bytes>"
    return plain(v)  # b ba (base64 text), f, da, dt, tm, u, dec (their text)


_as_json = plain
