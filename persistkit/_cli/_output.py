"""The one output helper of the CLI: tables for people, JSON for programs.

Every verb prints through :class:`Output`, so that ``--json`` means the same
everywhere and a closed pipe (``persistkit history t | head``) ends quietly.
Values are printed as they are stored: secret handles stay handles. In a
table, text that is not plain printable text (a newline, a control character,
a backslash, a quote or space at either end) is shown as a Python string
literal, so one cell never looks like two rows or like another id; ``--json``
gives every value exactly.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

__all__ = ["Output", "Shown", "cell", "dumps"]

_QUOTES = ("'", '"')


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


def dumps(value: Any, *, indent: int | None = 2) -> str:
    """JSON text of an already plain value (see ``_open.plain``)."""
    return json.dumps(value, indent=indent, ensure_ascii=False, default=str)


class Output:
    """Writes one verb's result to ``stream``: a table (default) or JSON (``as_json``)."""

    def __init__(self, *, as_json: bool = False, stream: TextIO | None = None) -> None:
        self.as_json = as_json
        self.stream = stream if stream is not None else sys.stdout

    def line(self, text: str) -> None:
        self.stream.write(text + "\n")

    def value(self, value: Any) -> None:
        """One JSON document (``state``), whatever the format."""
        self.line(dumps(value))

    def table(
        self, columns: Sequence[str], rows: Iterable[Sequence[Any]], *, widths: Sequence[int] = (), header: bool = True
    ) -> None:
        """Rows under a header, columns padded to ``widths`` (the last is never
        padded); with ``as_json``, one JSON list of objects keyed by column."""
        if self.as_json:
            self.value([dict(zip(columns, row, strict=True)) for row in rows])
            return
        pads = list(widths) + [0] * (len(columns) - len(widths))
        if header:
            self.line(self._row(columns, pads))
        for row in rows:
            self.line(self._row([cell(value) for value in row], pads))

    @staticmethod
    def _row(cells: Sequence[str], pads: Sequence[int]) -> str:
        last = len(cells) - 1
        return "  ".join(cell if i == last else f"{cell:<{pads[i]}}" for i, cell in enumerate(cells)).rstrip()
