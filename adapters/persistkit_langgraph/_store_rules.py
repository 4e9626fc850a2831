"""The rules of ``PersistkitStore`` that do no I/O: board keys of namespaced items, TTL
settings, and the search filters and namespace conditions with LangGraph's ``InMemoryStore``
semantics (``_store`` says where they differ).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import MatchCondition, TTLConfig

import persistkit as pk

__all__ = [
    "board_key",
    "board_prefix",
    "check_count",
    "check_minutes",
    "check_ttl_config",
    "matches_condition",
    "matches_filter",
    "parse_key",
    "when",
]

_ESCAPE = re.compile(r"[%/\x00]")
_UNESCAPE = re.compile(r"%(25|2F|00)")
_CHARS = {"%": "%25", "/": "%2F", "\x00": "%00"}
_BACK = {"25": "%", "2F": "/", "00": "\x00"}
_TTL_KEYS = frozenset({"default_ttl", "refresh_on_read", "sweep_interval_minutes", "omit_expired"})
_MAX_TTL = 10 * 365 * 24 * 60  # minutes: the board's limit
_OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})


def _esc(part: str) -> str:
    return _ESCAPE.sub(lambda m: _CHARS[m.group()], part)


def _unesc(part: str) -> str:
    return _UNESCAPE.sub(lambda m: _BACK[m.group(1)], part)


def board_prefix(namespace: tuple[str, ...]) -> str:
    """The board-key prefix of every item in ``namespace`` and in the namespaces under it."""
    return "".join(_esc(label) + "/" for label in namespace)


def board_key(namespace: tuple[str, ...], key: str) -> str:
    """The board key of item ``key`` in ``namespace``."""
    return board_prefix(namespace) + _esc(key)


def parse_key(bkey: str) -> tuple[tuple[str, ...], str] | None:
    """``(namespace, key)`` of a board key, or None for a key no namespace has (no ``/``)."""
    parts = bkey.split("/")
    if len(parts) < 2 or "" in parts[:-1]:
        return None
    return tuple(_unesc(p) for p in parts[:-1]), _unesc(parts[-1])


def when(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def check_ttl_config(ttl: object) -> TTLConfig | None:
    """``ttl`` as LangGraph's ``TTLConfig``, checked: unknown keys and bad values raise."""
    if ttl is None:
        return None
    if not isinstance(ttl, Mapping):
        raise pk.ConfigurationError(f"ttl must be a TTLConfig dict (default_ttl=minutes, refresh_on_read=bool) or None, got {ttl!r}")
    unknown = set(ttl) - _TTL_KEYS
    if unknown:
        raise pk.ConfigurationError(f"ttl: unknown TTLConfig keys {sorted(unknown)}; known: {sorted(_TTL_KEYS)}")
    default = ttl.get("default_ttl")
    if default is not None:
        check_minutes(default, "ttl['default_ttl']")
    for flag in ("refresh_on_read", "omit_expired"):
        if flag in ttl and not isinstance(ttl[flag], bool):
            raise pk.ConfigurationError(f"ttl[{flag!r}] must be True or False, got {ttl[flag]!r}")
    sweep = ttl.get("sweep_interval_minutes")
    if sweep is not None and (not isinstance(sweep, (int, float)) or isinstance(sweep, bool) or not sweep > 0):
        raise pk.ConfigurationError(f"ttl['sweep_interval_minutes'] must be minutes > 0 or None, got {sweep!r}")
    return TTLConfig(**ttl)  # type: ignore[typeddict-item]


def check_minutes(ttl: object, what: str) -> float:
    if not isinstance(ttl, (int, float)) or isinstance(ttl, bool) or not math.isfinite(ttl) or not 0 < ttl <= _MAX_TTL:
        raise pk.ConfigurationError(f"{what} must be minutes > 0 (at most ten years) or None, got {ttl!r}")
    return float(ttl)


def check_count(v: object, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise pk.ConfigurationError(f"{what} must be an int >= 0, got {v!r}")
    return v


# -- filters and namespace conditions: LangGraph's InMemoryStore semantics -----------------------


def matches_filter(value: dict[str, Any], filter: dict[str, Any] | None) -> bool:
    """Whether an item's value passes a search ``filter`` (top-level keys; nested dicts and
    lists compared element-wise; ``{"$op": x}`` compares with an operator)."""
    if not filter:
        return True
    return all(_compare(value.get(k), v) for k, v in filter.items())


def _compare(item_value: Any, filter_value: Any) -> bool:
    if isinstance(filter_value, dict):
        if any(isinstance(k, str) and k.startswith("$") for k in filter_value):
            return all(_operator(item_value, op, arg) for op, arg in filter_value.items())
        if not isinstance(item_value, dict):
            return False
        return all(_compare(item_value.get(k), v) for k, v in filter_value.items())
    if isinstance(filter_value, (list, tuple)):
        return (
            isinstance(item_value, (list, tuple))
            and len(item_value) == len(filter_value)
            and all(_compare(i, f) for i, f in zip(item_value, filter_value, strict=True))
        )
    return bool(item_value == filter_value)


def _operator(value: Any, op: str, arg: Any) -> bool:
    if op not in _OPERATORS:
        raise pk.ConfigurationError(f"search filter: unsupported operator {op!r}; supported: {sorted(_OPERATORS)}")
    if op == "$eq":
        return bool(value == arg)
    if op == "$ne":
        return bool(value != arg)
    try:
        a, b = float(value), float(arg)
    except (TypeError, ValueError):
        return False  # missing or not a number: no match (InMemoryStore raises here)
    if op == "$gt":
        return a > b
    if op == "$gte":
        return a >= b
    if op == "$lt":
        return a < b
    return a <= b


def matches_condition(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """Whether ``namespace`` starts (``prefix``) or ends (``suffix``) with the condition's
    path, ``"*"`` matching any one label."""
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    else:
        raise pk.ConfigurationError(f"match_type must be 'prefix' or 'suffix', got {condition.match_type!r}")
    return all(p == "*" or k == p for k, p in pairs)
