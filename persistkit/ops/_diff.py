"""The difference between two states, channel by channel, as a person reads it.

Both states are plain JSON values (``store.get_state(..., plain=True)`` or the
command line's display codec: secrets are their handles). A channel is added,
removed or changed; inside a changed one, each change has a path (keys and list
indexes) and an operation:

==========  ==================================================================
``add``     a key that the older value did not have (``new``)
``remove``  a key or the trailing list items the newer value no longer has (``old``)
``change``  a value replaced (``old`` and ``new``)
``append``  a list item after the older list's end (``new``): a list that grew
            is shown as its new items, never as a rewrite of the whole list
==========  ==================================================================

Lists are compared item by item over their common length, so an item edited in
place is a ``change`` at its index. Pure functions, no I/O: what ``persistkit diff``
prints and what the timeline page shows between two steps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["Change", "ChannelDiff", "format_path", "state_diff"]

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Change:
    """One change inside a channel: ``path`` below the channel, ``op``, the values."""

    op: str
    path: Path
    old: Any = None
    new: Any = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "path": list(self.path)}
        if self.op in ("remove", "change"):
            out["old"] = self.old
        if self.op in ("add", "change", "append"):
            out["new"] = self.new
        return out


@dataclass(frozen=True, slots=True)
class ChannelDiff:
    """One channel that differs: ``status`` is ``added``, ``removed`` or ``changed``."""

    channel: str
    status: str
    changes: tuple[Change, ...]

    def as_json(self) -> dict[str, Any]:
        return {"channel": self.channel, "status": self.status, "changes": [c.as_json() for c in self.changes]}


def state_diff(old: dict[str, Any], new: dict[str, Any]) -> list[ChannelDiff]:
    """The channels that differ between ``old`` and ``new``, in name order (unchanged ones left out)."""
    out: list[ChannelDiff] = []
    for name in sorted(old.keys() | new.keys()):
        if name not in old:
            out.append(ChannelDiff(name, "added", (Change("add", (), new=new[name]),)))
        elif name not in new:
            out.append(ChannelDiff(name, "removed", (Change("remove", (), old=old[name]),)))
        else:
            changes: list[Change] = []
            _walk(old[name], new[name], (), changes)
            if changes:
                out.append(ChannelDiff(name, "changed", tuple(changes)))
    return out


def _walk(a: Any, b: Any, path: Path, out: list[Change]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):  # (a state's lists and dicts may be subclasses)
        for key in list(a) + [k for k in b if k not in a]:  # the older order, then new keys
            if key not in b:
                out.append(Change("remove", (*path, key), old=a[key]))
            elif key not in a:
                out.append(Change("add", (*path, key), new=b[key]))
            else:
                _walk(a[key], b[key], (*path, key), out)
    elif isinstance(a, list) and isinstance(b, list):
        common = min(len(a), len(b))
        for i in range(common):
            _walk(a[i], b[i], (*path, i), out)
        out.extend(Change("append", (*path, i), new=b[i]) for i in range(common, len(b)))
        out.extend(Change("remove", (*path, i), old=a[i]) for i in range(common, len(a)))
    elif type(a) is not type(b) or a != b or (type(a) is float and repr(a) != repr(b)):
        # 1 and 1.0, True and 1, 0.0 and -0.0: equal in Python, different as stored
        out.append(Change("change", path, old=a, new=b))


def format_path(path: Path) -> str:
    """``path`` as people write it: ``[12].text``, ``.user["first name"]``; ``""`` for the channel itself."""
    parts: list[str] = []
    for p in path:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif p.isidentifier():
            parts.append(f".{p}")
        else:
            parts.append(f"[{json.dumps(p, ensure_ascii=False)}]")
    return "".join(parts)
