"""``dynamodb create-table``: create a DynamoDB store's table (the store never creates it unasked)."""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .._errors import ConfigurationError
from ..backends import mask_url
from ..secrets._redact import scrub
from ._open import resolve_url
from ._output import Output

__all__ = ["add_parsers"]


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    d = sub.add_parser(
        "dynamodb",
        parents=[common],
        help="create a DynamoDB store's table",
        description="`persistkit dynamodb create-table --url dynamodb://TABLE?region=…`: create "
        "the table (partition key p, sort key s, on-demand capacity) and wait until it is active. "
        "Needs dynamodb:CreateTable and DescribeTable. An existing table is left as it is.",
    )
    d.add_argument("action", choices=["create-table"])
    d.add_argument("--json", action="store_true", help="print JSON instead of a sentence")
    d.set_defaults(func=_create_table)


def create(url: str, verb: str = "dynamodb create-table") -> bool:
    """Create the table of the store at ``url`` (``dynamodb://TABLE``); False when it existed."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "dynamodb" or not parts.netloc:
        raise ConfigurationError(
            f"`persistkit {verb}` takes a dynamodb://TABLE URL, not {scrub(mask_url(url))!r}"
        )
    from ..backends.dynamodb import create_table, make_client

    query = dict(parse_qsl(parts.query))
    client = make_client(query.get("endpoint_url"), query.get("region"))
    try:
        return create_table(client, parts.netloc)
    finally:
        client.close()


def _create_table(ns: argparse.Namespace, out: Output) -> int:
    url = resolve_url(ns.url)
    shown = scrub(mask_url(url))
    made = create(url)
    parts = urlsplit(url)
    if out.as_json:
        out.value({"url": shown, "table": parts.netloc, "created": made})
    else:
        out.line(
            f"{shown}: table {parts.netloc!r} "
            + ("created" if made else "exists already; left as it is")
        )
    return 0
