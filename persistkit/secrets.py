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
(``from_env``) resolves it there. A stored value that was all secret and that
nothing can resolve raises ``SecretResolutionError`` when loaded; a handle
inside a longer text stays as handle text.
"""

from ._detect import BUILTIN as DETECTORS
from ._detect import Detector
from ._errors import SecretResolutionError
from ._secrets import (
    Redactor,
    Secret,
    Vault,
    configure,
    from_env,
    register,
    resolve,
    scrub,
    unregister,
)
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
    "register",
    "resolve",
    "scrub",
    "unregister",
]
