"""Corpora for the secret rules: ordinary strings that are not secrets, and generated secrets.

Used by ``bench/bench_redact.py`` (false-positive rate and recall of the
high-entropy rule) and by the tests. Deterministic for a given seed.

clean(seed)    UUIDs, hex digests (md5, sha1, sha256, sha512, blake2b), run and
               checkpoint-like ids, file paths and tracebacks lines, URLs
               without credentials, base64 of small PNG/GIF/JPEG images and
               data URLs, English sentences (stdlib docstrings), code (stdlib
               source lines), identifiers.
secrets(seed)  (format, secret) pairs: random base64 / base64url / base62 /
               alphanumeric keys of 20-64 characters, AWS secret access keys,
               vendor-style keys with a prefix, the same secrets percent-encoded
               and base64-encoded, and hex keys (reported apart: the rule leaves
               hex to the pattern detectors, see docs/security.md).
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import random
import string
import struct
import uuid
import zlib
from urllib.parse import quote

_B62 = string.ascii_letters + string.digits
_B64 = _B62 + "+/"
_B64URL = _B62 + "-_"

_MODULES = ("json", "argparse", "pathlib", "textwrap", "logging", "subprocess", "shutil", "csv", "email.message", "http.client")


def _png(rng: random.Random, w: int, h: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(rng.randrange(256) for _ in range(w * 3)) for _ in range(h))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _texts() -> tuple[list[str], list[str]]:
    import importlib

    prose: list[str] = []
    code: list[str] = []
    for name in _MODULES:
        mod = importlib.import_module(name)
        try:
            src = inspect.getsource(mod)
        except (OSError, TypeError):  # pragma: no cover - stdlib without sources
            continue
        code.extend(line.strip() for line in src.splitlines() if len(line.strip()) > 20)
        for obj in vars(mod).values():
            doc = getattr(obj, "__doc__", None)
            if isinstance(doc, str):
                prose.extend(p.strip() for p in doc.split(".") if len(p.strip()) > 20)
    return prose, code


def clean(seed: int = 1, per_kind: int = 200) -> dict[str, list[str]]:
    rng = random.Random(seed)
    prose, code = _texts()
    words = [w for w in " ".join(prose).split() if w.isalpha() and w.islower()] or ["data"]
    out: dict[str, list[str]] = {}
    out["uuid"] = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(per_kind)]
    digests = []
    for i in range(per_kind):
        data = rng.randbytes(32)
        algo = ("md5", "sha1", "sha256", "sha512", "blake2b")[i % 5]
        digests.append(hashlib.new(algo, data).hexdigest())
    out["hex digest"] = digests
    out["ids"] = [rng.randbytes(16).hex() for _ in range(per_kind)]
    paths = []
    for _ in range(per_kind):
        parts = [rng.choice(words) for _ in range(rng.randrange(2, 7))]
        ext = rng.choice([".py", ".json", ".txt", ".md", "", ".tar.gz"])
        name = "_".join(rng.choice(words) for _ in range(rng.randrange(1, 4))) + ext
        p = "/" + "/".join(parts) + "/" + name
        paths.append(rng.choice([p, f'File "{p}", line {rng.randrange(1, 2000)}, in {rng.choice(words)}', "C:\\" + p[1:].replace("/", "\\")]))
    out["file path"] = paths
    urls = []
    for _ in range(per_kind):
        host = ".".join(rng.choice(words) for _ in range(2)) + rng.choice([".com", ".org", ".io"])
        path = "/".join(rng.choice(words) for _ in range(rng.randrange(1, 5)))
        query = f"?page={rng.randrange(100)}&sort={rng.choice(words)}" if rng.random() < 0.5 else ""
        urls.append(f"https://{host}/{path}{query}")
    out["url"] = urls
    images = []
    for i in range(per_kind):
        kind = i % 3
        if kind == 0:
            raw = _png(rng, rng.randrange(1, 6), rng.randrange(1, 6))
        elif kind == 1:
            raw = b"GIF89a" + rng.randbytes(rng.randrange(20, 120))
        else:
            raw = b"\xff\xd8\xff\xe0" + rng.randbytes(rng.randrange(40, 200))
        text = base64.b64encode(raw).decode()
        images.append(text if i % 2 else f"data:image/png;base64,{text}")
    out["base64 image"] = images
    out["english"] = rng.sample(prose, min(per_kind, len(prose)))
    out["code"] = rng.sample(code, min(per_kind, len(code)))
    out["identifiers"] = [
        rng.choice(["get", "set", "load", "make", "parse"])
        + "".join(w.capitalize() for w in rng.sample(words, 3))
        + str(rng.randrange(100))
        for _ in range(per_kind)
    ]
    return out


def secrets(seed: int = 2, per_kind: int = 200) -> dict[str, list[str]]:
    rng = random.Random(seed)

    def rand(alphabet: str, lo: int, hi: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(lo, hi + 1)))

    out: dict[str, list[str]] = {}
    out["aws secret (40 base64)"] = [rand(_B64, 40, 40) for _ in range(per_kind)]
    out["base64 of random bytes"] = [base64.b64encode(rng.randbytes(rng.randrange(16, 48))).decode() for _ in range(per_kind)]
    out["base64url token"] = [rand(_B64URL, 22, 64) for _ in range(per_kind)]
    out["alphanumeric key"] = [rand(_B62, 20, 64) for _ in range(per_kind)]
    out["prefixed key"] = [
        rng.choice(["key-", "tok_", "api_", "pat-", "SG.", "glpat-", "hf_", "sq0atp-", "dop_v1_"]) + rand(_B62, 24, 48)
        for _ in range(per_kind)
    ]
    out["percent-encoded"] = [quote(rand(_B64, 40, 40), safe="") for _ in range(per_kind)]
    out["base64 of a secret"] = [base64.b64encode(rand(_B62, 24, 40).encode()).decode() for _ in range(per_kind)]
    out["hex key (not in scope)"] = [rng.randbytes(rng.choice((16, 20, 32))).hex() for _ in range(per_kind)]
    return out


def in_sentence(rng: random.Random, secret: str) -> str:
    """``secret`` inside an error-like sentence, with the separators real messages use."""
    left = rng.choice(["upstream rejected key ", "token=", "auth failed for '", "value: ", "(", "key \"", ""])
    right = rng.choice([" (x)", "'", "\"", ")", ".", ", retry later", ""])
    return f"{left}{secret}{right}"
