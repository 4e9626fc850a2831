"""The first pass of the secret scan: which detectors may match in a record's JSON bytes.

It only ever says "no secret can be here" or "these detectors may match here"
(a superset of what the detectors match on the decoded strings: property tests
check it), in time linear in the record with a small constant on any text:
one-byte searches (memchr) gate the longer ones, keyword anchors are searched
in the lower-cased bytes, and patterns run only where their anchors occur —
never at every position of a long run of random characters. Only a hit walks
the record's tree (``Redactor._walk``) with the detectors named here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

from ._detect import AWS_ID_PREFIXES, BUILTIN, TOKEN_KINDS, TOKEN_LOOSE, Detector

__all__ = ["_may_match_builtin", "candidates", "extra_match", "has_access_key_id"]

_AKID_AT = re.compile(rb"[A-Z]{4}[A-Z0-9]{16}(?![A-Za-z0-9])")
_AKID_PREFIX = re.compile(rb"A(?:" + b"|".join(p[1:].encode() for p in AWS_ID_PREFIXES) + rb")")


def has_access_key_id(data: bytes) -> bool:
    """Whether JSON ``data`` holds an AWS access key id (found from its prefixes: linear)."""
    return any(_AKID_AT.match(data, m.start()) is not None for m in _AKID_PREFIX.finditer(data))


_LOOSE: dict[str, re.Pattern[bytes]] = {}  # kind -> its TOKEN_LOOSE pattern, compiled on first use


# The jwt and url_password detectors without their context assertions, over JSON
# bytes: a superset (an escaped newline is two allowed bytes where the text had a
# space; a non-ASCII space is allowed bytes too; quotes stay quotes).
_JWT_LOOSE = re.compile(rb"eyJ[A-Za-z0-9_-]{8,}\.eyJ")
_URL_LOOSE = re.compile(rb"://[^\s/?#@:\"'<>]*:[^\s/?#@\"'<>]+@")
_LITERAL: dict[bytes, re.Pattern[bytes]] = {}


def _occurrences(data: bytes, anchor: bytes) -> Iterator[int]:
    # A compiled literal, not bytes.find: find degrades to ~10 ms per MB on some texts
    # (short needles of common characters in random text); the regex search does not.
    rx = _LITERAL.get(anchor)
    if rx is None:
        rx = _LITERAL[anchor] = re.compile(re.escape(anchor))
    return (m.start() for m in rx.finditer(data))


_SMALL = 1 << 16  # below this, bytes.find answers "absent" faster than starting a regex search


def _confirmed(data: bytes, anchor: bytes, loose: re.Pattern[bytes]) -> bool:
    if len(data) < _SMALL and data.find(anchor) < 0:
        return False
    return any(loose.match(data, i) is not None for i in _occurrences(data, anchor))


# Token detectors grouped by what their prefixes share (one search per group):
# (prefix pattern, offset of the match start from its match, kinds)
_TOKEN_GROUPS: tuple[tuple[re.Pattern[bytes], int, tuple[str, ...]], ...] = (
    (re.compile(rb"sk-"), 0, ("anthropic", "openai")),
    (
        re.compile(rb"A(?:" + b"|".join(p[1:].encode() for p in (*AWS_ID_PREFIXES, "AIza")) + rb")"),
        0,
        ("aws_access_key", "google_api_key"),
    ),
    # Whole prefixes, not "gh" anywhere: "gh" is in a third of base64 messages and in
    # English ("right"), and each occurrence would run the pattern (bench/bench_cpu.py).
    (re.compile(rb"g(?:h[pousr]_|ithub_pat_)"), 0, ("github",)),
    (re.compile(rb"x(?:ox|app-)"), 0, ("slack",)),
    (re.compile(rb"k_(?:live|test)_"), -1, ("stripe",)),
)


_NONE: frozenset[str] = frozenset()


def _may_match_builtin(data: bytes) -> bool:
    """False only when no built-in detector can match in ``data`` (a superset test)."""
    return bool(candidates(data))


def candidates(data: bytes) -> frozenset[str]:
    """The built-in detectors that may match in JSON ``data`` (a superset: the others cannot).

    A regex alternation of every detector costs ~20 µs per KB of JSON (the
    engine tries each branch at each position), and ~200 µs per KB of random
    text. Instead: keyword anchors by substring search in the lower-cased bytes,
    JWTs and URL passwords by their anchor confirmed by a loose pattern, and the
    token detectors by their whole fixed prefixes (``sk-``, ``ghp_``, ``xox``, ``AKIA``...),
    each prefix found confirmed by the detector's pattern stripped of its context
    assertions (JSON bytes are not the decoded text: a token after an escaped
    newline follows the letter ``n`` here). Token characters are never escaped
    in JSON, so a token in a string is a token in the bytes.
    """
    # One-byte searches (memchr) are ~20x cheaper than longer ones: rare bytes gate
    # the anchors that have one. find(), not `in`: see Redactor._maybe.
    find = data.find
    kinds: frozenset[str] = _NONE  # no set built for the common record with nothing in it
    if find(b"J") >= 0 and _confirmed(data, b"eyJ", _JWT_LOOSE):
        kinds = kinds | {"jwt"}
    if find(b"@") >= 0 and _confirmed(data, b"://", _URL_LOOSE):
        kinds = kinds | {"url_password"}
    if find(b"Y") >= 0 and find(b"PRIVATE KEY") >= 0:
        kinds = kinds | {"private_key"}
    lowered = data.lower()
    lfind = lowered.find
    if lfind(b"secret") >= 0:
        kinds = kinds | {"aws_secret_key"}
    if lfind(b"bearer") >= 0:
        kinds = kinds | {"bearer"}
    if lfind(b"z") >= 0 and lfind(b"authorization") >= 0:
        kinds = kinds | {"authorization"}
    dash, under, big_a = find(b"-") >= 0, find(b"_") >= 0, find(b"A") >= 0
    if not (dash or under or big_a):  # no token prefix can be here (most records)
        return kinds
    # openai and anthropic, aws and google, github, slack, stripe
    gates = (dash, big_a, under, dash, under)
    if not _LOOSE:
        by_kind = dict(zip((d.kind for d in BUILTIN if d.kind in TOKEN_KINDS), TOKEN_LOOSE, strict=True))
        _LOOSE.update({k: re.compile(v.encode()) for k, v in by_kind.items()})
    for gate, (prefix, offset, group) in zip(gates, _TOKEN_GROUPS, strict=True):
        # The group's prefix pattern is its absence test too: one search, where a
        # find() per literal cost ~1.5 µs per KB each on random text (nine for the
        # AWS group: 13 µs of a 1 KB base64 record's ~35 µs scan, bench/bench_sqlite.py).
        if not gate or prefix.search(data) is None:
            continue
        todo = [k for k in group if k not in kinds]
        for i in (m.start() for m in prefix.finditer(data)) if todo else ():
            for k in todo:
                if _LOOSE[k].match(data, max(i + offset, 0)) is not None:
                    kinds = kinds | {k}
            todo = [k for k in todo if k not in kinds]
            if not todo:
                break
    return kinds


def extra_match(data: bytes, detectors: tuple[Detector, ...]) -> bool:
    """Whether a configured (non built-in) detector matches a string of JSON ``data``.

    The patterns run on each key and string value, as redaction runs them: a
    pattern run over the JSON text would miss what it matches only in a whole
    string (``^...$``) or across an escape (``\\s`` and a newline), and that
    secret would be stored. ``data`` may be several documents, one per line
    (a step's arguments and its record, scanned together).
    """
    try:
        import orjson

        loads: Callable[[bytes], Any] = orjson.loads
    except ImportError:  # pragma: no cover - orjson is a dependency where wheels exist
        import json

        loads = json.loads
    stack: list[Any] = []
    for part in data.split(b"\n"):  # compact JSON has no raw newline: it separates documents
        try:
            stack.append(loads(part))
        except ValueError:
            return True  # cannot tell: look closer
    while stack:
        node = stack.pop()
        if type(node) is str:
            if any(d.regex.search(node) for d in detectors):
                return True
        elif type(node) is list:
            stack.extend(node)
        elif type(node) is dict:
            for key, value in node.items():
                if any(d.regex.search(key) for d in detectors):
                    return True
                stack.append(value)
    return False


