"""The one output helper of the CLI: tables for people, JSON for programs.

Every verb prints through :class:`Output`, so that ``--json`` means the same
everywhere and a closed pipe (``persistkit history t | head``) ends quietly.
Values are printed as they are stored: secret handles stay handles. In a
table, text that is not plain printable text (a newline, a control character,
a backslash, a quote or space at either end) is shown as a Python string
literal, so one cell never looks like two rows or like another id; ``--json``
gives every value exactly.

On a terminal (or with ``$COLUMNS`` set) a table fits the width
:func:`shutil.get_terminal_size` gives: the widest columns are narrowed first
and a cell cut short ends with an ellipsis (``…``). Into a pipe or a file, rows
are written whole, as scripts read them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any, TextIO

__all__ = ["ELLIPSIS", "Output", "Shown", "cell", "clip", "dumps"]

_QUOTES = ("'", '"')
ELLIPSIS = "\u2026"
#: A column is never narrowed below this (or its header, when shorter).
_MIN_WIDTH = 5


class Shown(str):
    """Text a verb already made safe for a table cell (e.g. a list of ``repr``-ed names)."""

    __slots__ = ()


def cell(value: Any) -> str:
    """``value`` as one table cell: plain text as it is, anything else as a string literal."""
    if isinstance(value, Shown):
        return str(value)
    text = "" if value is None else str(value)
    if text.isprintable() and "\\" not in text and text == text.strip() and not text.startswith(_QUOTES) and not text.endswith(_QUOTES):
        return text
    return repr(text)


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, its end an ellipsis when anything was cut."""
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: width - 1] + ELLIPSIS


def dumps(value: Any, *, indent: int | None = 2) -> str:
    """JSON text of an already plain value (see ``_open.plain``)."""
    return json.dumps(value, indent=indent, ensure_ascii=False, default=str)


class Output:
    """Writes one verb's result to ``stream``: a table (default) or JSON (``as_json``)."""

    def __init__(self, *, as_json: bool = False, stream: TextIO | None = None, width: int | None = None) -> None:
        self.as_json = as_json
        self.stream = stream if stream is not None else sys.stdout
        self._width = width

    @property
    def width(self) -> int | None:
        """The width text is fitted to on a terminal: ``$COLUMNS``, else the terminal's; None
        into a pipe or file."""
        if self._width is not None:
            return self._width
        isatty = getattr(self.stream, "isatty", None)
        if not (callable(isatty) and isatty()):
            # into a pipe or a file, whatever $COLUMNS says (libraries set it, and a script
            # reading the rows must get them whole)
            return None
        columns = os.environ.get("COLUMNS", "").strip()
        return int(columns) if columns.isdigit() and int(columns) > 0 else shutil.get_terminal_size().columns

    def line(self, text: str) -> None:
        self.stream.write(text + "\n")

    def value(self, value: Any) -> None:
        """One JSON document (``state``), whatever the format."""
        self.line(dumps(value))

    def table(
        self, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, widths: Sequence[int] = (),
        header: bool = True, keep: Sequence[int] = (), keys: Sequence[str] = (),
    ) -> None:
        """Rows under a header, columns padded to ``widths`` (the last is never
        padded) and narrowed to fit :attr:`width`, except the columns ``keep``
        (ids a reader copies into the next command); with ``as_json``, one JSON
        list of objects keyed by ``keys`` (default: the columns), the names the other
        verbs' JSON uses for the same fields."""
        if self.as_json:
            self.value([dict(zip(keys or columns, row, strict=True)) for row in rows])
            return
        pads = list(widths) + [0] * (len(columns) - len(widths))
        cells = [[cell(value) for value in row] for row in rows]
        width = self.width
        fitted = width is not None
        if width is not None:
            pads = _fit([*([list(columns)] if header else []), *cells], pads, width, columns if header else (), keep)
        for row in ([[str(c) for c in columns]] if header else []) + cells:
            text = self._row(row, pads, fitted)
            # columns at their narrowest may still not fit: the line is cut at the edge
            self.line(text if width is None else clip(text, width))

    @staticmethod
    def _row(cells: Sequence[str], pads: Sequence[int], fitted: bool) -> str:
        last = len(cells) - 1
        if fitted:
            cells = [clip(c, pads[i]) for i, c in enumerate(cells)]
        return "  ".join(c if i == last else f"{c:<{pads[i]}}" for i, c in enumerate(cells)).rstrip()


def _fit(
    rows: Sequence[Sequence[str]], pads: Sequence[int], width: int, heads: Sequence[str], keep: Sequence[int] = ()
) -> list[int]:
    """Column widths for ``rows`` within ``width`` characters (two spaces between columns):
    each column as wide as its widest cell (at least its pad), then the widest narrowed
    one character at a time until the row fits or every column is at its minimum
    (``_MIN_WIDTH``, or its header's length when that is shorter; ``keep``: never narrowed)."""
    n = len(pads)
    # fitted, a column is as wide as what it shows (its pad is for whole rows into a pipe)
    want = [max(len(r[i]) for r in rows) if rows else pads[i] for i in range(n)]
    floor = [want[i] if i in keep else min(want[i], _MIN_WIDTH, len(heads[i]) if heads else _MIN_WIDTH)
             for i in range(n)]
    room = width - 2 * (n - 1)
    excess = sum(want) - room
    while excess > 0:
        i = max(range(n), key=lambda k: (want[k] - floor[k], k))
        if want[i] <= floor[i]:
            break
        want[i] -= 1
        excess -= 1
    return want


@contextlib.contextmanager
def whole_file(path: str, mode: str = "wb") -> Iterator[IO[Any]]:
    """``path`` opened for writing so that it ends up written whole or not at all: into a
    temporary file beside it, renamed over it at the end (removed on any error). A symlink
    is followed (its target is replaced, the link stays); a FIFO, a device or a socket is
    written to directly: it cannot be replaced, and its reader is waiting for the bytes."""
    real = os.path.realpath(path)
    try:
        special = not stat.S_ISREG(os.stat(real).st_mode)
    except FileNotFoundError:
        special = False
    encoding = None if "b" in mode else "utf-8"
    if special:
        with open(real, mode, encoding=encoding) as f:
            yield f
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(real)}.", suffix=".part", dir=os.path.dirname(real))
    try:
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
