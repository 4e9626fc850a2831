"""Secrets become opaque handles before anything is stored, and come back only at the point of use.

Write side (``Redactor.redact_json``, called by ``Codec.dump_tree`` on every
byte string persistkit stores): one cheap pass of substring checks over the
serialized JSON; only when something could be a secret is the tree walked and
each string rewritten:

1. a literal ``$CRED{`` already in the text is escaped to ``$CRED{$}`` (so text
   an attacker wrote can never turn into a handle that resolves on load);
2. every registered value (``pk.secrets.register``) becomes ``$CRED{<name>}``;
3. every match of a detector (``_detect``) becomes ``$CRED{<kind>-<tag>}``, the
   tag a keyed hash of the value (the vault's key, else the store's handle key
   from ``_handlekey`` where a store reader cannot use it to test guesses, else
   a per-process key: see ``Redactor._key_for``): it never reveals the value
   and is the same in every process that uses the store or the vault. The value
   goes to the vault, if one is configured;
4. in recorded errors and run metadata only, random-looking tokens
   (``_entropy``) become ``$CRED{high_entropy-<tag>}``; in a record holding an
   AWS access key id, a bare 40-character AWS-secret-looking value becomes
   ``$CRED{aws_secret_key-<tag>}``.

JSON of 4 KB or more is remembered with its redacted form, so an unchanged
value is not scanned again.

``pk.Secret`` and pydantic ``SecretStr`` / ``SecretBytes`` values are encoded
by the serializer as a handle only (tag ``sec``).

Read side: strings in decoded values have their handles substituted back when
a resolver knows them (registered values and resolvers, this process's memory
of what it redacted, the configured resolver callable, the vault, a registered
value whose tag is the handle's), else keep the handle text — except a string
that is one handle and nothing else, which raises ``SecretResolutionError``. ``Secret`` / ``SecretStr`` come back lazy: they resolve at
``.reveal()`` / ``.get_secret_value()``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .._errors import ConfigurationError, IntegrityError, SecretResolutionError, install_scrubber
from . import _env as _envsecrets
from ._detect import BUILTIN, TOKEN_KINDS, matches
from ._entropy import random_spans
from ._registry import (
    _MIN_REGISTERED,
    Vault,
    _check_name,
    _config,
    _env_sync,
    _generation,
    _learn,
    _loaded,
    _lock,
    _memory,
    _resolvers,
    _search,
    _search_hot,
    _unresolved_live,
    _values,
    configure,
    from_env,
    register,
    unregister,
)
from ._scan import _may_match_builtin  # noqa: F401 - the first pass, checked by the tests from here
from ._scan import candidates as _candidates
from ._scan import extra_match as _extra_match
from ._scan import has_access_key_id as _has_access_key_id

if TYPE_CHECKING:
    from pydantic import GetCoreSchemaHandler
    from pydantic_core import CoreSchema

    from ..backends import Backend

__all__ = [
    "Redactor",
    "Secret",
    "Vault",
    "configure",
    "default_redactor",
    "from_env",
    "register",
    "resolve",
    "scrub",
    "unregister",
]

T = TypeVar("T", str, bytes)
_HANDLE_RE = re.compile(r"\$CRED\{([^{}\s]{1,200})\}")
_MEMORY_LIMIT = 10_000
_PROCESS_KEY = os.urandom(32)  # names handles when neither a vault nor the store can give a key
_MASK = "**********"
#: Kinds whose values are machine-made random tokens: a key a store reader can read
#: does not let them guess these from a handle's tag (see Redactor._key_for).
_UNGUESSABLE = TOKEN_KINDS | {"private_key", "jwt", "aws_secret_key", "high_entropy"}
#: Top-level keys of a record whose text is written for people (recorded errors,
#: run metadata): the high-entropy rule applies there, not to state or results.
PEOPLE_KEYS = ("e", "m")
#: Stored JSON at least this long is remembered with its redacted form, so an
#: unchanged value (a big state channel re-serialized at every step) is not scanned again.
_CACHE_MIN = 4096
_CACHE_BYTES = 64 << 20


# -- the Secret type ------------------------------------------------------------------------

_UNSET: Any = object()


class Secret(Generic[T]):
    """A secret value that is never stored, logged or shown: stored as a handle.

    ``pk.Secret("sk-...", name="openai")`` is stored as ``$CRED{openai}``; without a
    name the handle is ``$CRED{secret-<keyed hash>}``. ``repr``/``str`` show only the
    name; ``.reveal()`` returns the value (resolving it lazily for a loaded Secret).
    Works as a pydantic field type: ``key: pk.Secret[str]``.
    """

    __slots__ = ("_redactor", "_value", "name")

    def __init__(self, value: T, *, name: str | None = None) -> None:
        if not isinstance(value, str | bytes):
            raise ConfigurationError(f"pk.Secret holds a str or bytes, got {type(value).__name__}")
        self._value: Any = value
        self.name = None if name is None else _check_name(name)
        self._redactor: Redactor | None = None

    @classmethod
    def _from_handle(cls, name: str, redactor: Redactor | None) -> Secret[Any]:
        obj = cls.__new__(cls)
        obj._value, obj.name, obj._redactor = _UNSET, name, redactor
        return obj

    def reveal(self) -> T:
        """The secret value. A loaded Secret resolves its handle now (``SecretResolutionError`` if nothing knows it)."""
        if self._value is _UNSET:
            value = (self._redactor or default_redactor()).lookup(str(self.name))
            if value is None:
                raise _unresolved(str(self.name), self._redactor or default_redactor())
            self._value = value
        return self._value  # type: ignore[no-any-return]

    @property
    def handle(self) -> str:
        """The handle text this secret is stored as (named once it has been stored)."""
        return f"$CRED{{{self.name}}}" if self.name else "$CRED{secret}"

    def __repr__(self) -> str:
        return f"Secret({self.name or ''!r}, {_MASK!r})" if self.name else f"Secret({_MASK!r})"

    def __str__(self) -> str:
        return _MASK

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        if self._value is _UNSET or other._value is _UNSET:
            return self.name is not None and self.name == other.name
        return bool(self._value == other._value and self.name == other.name)

    def __hash__(self) -> int:
        return hash(("pk.Secret", self.name))

    def __reduce__(self) -> Any:
        raise TypeError("pk.Secret cannot be pickled (it would carry the value in clear)")

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        from pydantic_core import core_schema

        def validate(value: Any) -> Secret[Any]:
            if isinstance(value, Secret):
                return value
            if isinstance(value, str | bytes):
                return Secret(value)
            raise ValueError("expected a pk.Secret, str or bytes")

        return core_schema.no_info_plain_validator_function(
            validate, serialization=core_schema.plain_serializer_function_ser_schema(str)
        )


def _unresolved(name: str, red: Redactor | None = None) -> SecretResolutionError | IntegrityError:
    from ._handlekey import retired_key_error  # the store's handle key under a retired key: say so

    if red is not None and red._backend is not None and (err := retired_key_error(red._backend, name)):
        return IntegrityError(f"handle $CRED{{{name}}} cannot be resolved: {err}")
    kind, _, tag = name.rpartition("-")
    if name.startswith(_envsecrets.PREFIX):
        how = _envsecrets.status(name)
    elif kind and len(tag) == 16 and kind not in _UNGUESSABLE:
        # Tagged with the store's key only in an encrypted store, else with the writing
        # process's own key (a store reader must not test password guesses against it).
        how = (
            f"A {kind!r} handle (a value a person may have chosen: a password, a bearer token, "
            "a SecretStr) is tagged with the store's key only when the store is encrypted or a "
            "vault is configured; otherwise with a key of the process that stored it, and no value "
            "registered now can match it. Configure the vault it was stored in "
            "(pk.secrets.configure(vault=pk.secrets.FileVault(...))); to get such values back in "
            "new processes, configure a vault or encryption= in every process from the first run "
            f"on, or register the value by name before the first run (pk.secrets.from_env({kind!r}, "
            "'ENV_VAR')): it is then stored as that name's handle"
        )
    elif kind and len(tag) == 16:  # a detected token: any registered value with this tag resolves it
        how = (
            f"Register the value in this process under any name before resuming "
            f"(pk.secrets.from_env({kind!r}, 'ENV_VAR') or pk.secrets.register({kind!r}, value)): "
            "a registered value whose keyed tag is this handle's resolves it. Or configure the "
            "vault it was stored in (pk.secrets.configure(vault=pk.secrets.FileVault(...)))"
        )
    else:
        how = (
            f"Register it (pk.secrets.register({name!r}, ...) or pk.secrets.from_env({name!r}, 'ENV_VAR')) "
            "or configure the vault it was stored in (pk.secrets.configure(vault=...))"
        )
    if name.startswith(_envsecrets.PREFIX):
        return SecretResolutionError(f"handle $CRED{{{name}}} cannot be resolved. {how}", handle=name)
    return SecretResolutionError(
        f"handle $CRED{{{name}}} cannot be resolved: no registered value or resolver, no "
        f"environment binding and no vault entry knows it. {how}",
        handle=name,
    )


def _lazy_secret_str(kind: str, name: str, redactor: Redactor) -> Any:
    """A pydantic SecretStr/SecretBytes whose value is resolved at get_secret_value()."""
    import pydantic

    base = pydantic.SecretStr if kind == "str" else pydantic.SecretBytes
    cls = _LAZY.get(kind)
    if cls is None:

        class Lazy(base):  # type: ignore[valid-type,misc]
            _pk_handle: str = ""
            _pk_redactor: Any = None

            def get_secret_value(self) -> Any:
                if self._pk_handle:
                    value = self._pk_redactor.lookup(self._pk_handle)
                    if value is None:
                        raise _unresolved(self._pk_handle, self._pk_redactor)
                    self._secret_value = value.encode() if kind == "bytes" and isinstance(value, str) else value
                    self._pk_handle = ""
                return self._secret_value

            def __len__(self) -> int:
                return len(self.get_secret_value())

            def _display(self) -> Any:  # repr/str: masked as a set secret, not as an empty one
                return ("**********" if kind == "str" else b"**********") if self._pk_handle else super()._display()

        Lazy.__name__ = Lazy.__qualname__ = base.__name__
        cls = _LAZY[kind] = Lazy
    obj = cls("" if kind == "str" else b"")
    obj._pk_handle, obj._pk_redactor = name, redactor
    return obj


_LAZY: dict[str, type] = {}


def resolve(value: Any, *, redactor: Redactor | None = None) -> Any:
    """Resolve explicitly: a ``Secret`` to its value, a text's handles to their values
    (``pk.secrets.resolve`` is ``_live.resolve``: containers read back from a store too).

    Raises ``SecretResolutionError`` naming the first handle nothing knows.
    """
    if isinstance(value, Secret):
        return value.reveal()
    red = redactor or default_redactor()
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            if m[1] == "$":
                return "$CRED{"
            found = red.lookup(m[1])
            if found is None:
                raise _unresolved(m[1], red)
            return found if isinstance(found, str) else found.decode("utf-8", "replace")

        return _HANDLE_RE.sub(sub, value)
    if hasattr(value, "get_secret_value"):
        return value.get_secret_value()
    raise ConfigurationError(
        f"pk.secrets.resolve takes a str, a Secret or a value read back from a store, got {type(value).__name__}"
    )


def scrub(text: str) -> str:
    """``text`` with registered values and detected secrets replaced by handles; no side effects.

    Used on every message persistkit puts in an exception, a log line or CLI output.
    """
    _env_sync()
    return default_redactor().redact_text(text, stable=True, escape=False)


# -- the redactor ---------------------------------------------------------------------------


class Redactor:
    """Turns secrets into handles in stored trees, and handles back into values on load.

    ``detect``/``vault`` of None follow ``pk.secrets.configure``; ``enabled=False``
    stores free text as is (Secret types are still stored as handles). A store
    attaches its backend (:meth:`attach`): the store's handle key then names
    detected secrets' handles, the same in every process (``_handlekey``).
    """

    def __init__(
        self, *, enabled: bool = True, detect: bool | None = None, vault: Vault | None = None
    ) -> None:
        self.enabled = enabled
        self._detect = detect
        self._vault = vault
        self._vaulted: set[str] = set()
        self._backend: Backend | None = None
        # scan cache: (len, head, tail, mode, generation) -> (JSON bytes, redacted bytes)
        self._scanned: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}
        self._scanned_bytes = 0

    def attach(self, backend: Backend) -> None:
        """Name handles with the handle key of the store behind ``backend`` (the first one attached)."""
        if self._backend is None:
            self._backend = backend

    @property
    def detect(self) -> bool:
        return _config.detect if self._detect is None else self._detect

    @property
    def vault(self) -> Vault | None:
        return self._vault if self._vault is not None else _config.vault

    # -- names ---------------------------------------------------------------------------

    def _store_key(self) -> tuple[bytes, bool] | None:
        if self._backend is None:
            return None
        from ._handlekey import store_key

        return store_key(self._backend)

    def _key_for(self, kind: str) -> bytes:
        """The key that names a handle of ``kind``: the vault's; else the store's, when a
        reader of the store cannot use it to test guesses (the store is encrypted, or
        values of this kind are machine-made random tokens); else this process's."""
        vault = self.vault
        if vault is not None:
            return vault.handle_key()
        found = self._store_key()
        if found is not None and (found[1] or kind in _UNGUESSABLE):
            return found[0]
        return _PROCESS_KEY

    @staticmethod
    def _hmac(key: bytes, value: str | bytes) -> str:
        raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
        return hmac.new(key, raw, hashlib.blake2b).hexdigest()[:16]

    def _tag(self, value: str | bytes, kind: str = "secret") -> str:
        return self._hmac(self._key_for(kind), value)

    def _keep(self, name: str, value: str | bytes) -> None:
        """Remember a redacted value in this process, and in the vault when there is one."""
        with _lock:
            if len(_memory) >= _MEMORY_LIMIT:
                _memory.clear()
            _memory[name] = value
        vault = self.vault
        if vault is not None and name not in self._vaulted:
            if vault.get(name) is None:
                vault.put(name, value)
            self._vaulted.add(name)

    def lookup(self, name: str) -> str | bytes | None:
        """The value a handle name stands for, or None when no resolver knows it."""
        if name.startswith(_envsecrets.PREFIX):  # the variable's value here and now (reserved names)
            return _envsecrets.resolve(name)
        resolver = _resolvers.get(name)
        if resolver is not None:
            value = self._call(name, resolver)
            if value is not None:
                if not isinstance(value, str | bytes):
                    raise SecretResolutionError(
                        f"the resolver of handle $CRED{{{name}}} returned a {type(value).__name__}, "
                        "not a str or bytes",
                        handle=name,
                    )
                if len(value) >= _MIN_REGISTERED and _values.get(name) != value:
                    _learn(name, value)  # redact it from now on
                return value
        value = _values.get(name)
        if value is not None:
            return value
        value = _memory.get(name)
        if value is not None:
            return value
        if _config.resolver is not None:
            value = self._call(name, lambda: _config.resolver(name) if _config.resolver else None)
            if value is not None:
                return value
        vault = self.vault
        value = None if vault is None else vault.get(name)
        return value if value is not None else self._match_tag(name)

    def _match_tag(self, name: str) -> str | bytes | None:
        """The registered value (``register``, ``from_env``, a resolver's) whose tag is
        the tag of handle ``name`` (``<kind>-<tag>``), under any key that may have named it."""
        kind, _, tag = name.rpartition("-")
        if not kind or len(tag) != 16:
            return None
        keys = [_PROCESS_KEY]
        found = self._store_key()
        if found is not None:
            keys.insert(0, found[0])
        vault = self.vault
        if vault is not None:
            keys.insert(0, vault.handle_key())
        candidates: list[str | bytes] = list(_values.values())
        for rname, resolver in list(_resolvers.items()):
            if rname not in _values:
                value = self._call(rname, resolver)
                if isinstance(value, str | bytes):
                    candidates.append(value)
        for value in candidates:
            for key in keys:
                if hmac.compare_digest(self._hmac(key, value), tag):
                    with _lock:
                        _memory[name] = value
                    return value
        return None

    @staticmethod
    def _call(name: str, fn: Callable[[], str | bytes | None]) -> str | bytes | None:
        try:
            return fn()
        except Exception as exc:
            raise SecretResolutionError(
                f"the resolver of handle $CRED{{{name}}} failed ({type(exc).__name__}); "
                "see __cause__",
                handle=name,
            ) from exc

    # -- write side ------------------------------------------------------------------------

    def redact_json(
        self,
        data: bytes,
        tree: Any,
        dump: Callable[[Any], bytes],
        stable: bool = False,
        people: tuple[str, ...] = (),
    ) -> bytes:
        """``data`` (the JSON of ``tree``) with secrets replaced; ``data`` itself when none can be there.

        ``stable``: handles are ``$CRED{}`` (a digest's form: the same in every process,
        for any secret). ``people``: top-level keys of ``tree`` whose text is for people
        (recorded errors, metadata), where the high-entropy rule applies too.
        """
        if not self.enabled:
            return data
        ckey: tuple[Any, ...] | None = None
        if len(data) >= _CACHE_MIN:
            ckey = (len(data), data[:64], data[-64:], stable, people, _generation[0])
            hit = self._scanned.get(ckey)
            if hit is not None and hit[0] == data:
                return hit[1]
        out = data
        loud = self._people_hit(tree, people, dump) if people else ()
        kinds = self._scan(data)
        if loud or kinds is not None:
            pair = self.detect and _has_access_key_id(data)
            out = dump(self._walk(tree, _DIGEST if stable else _TAG, 0, pair, False, loud, kinds or _NO_KINDS))
        if ckey is not None:
            if self._scanned_bytes + 2 * len(data) > _CACHE_BYTES:
                self._scanned.clear()
                self._scanned_bytes = 0
            self._scanned[ckey] = (data, out)
            self._scanned_bytes += len(data) + (len(out) if out is not data else 0)
        return out

    def _people_hit(self, tree: Any, keys: tuple[str, ...], dump: Callable[[Any], bytes]) -> tuple[str, ...]:
        """The keys of ``tree`` among ``keys`` whose text has a random-looking token."""
        if type(tree) is not dict or not self.detect:
            return ()
        return tuple(k for k in keys if k in tree and any(random_spans(t) for t in _texts(tree[k])))

    def may_hold_secret(self, data: bytes) -> bool:
        """False only when redaction would leave these JSON bytes as they are."""
        return self.enabled and self._maybe(data)

    def _maybe(self, data: bytes) -> bool:
        """False only when redaction would leave JSON ``data`` as it is (the per-step test)."""
        # A one-byte search is a memchr: gate the longer ones on a rare byte. find(), not
        # `in`: bytes.__contains__ first tries its argument as an int and builds (then
        # drops) a TypeError each time, which costs more than the search.
        _env_sync()
        find = data.find
        if find(b"$") >= 0 and find(b"$CRED{") >= 0:
            return True
        detect = _config.detect if self._detect is None else self._detect  # self.detect, without the call
        if detect:
            for gate, rarer, form in _search_hot:
                if find(gate) >= 0 and find(rarer) >= 0 and find(form) >= 0:
                    return True
        else:
            for form, _, _ in _search:
                if find(form) >= 0:
                    return True
        if detect:
            if _candidates(data):
                return True
            extra = _config.detectors[len(BUILTIN) :]
            if extra:
                return _extra_match(data, extra)
        return False

    def _scan(self, data: bytes) -> AbstractSet[str] | None:
        """None when no secret can be in JSON ``data``; else the detectors worth running
        (the built-in ones the first pass found candidates for, and every extra one)."""
        _env_sync()
        find = data.find
        found = find(b"$") >= 0 and find(b"$CRED{") >= 0
        if self.detect:
            found = found or any(find(g) >= 0 and find(r) >= 0 and find(f) >= 0 for g, r, f in _search_hot)
        else:
            found = found or any(find(form) >= 0 for form, _, _ in _search)
        if not self.detect:
            return _NO_KINDS if found else None
        kinds = _candidates(data)  # once: the walk runs what it names
        extra = _config.detectors[len(BUILTIN) :]
        if extra and (found or kinds or _extra_match(data, extra)):
            kinds = kinds | {d.kind for d in extra}
        return kinds if (found or kinds) else None

    def _walk(
        self, node: Any, mode: str, depth: int, pair: bool, people: bool, loud: tuple[str, ...] = (), kinds: AbstractSet[str] | None = None
    ) -> Any:
        """``node`` redacted; ``loud``: keys of this dict whose values are text for people;
        ``kinds``: the detectors to run (None: all)."""
        t = type(node)
        if t is str:
            return self.redact_text(node, mode=mode, pair=pair, people=people, kinds=kinds)
        if t is list:
            return [self._walk(v, mode, depth + 1, pair, people, (), kinds) for v in node]
        if t is dict:
            if mode == _DIGEST and node.get("__pk__") == "sec":
                return {**node, "v": ""}  # a Secret's handle name: per-process for an unnamed one
            out: dict[str, Any] = {}
            scalar = "__pk__" in node  # a typed value: its "v" string encodes bytes, a number, a date...
            for k, v in node.items():
                nk = self.redact_text(k, mode=mode, pair=pair, people=people, kinds=kinds)
                if scalar and k == "v" and type(v) is str:  # not text: only the pattern detectors, as ever
                    out[nk] = self.redact_text(v, mode=mode, kinds=kinds)
                elif type(v) is str and self.detect and _AWS_KEY_NAME.search(k) and _AWS_SECRET.fullmatch(v):
                    out[nk] = self._handle("aws_secret_key", v, mode)
                else:
                    out[nk] = self._walk(v, mode, depth + 1, pair, people or k in loud, (), kinds)
            return out
        return node

    def _handle(self, kind: str, value: str, mode: str) -> str:
        if mode == _KIND:
            return f"$CRED{{{kind}}}"
        if mode == _DIGEST:
            return "$CRED{}"
        name = f"{kind}-{self._tag(value, kind)}"
        self._keep(name, value)
        return f"$CRED{{{name}}}"

    def redact_text(
        self,
        text: str,
        *,
        stable: bool = False,
        escape: bool = True,
        mode: str | None = None,
        pair: bool = False,
        people: bool = False,
        kinds: AbstractSet[str] | None = None,
    ) -> str:
        """``text`` with handles escaped, registered values and detected secrets replaced.

        ``stable``: handles name only their kind (``$CRED{openai}``: error messages).
        ``pair``: the record holds an AWS access key id, so a bare 40-character
        AWS-secret-looking value is one. ``people``: text for people, where the
        high-entropy rule applies too. ``kinds``: run only these detectors (the ones
        the first pass over the record found candidates for); None: all.
        """
        if mode is None:
            mode = _KIND if stable else _TAG
        if escape and "$CRED{" in text:
            text = _HANDLE_OR_OPEN.sub(_escape, text)
            if mode == _DIGEST:  # a handle read back unresolved stands for its value: any secret
                text = _HANDLE_RE.sub(_digest_handle, text)
        for _, value, name in _search:
            if isinstance(value, str) and value in text:
                text = text.replace(value, "$CRED{}" if mode == _DIGEST else f"$CRED{{{name}}}")
        if not self.detect:
            return text
        for det in _config.detectors:
            if kinds is not None and det.kind not in kinds:
                continue
            found = matches(det, text)
            if found:
                text = self._replace(text, found, det.kind, mode)
        if pair:
            found = [m for m in _AWS_SECRET_BARE.finditer(text) if _mixed(m[0])]
            if found:
                text = self._replace(text, found, "aws_secret_key", mode)
        if people:
            spans = random_spans(text)
            if spans:
                parts: list[str] = []
                last = 0
                for start, end in spans:
                    parts += (text[last:start], self._handle("high_entropy", text[start:end], mode))
                    last = end
                parts.append(text[last:])
                text = "".join(parts)
        return text

    def _replace(self, text: str, found: list[re.Match[str]], kind: str, mode: str) -> str:
        parts: list[str] = []
        last = 0
        for m in found:
            if "s" in m.re.groupindex and m.group("s") is not None:
                start, end = m.span("s")
            else:
                start, end = m.span()
            parts += (text[last:start], self._handle(kind, text[start:end], mode))
            last = end
        parts.append(text[last:])
        return "".join(parts)

    # -- read side ---------------------------------------------------------------------------

    def reveal_text(self, text: str) -> str:
        """A stored text with its handles resolved where a resolver knows them.

        A handle nothing knows stays as its text, remembered as read back unresolved
        (``_loaded``): loading never needs a value (a resume, a replayed step, an
        inspection). Such a handle is resolved, or refused, where a value enters a live
        call (:func:`live`: a step's arguments, an adapter's tool and model calls),
        never handed to one as text; written back, it stays the same handle.
        """

        def sub(m: re.Match[str]) -> str:
            name = m[1]
            if name == "$":
                return "$CRED{"
            value = self.lookup(name)
            if value is None:
                _hold(m[0])
                return m[0]
            return value if isinstance(value, str) else value.decode("utf-8", "replace")

        return _HANDLE_RE.sub(sub, text)

    # -- Secret types in the serializer --------------------------------------------------------

    def encode_secret(self, value: Any) -> dict[str, Any]:
        """The stored form of a pk.Secret / SecretStr / SecretBytes: its handle name only."""
        if isinstance(value, Secret):
            kind = "pk"
            if value._value is _UNSET:
                return {"__pk__": "sec", "k": kind, "v": value.name}
            raw: Any = value._value
            name = value.name
        else:
            kind = "bytes" if isinstance(value, _bytes_type()) else "str"
            pending = getattr(value, "_pk_handle", "")
            if pending:
                return {"__pk__": "sec", "k": kind, "v": pending}
            raw, name = value.get_secret_value(), None
        if name is None:  # a registered value keeps its name (the same handle in every process)
            name = next((n for n, v in list(_values.items()) if v == raw), None)
        if name is None and isinstance(raw, str):  # a value of the environment: $CRED{env:VAR}
            _env_sync()
            variable = _envsecrets.secrets().get(raw)
            if variable is not None:
                return {"__pk__": "sec", "k": kind, "v": _envsecrets.PREFIX + variable}
        if name is None:
            name = f"secret-{self._tag(raw)}"
            self._keep(name, raw)
        elif _values.get(name) != raw and name not in _resolvers:
            self._keep(name, raw)
        return {"__pk__": "sec", "k": kind, "v": name}

    def decode_secret(self, node: dict[str, Any]) -> Any:
        name, kind = node.get("v"), node.get("k")
        if type(name) is not str or kind not in ("pk", "str", "bytes"):
            raise ValueError("a secret handle needs a name and a kind")
        if kind == "pk":
            return Secret._from_handle(name, self)
        return _lazy_secret_str(kind, name, self)


def _bytes_type() -> type:
    import pydantic

    return pydantic.SecretBytes


_HANDLE_OR_OPEN = re.compile(r"\$CRED\{(?:[^{}\s]{1,200}\})?")
_NO_KINDS: frozenset[str] = frozenset()
_TAG, _KIND, _DIGEST = "tag", "kind", "digest"  # handle forms: named by a keyed tag, by kind, or "$CRED{}"
# An AWS secret access key without a keyword before it: 40 base64 characters, both
# letter cases, in a record that also holds an access key id (see redact_json).
_AWS_SECRET_BARE = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
def _texts(node: Any) -> Iterator[str]:
    """The strings of an encoded tree that are text (keys and values; not the encoded
    scalar of a typed value such as bytes' base64)."""
    stack = [node]
    while stack:
        n = stack.pop()
        if type(n) is str:
            yield n
        elif type(n) is list:
            stack.extend(n)
        elif type(n) is dict:
            scalar = "__pk__" in n
            for k, v in n.items():
                yield k
                if not (scalar and k == "v" and type(v) is str):
                    stack.append(v)


def _mixed(value: str) -> bool:
    return any("a" <= c <= "z" for c in value) and any("A" <= c <= "Z" for c in value)




def _digest_handle(m: re.Match[str]) -> str:
    return m[0] if m[1] == "$" else "$CRED{}"
_AWS_KEY_NAME = re.compile(r"(?i)aws_?secret|secret_?access_?key")
_AWS_SECRET = re.compile(r"[A-Za-z0-9/+]{40}")


def _hold(handle: str) -> None:
    """Remember a handle text read back unresolved: written again as the same handle (not
    escaped), and resolved or refused where it enters a live call (``_live``)."""
    _loaded.add(handle)
    _unresolved_live.add(handle)


def hold_text(text: str) -> str:
    """A stored text for inspection: handles stay handles (never resolved, never needing a
    value), remembered as read back (``_hold``); escaped literal ``$CRED{`` restored."""
    if "$CRED{" not in text:
        return text
    for m in _HANDLE_RE.finditer(text):
        if m[1] != "$":
            _loaded.add(m[0])
    return text.replace("$CRED{$}", "$CRED{")


def escape_tree(tree: Any) -> Any:
    """An encoded tree of live values with its text escaped as the stored form's is (a copy
    where it changes; secrets are not replaced): what a stored-form decoder reads as typed."""
    t = type(tree)
    if t is str:
        return _HANDLE_OR_OPEN.sub(_escape, tree) if "$CRED{" in tree else tree
    if t is list:
        return [escape_tree(v) for v in tree]
    return {escape_tree(k): escape_tree(v) for k, v in tree.items()} if t is dict else tree


def _escape(m: re.Match[str]) -> str:
    # A handle this process read back unresolved is written again as the same handle;
    # any other "$CRED{" in text is escaped, so it can never resolve to a secret on load.
    return m[0] if m[0] in _loaded else "$CRED{$}" + m[0][6:]


_default: Redactor | None = None


def default_redactor() -> Redactor:
    """The redactor of stores opened without ``redact=``/``vault=`` (follows ``configure``)."""
    global _default
    if _default is None:
        _default = Redactor()
    return _default


# Every PersistkitError message is scrubbed from here on; the error tree imports nothing of ours.
install_scrubber(scrub)
