"""Secrets planted through the adapters, and the raw bytes of a store to look for them in.

``fresh_keys()`` makes new random keys of many formats for every test (nothing
is tuned to one string). ``raw_bytes(url)`` reads what the store really holds:
the SQLite file (and its WAL), PostgreSQL rows copied out in binary, every
Redis value under the store's prefix, every S3 object under its prefix.
``leaks(data, keys)`` names the keys found in it in any encoding: as they are,
base64 (standard and URL-safe, at each of the three alignments, as a key
inside a longer encoded value lands), and hex.

Stores are opened with compression off (``compress_threshold``), so that a
key that reached storage shows in the bytes rather than hiding inside zstd.
"""

from __future__ import annotations

import base64
import secrets
import string
import urllib.parse
from pathlib import Path

import persistkit as pk

NO_COMPRESSION = 1 << 30
_ALNUM = string.ascii_letters + string.digits


def _rand(n: int, alphabet: str = _ALNUM) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def _b64url(n: int) -> str:
    return base64.urlsafe_b64encode(secrets.token_bytes(n)).rstrip(b"=").decode()


def fresh_keys() -> dict[str, str]:
    """One new key per format, named by kind."""
    return {
        "openai": "sk-proj-" + _rand(48, _ALNUM + "_-"),
        "anthropic": "sk-ant-api03-" + _rand(60, _ALNUM + "_-"),
        "github": "ghp_" + _rand(36),
        "github_pat": "github_pat_" + _rand(60, _ALNUM + "_"),
        "slack": f"xoxb-{_rand(12, string.digits)}-{_rand(24)}",
        "aws_access_key": "AKIA" + _rand(16, string.ascii_uppercase + string.digits),
        "google_api_key": "AIza" + _rand(35, _ALNUM + "_-"),
        "stripe": "sk_live_" + _rand(32),
        "jwt": f"eyJhbGciOiJIUzI1NiJ9.eyJ{_b64url(24)}.{_b64url(32)}",
        "aws_secret_key": _rand(40, _ALNUM + "/+"),
    }


def text(keys: dict[str, str]) -> str:
    """A message mentioning every key the way text does (AWS secret keys after their keyword)."""
    parts = [
        f"aws_secret_access_key={key}" if kind == "aws_secret_key" else f"the {kind} key is {key} ."
        for kind, key in keys.items()
    ]
    return "\n".join(parts)


def encodings(key: str) -> dict[str, bytes]:
    """Substrings that a store holding ``key`` in some encoding must contain."""
    raw = key.encode()
    out = {"plain": raw, "hex": raw.hex().encode()}
    for offset in range(3):
        full = base64.b64encode(b"\0" * offset + raw)
        # Drop the characters the unknown neighbouring bytes also decide.
        middle = full[4 if offset else 0 : -4]
        out[f"base64+{offset}"] = middle
        out[f"base64url+{offset}"] = middle.translate(bytes.maketrans(b"+/", b"-_"))
    return out


def leaks(data: bytes, keys: dict[str, str]) -> list[str]:
    """``kind/encoding`` of every planted key that ``data`` contains."""
    found = []
    for kind, key in keys.items():
        for enc, needle in encodings(key).items():
            if needle in data:
                found.append(f"{kind}/{enc}")
    return found


def raw_bytes(url: str) -> bytes:
    """Every byte the store at ``url`` holds (see the module docstring)."""
    scheme = url.split(":", 1)[0]
    if scheme == "sqlite":
        path = Path(urllib.parse.urlparse(url).path)
        parts = [p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists()]
        return b"".join(parts)
    if scheme.startswith("postgres"):
        return _postgres(url)
    if scheme == "redis":
        return _redis(url)
    if scheme == "s3":
        return _s3(url)
    raise AssertionError(f"no raw view of {url}")


def _postgres(url: str) -> bytes:
    import psycopg

    parsed = urllib.parse.urlparse(url)
    schema = urllib.parse.parse_qs(parsed.query).get("schema", ["persistkit"])[0]
    out = []
    with psycopg.connect(parsed._replace(query="").geturl()) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
        for (table,) in tables:
            with conn.cursor().copy(f'COPY "{schema}"."{table}" TO STDOUT (FORMAT binary)') as copy:
                out.extend(bytes(chunk) for chunk in copy)
    return b"".join(out)


def _redis(url: str) -> bytes:
    import redis

    parsed = urllib.parse.urlparse(url)
    prefix = urllib.parse.parse_qs(parsed.query)["prefix"][0]
    client = redis.Redis.from_url(parsed._replace(query="").geturl())
    out: list[bytes] = []
    try:
        for key in client.scan_iter(match=prefix + "*"):
            kind = client.type(key)
            if kind == b"string":
                out.append(client.get(key) or b"")
            elif kind == b"hash":
                for k, v in client.hgetall(key).items():
                    out += [k, v]
            elif kind == b"list":
                out += client.lrange(key, 0, -1)
            elif kind == b"set":
                out += list(client.smembers(key))
            elif kind == b"zset":
                out += [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
            elif kind == b"stream":
                for _, fields in client.xrange(key):
                    for k, v in fields.items():
                        out += [k, v]
            else:
                raise AssertionError(f"redis key {key!r} of type {kind!r}: no raw view")
    finally:
        client.close()
    return b"".join(out)


def _s3(url: str) -> bytes:
    import boto3

    parsed = urllib.parse.urlparse(url)
    endpoint = urllib.parse.parse_qs(parsed.query)["endpoint_url"][0]
    client = boto3.client("s3", endpoint_url=endpoint)
    prefix = parsed.path.lstrip("/")
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=parsed.netloc, Prefix=prefix):
        for obj in page.get("Contents", []):
            out.append(client.get_object(Bucket=parsed.netloc, Key=obj["Key"])["Body"].read())
    return b"".join(out)


def connect(url: str) -> pk.Store:
    """The store at ``url`` with compression off (see the module docstring)."""
    return pk.connect(url, compress_threshold=NO_COMPRESSION)
