"""Built-in secret detectors: the patterns persistkit redacts from every stored string.

Each detector is a ``kind`` (it names the handle, ``$CRED{<kind>-<tag>}``) and a
regular expression. When the pattern has a group named ``s``, only that group
is the secret (``Bearer <token>``: the word ``Bearer`` stays); otherwise the
whole match is. The rules aim at a low false-positive rate: fixed vendor
prefixes plus a minimum length, or a secret-looking value right after a
keyword that names it (AWS secret keys, ``Authorization``). A handle
(``$CRED{...}``) never matches a detector, so redacting twice changes nothing.

Patterns are compiled on first use, so ``import persistkit`` stays cheap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["BUILTIN", "Detector"]


@dataclass(frozen=True)
class Detector:
    """A named pattern. ``pattern`` is a regular expression over text; a group named
    ``s`` marks the secret part of a match (the rest of the match is kept).

    ``anchors`` (optional): literals one of which every match contains; the
    pattern then runs only where one occurs (a few µs per KB of text without
    one, however random the text), as ``locate`` says: ``"prefix"`` — a match
    starts at the anchor; ``"search"`` — the pattern is searched over the text.
    ``ignore_case``: the anchors are matched in any case.
    """

    kind: str
    pattern: str
    flags: int = 0
    anchors: tuple[str, ...] = ()
    locate: str = "search"
    ignore_case: bool = False
    _compiled: list[re.Pattern[str]] = field(default_factory=list, repr=False, compare=False)
    _anchor_rx: list[re.Pattern[str]] = field(default_factory=list, repr=False, compare=False)

    @property
    def regex(self) -> re.Pattern[str]:
        if not self._compiled:
            self._compiled.append(re.compile(self.pattern, self.flags))
        return self._compiled[0]

    @property
    def anchor_regex(self) -> re.Pattern[str]:
        """The anchors as one pattern (a literal search: str.find degrades on some texts)."""
        if not self._anchor_rx:
            alternatives = "|".join(re.escape(a) for a in sorted(self.anchors, key=len, reverse=True))
            self._anchor_rx.append(re.compile(alternatives, re.IGNORECASE if self.ignore_case else 0))
        return self._anchor_rx[0]


_B = r"(?<![A-Za-z0-9_])"  # a token starts at a non-word character (\b treats '-' as a boundary too)
_TOKEN_END = r"(?![A-Za-z0-9_-])"
AWS_ID_PREFIXES = ("AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AROA", "ANPA")

#: The built-in detectors, most specific first (an Anthropic key also looks like an OpenAI one).
BUILTIN: tuple[Detector, ...] = (
    # PEM private keys: BEGIN to the matching END line; a key cut off before END is
    # redacted to the end of the string (a partial key is still a secret).
    Detector(
        "private_key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY( BLOCK)?-----"
        r"(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY( BLOCK)?-----|[\s\S]*)",
        anchors=("PRIVATE KEY",),
    ),
    Detector("anthropic", _B + r"sk-ant-[A-Za-z0-9_-]{20,}", anchors=("sk-ant-",), locate="prefix"),
    Detector("openai", _B + r"sk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_-]{20,}", anchors=("sk-",), locate="prefix"),
    Detector(
        "aws_access_key",
        _B + r"(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}(?![A-Za-z0-9])",
        anchors=AWS_ID_PREFIXES,
        locate="prefix",
    ),
    # A 40-character base64 value is far too common to flag alone (hashes, ids); it
    # is an AWS secret key when a keyword naming one comes right before it.
    Detector(
        "aws_secret_key",
        r"(?i:aws_?secret_?(?:access_?)?key|secret_?access_?key|aws_?secret)[\"']?\s*[:=]\s*[\"']?"
        r"(?P<s>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
        anchors=("secret",),
        locate="keyword",  # the match starts at the anchor or up to 4 characters before ("aws_")
        ignore_case=True,
    ),
    Detector(
        "github",
        _B + r"(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})" + _TOKEN_END,
        anchors=("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
        locate="prefix",
    ),
    Detector(
        "slack",
        _B + r"(?:xox[bpars]-[A-Za-z0-9-]{10,}|xapp-[0-9]-[A-Za-z0-9-]{10,})",
        anchors=("xoxb-", "xoxp-", "xoxa-", "xoxr-", "xoxs-", "xapp-"),
        locate="prefix",
    ),
    Detector("google_api_key", _B + r"AIza[0-9A-Za-z_-]{35}" + _TOKEN_END, anchors=("AIza",), locate="prefix"),
    Detector(
        "stripe",
        _B + r"(?:sk_live|sk_test|rk_live|rk_test|pk_live)_[0-9A-Za-z]{16,}",
        anchors=("sk_live_", "sk_test_", "rk_live_", "rk_test_", "pk_live_"),
        locate="prefix",
    ),
    Detector(
        "jwt",
        _B + r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*" + r"(?![A-Za-z0-9_.-])",
        anchors=("eyJ",),
        locate="prefix",
    ),
    # "Bearer <token>" anywhere (an Authorization header copied into a log line or a
    # prompt); the token must look like one: 16+ characters of the token68 set.
    Detector(
        "bearer",
        r"(?i:\bbearer)\s+(?P<s>[A-Za-z0-9._~+/-]{16,}=*)",
        anchors=("bearer",),
        locate="prefix",
        ignore_case=True,
    ),
    Detector(
        "authorization",
        r"(?i:\bauthorization)[\"']?\s*[:=]\s*[\"']?(?i:basic|token|digest)\s+(?P<s>[A-Za-z0-9._~+/-]{8,}=*)",
        anchors=("authorization",),
        locate="prefix",
        ignore_case=True,
    ),
    # scheme://user:password@host -> scheme://user:$CRED{...}@host
    Detector(
        "url_password",
        r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{1,30}://[^\s/?#@:\"'<>]*:"
        r"(?!\$CRED\{)(?P<s>[^\s/?#@\"'<>]+)@",
        anchors=("://",),
        locate="scheme",  # the match starts where the run of scheme characters before "://" starts
    ),
)

# The first pass (``_redact._may_match_builtin``) finds candidates without the
# regex engine: keyword anchors — ``secret``, ``bearer``, ``authorization`` (any
# case), ``PRIVATE KEY``, ``eyJ`` (JWTs) and ``://`` with ``@`` — and, for the
# token detectors below, their whole fixed prefixes (``sk-``, ``gh[pousr]_``, ``github_pat_``,
# ``k_live_``, ``k_test_``, ``xox``, ``xapp-``, ``A`` + an AWS prefix, ``AIza``), confirmed
# by TOKEN_LOOSE matched at each occurrence of the detector's anchors.
# A new detector must add its anchor or prefix there.
#: The detectors whose matches are runs of token characters, found by their prefixes.
TOKEN_KINDS = frozenset({"anthropic", "openai", "aws_access_key", "github", "slack", "google_api_key", "stripe"})
#: The token detectors without their context assertions (a superset of what they
#: match), for JSON bytes: token characters are never escaped in JSON, but the
#: character before a token may be the ``n`` of an escaped newline.
TOKEN_LOOSE = tuple(
    d.pattern.replace(_B, "").replace(_TOKEN_END, "").replace("(?![A-Za-z0-9])", "")
    for d in BUILTIN
    if d.kind in TOKEN_KINDS
)

_SCHEME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+.-")


def matches(det: Detector, text: str) -> list[re.Match[str]]:
    """The non-overlapping matches of ``det`` in ``text``, in order (what ``regex.sub`` replaces).

    Linear in ``len(text)`` with a small constant for the built-in detectors: the
    pattern runs only where one of its anchors occurs, from the position its
    ``locate`` rule gives — never at every position of a long run of random
    characters (which cost ~200 µs per KB before).
    """
    rx = det.regex
    if not det.anchors:
        return list(rx.finditer(text))
    starts = [m.start() for m in det.anchor_regex.finditer(text)]
    if not starts:
        return []
    if det.locate == "search":
        return list(rx.finditer(text))
    out: list[re.Match[str]] = []
    end = 0
    for i in starts:
        if det.locate == "scheme":  # back to the start of the run of scheme characters
            j = i
            while j > 0 and i - j <= 31 and text[j - 1] in _SCHEME_CHARS:
                j -= 1
            tries: tuple[int, ...] = (j,)
        elif det.locate == "keyword":
            tries = tuple(range(max(i - 4, 0), i + 1))
        else:
            tries = (i,)
        for j in tries:
            if j < end:
                continue
            m = rx.match(text, j)
            if m is not None:
                out.append(m)
                end = max(m.end(), j + 1)
                break
    return out
