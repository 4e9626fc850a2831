"""The high-entropy rule: random-looking tokens in text written for people.

Applied to recorded errors (an exception's message, args and notes) and run
metadata, never to state or step results: there a false positive would change
the user's data, here it only hides a word from a reader. A token is a run of
``[A-Za-z0-9+/=_%-]`` (base64, base64url, percent-encoded text, most API key
alphabets) of 20 to 1,024 characters. It is a secret when, with its ``%XX``
escapes decoded and its ``=`` padding stripped, it

* is not hexadecimal (digests, UUIDs, checkpoint and run ids stay readable),
* mixes letters and digits (and, below 32 characters, both letter cases),
* is not made of words: less than 30 % of it (or fewer than 8 letters) in
  lower-case runs of 6+ letters, and less than 60 % in words of 3+ letters
  with an optional capital (identifiers and paths are made of words, random
  text is not),
* and has a Shannon entropy near that of random text of its length
  (``_MIN_ENTROPY_RATIO`` of ``log2(len)``, capped at 6 bits).

Tokens after ``base64,`` (data URLs) and the magic prefixes of common image
formats are not flagged (inline images are not credentials). The scan is one
regex pass that starts only at token boundaries (linear in the text) and
evaluates each candidate in time linear in its length.
``bench/bench_redact.py`` prints the rule's false-positive rate on a corpus of
ordinary strings and its recall on generated secrets.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from urllib.parse import unquote

__all__ = ["looks_random", "random_spans"]

MIN_LEN = 20
MAX_LEN = 1024
_MIN_ENTROPY_RATIO = 0.78  # of log2(len): random 20-64 character tokens sit at 0.85-0.95
# A token with this share of it (and at least _WORDY_MIN letters) in lower-case runs
# of 6+ letters reads as words (identifiers, paths); random text rarely has such runs.
_WORDY = 0.3
_WORDY_MIN = 8
# ... or with this share in capitalized or lower-case words of 3+ letters (camelCase).
_WORDS = 0.6
# Starts only where the previous character is not a token character: the engine
# never re-enters a run it already rejected, so the scan is linear.
_TOKEN = re.compile(r"(?<![A-Za-z0-9+/=_%-])[A-Za-z0-9+/=_%-]{20,}")
_HEX = re.compile(r"[0-9a-fA-F-]+")
_LOWER_RUN = re.compile(r"[a-z]{6,}")
_WORD = re.compile(r"[A-Z]?[a-z]{3,}")
# base64 of PNG, JPEG, GIF, WEBP, PDF, gzip: inline files, not credentials
_FILE_MAGIC = ("iVBORw0KGgo", "/9j/", "R0lGOD", "UklGR", "JVBERi0", "H4sI")


def looks_random(token: str) -> bool:
    """Whether ``token`` (a run of token characters) reads as a random secret."""
    if token.startswith(_FILE_MAGIC):
        return False
    core = token.strip("=/_-")
    if "%" in core:
        core = unquote(core)
    n = len(core)
    if n < MIN_LEN or n > MAX_LEN:
        return False
    if _HEX.fullmatch(core):
        return False
    upper = lower = digit = 0
    for c in core:
        if "a" <= c <= "z":
            lower += 1
        elif "A" <= c <= "Z":
            upper += 1
        elif "0" <= c <= "9":
            digit += 1
    if not digit or not (upper or lower):
        return False
    if n < 32 and not (upper and lower):
        return False
    wordy = sum(m.end() - m.start() for m in _LOWER_RUN.finditer(core))
    if wordy >= max(_WORDY_MIN, _WORDY * n):
        return False
    if sum(m.end() - m.start() for m in _WORD.finditer(core)) >= _WORDS * n:
        return False
    counts = Counter(core)
    entropy = -sum(k / n * math.log2(k / n) for k in counts.values())
    return entropy >= _MIN_ENTROPY_RATIO * min(math.log2(n), 6.0)


def random_spans(text: str) -> list[tuple[int, int]]:
    """The (start, end) spans of random-looking tokens in ``text``."""
    out: list[tuple[int, int]] = []
    for m in _TOKEN.finditer(text):
        start, end = m.span()
        if text.endswith("base64,", 0, start):
            continue
        if looks_random(m[0]):
            out.append((start, end))
    return out
