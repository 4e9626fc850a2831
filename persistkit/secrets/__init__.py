"""Secrets never reach storage: mark them, and persistkit stores opaque handles instead.

Mark a secret by type (``pk.Secret("sk-...", name="openai")``, pydantic
``SecretStr``/``SecretBytes`` fields), by name (:func:`register`,
:func:`from_env`), or let the built-in detectors find it in any string
persistkit is about to store (API keys, tokens, JWTs, private keys, passwords
in URLs; see :data:`DETECTORS`). Each becomes ``$CRED{name}`` before
anything is written.

Handles resolve back only at the point of use, through what you configure:
registered values and resolvers, environment variables, a callable
(``configure(resolver=...)``) and an encrypted vault file (:class:`FileVault`,
``pip install "persistkit[crypto]"``) that keeps detected secrets apart from
the store. Default: detection on, no vault — a detected secret is never
stored anywhere. Its handle is named with the store's handle key, the same in
every process, so registering the value in a new process under any name
(``from_env``) resolves it there.

Zero configuration for keys from the environment: a value that an environment
variable holding a credential has (``OPENAI_API_KEY``, AWS keys, a DSN's
password) is stored as ``$CRED{env:VAR}`` wherever it sits and resolves from
the environment of whichever process reads it (``configure(environment=...)``).

Loading never needs a value: a handle nothing resolves stays handle text (a
resume, a replayed step, ``store.get_state``, which never resolves at all). It is
resolved where it enters a live call — a step's arguments and the run's state
before the body, an adapter's tool and model calls (:func:`live`) — or that call
fails before it runs with ``SecretResolutionError``.
"""

from .._errors import SecretResolutionError
from ._detect import BUILTIN as DETECTORS
from ._detect import Detector
from ._live import live, resolve
from ._redact import Redactor, Secret, Vault, configure, from_env, register, scrub, unregister
from ._vault import FileVault

__all__ = [
    "DETECTORS",
    "Detector",
    "FileVault",
    "Redactor",
    "Secret",
    "SecretResolutionError",
    "Vault",
    "configure",
    "from_env",
    "live",
    "register",
    "resolve",
    "scrub",
    "unregister",
]
