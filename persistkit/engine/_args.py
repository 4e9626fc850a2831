"""A step call's arguments: what its recorded digest is made from, and whether a replayed
call's arguments are the ones recorded (``Run.check_args``).

A digest is O(1) in the size of big containers: steps are often called with
the whole history (``call_llm(messages)``), and hashing it on every step
would make each step cost O(state). A list or tuple longer than
``FINGERPRINT_ITEMS`` counts by its length and its first and last items,
which is what differs when code goes astray.

Three schemes, told apart by the recorded digest's prefix: plain JSON-like
arguments (what most steps take) are hashed straight from orjson's bytes
(``x:``), or from their redacted form if they may hold a secret (``r:``), so
that no stored digest hashes one; other arguments (models, sets, big ints)
take the typed encoding, at three times the cost.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from .._errors import SerializationError
from ..codec._pipeline import (  # without orjson every digest takes the typed path
    _orjson,
    raw_digest,
)

if TYPE_CHECKING:
    from ..codec._pipeline import Codec

#: Lists longer than this enter an args digest by length and first and last item.
FINGERPRINT_ITEMS = 16
_SEQUENCES = (list, tuple)  # a tuple, not `list | tuple`: that builds a union object per call


def fingerprints(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    values = [*args, *(kwargs[k] for k in sorted(kwargs))] if kwargs else [*args]
    for i, value in enumerate(values):
        if isinstance(value, _SEQUENCES) and len(value) > FINGERPRINT_ITEMS:
            values[i] = (type(value).__name__, len(value), value[0], value[-1])
    return values


def json_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes | None:
    """orjson's bytes of the fingerprinted arguments, or None if they are not plain JSON."""
    if _orjson is None:
        return None
    try:
        if not kwargs and len(args) == 1 and not isinstance(args[0], _SEQUENCES):
            return _orjson.dumps([args[0], []])  # the commonest call
        return _orjson.dumps([*fingerprints(args, kwargs), sorted(kwargs)])
    except TypeError:  # not plain JSON (orjson.JSONEncodeError is a TypeError)
        return None


def typed_digest(codec: Codec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts: list[Any] = []
    for i, value in enumerate(fingerprints(args, kwargs)):
        try:
            parts.append(codec.encode(value, f"arg {i}"))
        except SerializationError:
            parts.append({"unencodable": type(value).__qualname__})
    parts.append(sorted(kwargs))
    # Over the redacted form where every secret is "$CRED{}": the digest is the same in
    # every process, for the live value and its replayed handle, and never hashes a secret.
    return hashlib.blake2b(codec.dump_tree(parts, stable=True), digest_size=8).hexdigest()


def arguments(codec: Codec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes | str:
    """What a step call's digest is made from, taken when it is called (a step may change
    its arguments in place): their JSON bytes, hashed when the step commits
    (``Codec.pack_step``), or else the finished digest of their typed encoding."""
    raw = json_args(args, kwargs)
    return raw if raw is not None else typed_digest(codec, args, kwargs)


def matches(codec: Codec, recorded: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call with these arguments has the digest ``recorded``, computed the way the
    recorded one was: from the JSON bytes for an ``x:`` digest (with no secret scan: this one
    is compared, never stored), from their redacted form for an ``r:`` digest, else from the
    typed encoding (also what persistkit before the fast digest recorded)."""
    scheme = recorded[:2]
    if scheme == "x:" or scheme == "r:":
        raw = json_args(args, kwargs)
        if raw is None:
            return True  # the arguments no longer fit the fast digest (e.g. a model class now): no basis to compare
        return recorded == (raw_digest(raw) if scheme == "x:" else codec.args_digest(raw))
    return recorded == typed_digest(codec, args, kwargs)
