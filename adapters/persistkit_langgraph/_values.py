"""LangGraph's serialized values, stored as trees that persistkit redacts like any value.

LangGraph's serializer (``JsonPlusSerializer``) turns every channel value,
pending write and checkpoint into msgpack bytes. persistkit does not scan
bytes, so a key in a tool message would reach storage inside them (base64 of
msgpack). The saver therefore stores msgpack as the tree it encodes: maps,
arrays, strings, numbers, bytes, and LangGraph's extension records (a pydantic
model, a ``Send``, a set: a code and a nested msgpack payload, decoded the same
way) as :class:`MsgpackExt`. persistkit's codec then redacts every string in
it (registered values, detectors, ``$CRED{`` escaping) and resolves handles on
load, as for a value of a ``@pk.checkpointed`` step; loading packs the tree
back into the bytes LangGraph's serializer reads.

A pydantic ``SecretStr`` / ``SecretBytes`` (which LangGraph packs as its
plain value) is stored as a ``pk.Secret``: a handle, whatever its text, given
back through the configured resolvers on load (``SecretResolutionError`` if
none knows it). A tree is used only when packing it again gives back exactly
the bytes the serializer produced; any other encoding (``EncryptedSerializer``'s ciphertext,
pickle, raw ``bytes`` values) is stored as the serializer's bytes, unscanned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ormsgpack

import persistkit as pk

__all__ = ["MsgpackExt", "from_tree", "to_tree"]

_UNPACK = ormsgpack.OPT_NON_STR_KEYS
_PACK = ormsgpack.OPT_NON_STR_KEYS | ormsgpack.OPT_PASSTHROUGH_DATACLASS
#: Extension codes whose payload LangGraph packs with msgpack (constructors, methods,
#: pydantic v1/v2, numpy arrays, delta snapshots): decoded into trees as well.
_NESTED_CODES = frozenset(range(8))
_CONSTRUCTOR_SINGLE_ARG = 0
#: (module, class) of the values LangGraph packs as ``(module, class, value)`` that are secrets.
_SECRET_TYPES = frozenset({("pydantic.types", "SecretStr"), ("pydantic.types", "SecretBytes")})


@pk.register
@dataclass(frozen=True)
class MsgpackExt:
    """A msgpack extension record: ``value`` is the decoded payload, or its raw bytes
    when ``nested`` is false (a code this saver does not know)."""

    code: int
    value: Any
    nested: bool


def _ext_hook(code: int, data: bytes) -> MsgpackExt:
    if code in _NESTED_CODES:
        try:
            return MsgpackExt(code, ormsgpack.unpackb(data, ext_hook=_ext_hook, option=_UNPACK), True)
        except (ormsgpack.MsgpackDecodeError, ValueError, TypeError):
            pass
    return MsgpackExt(code, bytes(data), False)


def _ext_default(obj: Any) -> Any:
    if isinstance(obj, MsgpackExt):
        data = _pack(obj.value) if obj.nested else obj.value
        return ormsgpack.Ext(obj.code, data)
    if isinstance(obj, pk.Secret):
        return pk.secrets.resolve(obj)  # SecretResolutionError when nothing knows its handle
    raise TypeError(f"{type(obj).__name__} is not part of a msgpack tree")


def _ext_inspect(obj: Any) -> Any:
    """As ``_ext_default``, for inspection: a secret nothing resolves is its handle text
    (still a SecretStr, masked), so reading a thread never needs a value."""
    if isinstance(obj, pk.Secret):
        try:
            return pk.secrets.resolve(obj)
        except pk.SecretResolutionError:
            return obj.handle
    return _ext_default(obj)


def _is_secret(ext: MsgpackExt) -> bool:
    v = ext.value
    return (
        ext.code == _CONSTRUCTOR_SINGLE_ARG
        and ext.nested
        and type(v) is list
        and len(v) == 3
        and (v[0], v[1]) in _SECRET_TYPES
        and isinstance(v[2], str | bytes)
    )


def _mark_secrets(node: Any) -> Any:
    """``node`` with the values of secret types wrapped in ``pk.Secret`` (stored as handles)."""
    if type(node) is MsgpackExt:
        if _is_secret(node):
            module, name, value = node.value
            return MsgpackExt(node.code, [module, name, pk.Secret(value)], True)
        if node.nested:
            return MsgpackExt(node.code, _mark_secrets(node.value), True)
        return node
    if type(node) is list:
        return [_mark_secrets(v) for v in node]
    if type(node) is dict:
        return {k: _mark_secrets(v) for k, v in node.items()}
    return node


def _pack(tree: Any) -> bytes:
    return ormsgpack.packb(tree, default=_ext_default, option=_PACK)


#: Trees of recently stored values by their msgpack bytes: LangGraph hands every item of a
#: list channel (the whole conversation) to each ``put``; only the new ones are converted.
_TREES: dict[bytes, Any] = {}
_TREES_LIMIT = 32 << 20  # bytes of msgpack keyed, then the cache starts over
_trees_size = 0


def to_tree(data: bytes) -> Any | None:
    """The tree encoded by msgpack ``data``, or None when it does not pack back to ``data``
    exactly (then the bytes are stored as they are). Trees are shared: never mutate one."""
    global _trees_size
    tree = _TREES.get(data)
    if tree is not None:
        return tree
    try:
        tree = ormsgpack.unpackb(data, ext_hook=_ext_hook, option=_UNPACK)
        if _pack(tree) != data:
            return None
    except (ormsgpack.MsgpackDecodeError, ormsgpack.MsgpackEncodeError, ValueError, TypeError):
        return None
    tree = _mark_secrets(tree)
    if _trees_size + len(data) > _TREES_LIMIT:
        _TREES.clear()
        _trees_size = 0
    _TREES[data] = tree
    _trees_size += len(data)
    return tree


def from_tree(tree: Any, *, live: bool = True) -> bytes:
    """The msgpack bytes of a stored tree (its strings as loaded). ``live``: a secret type's
    value must resolve (``SecretResolutionError`` otherwise); else it may stay a handle."""
    if live:
        return _pack(tree)
    return ormsgpack.packb(tree, default=_ext_inspect, option=_PACK)
