"""``pk.State``: the base class of typed, versioned run state (imports pydantic).

Kept apart from ``_spec`` so that ``import persistkit`` does not import
pydantic; ``persistkit.State`` loads this module on first use.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from .._errors import ConfigurationError
from ..codec import _serde

__all__ = ["State"]


class State(BaseModel):
    """Base class of typed run state. ``class Chat(pk.State, version=2): ...``.

    ``version`` (default 1) is stamped on every checkpoint; loading an older
    version runs the :func:`migration` chain. ``name`` (default: the class's
    qualified name) identifies the schema in storage; set it explicitly to
    rename the class without breaking stored threads.
    """

    model_config = ConfigDict(validate_default=False, revalidate_instances="never")

    __pk_version__: ClassVar[int] = 1
    __pk_schema__: ClassVar[str] = "State"

    def __init_subclass__(cls, *, version: int = 1, name: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ConfigurationError(
                f"class {cls.__qualname__}(pk.State, version={version!r}): version must be an int >= 1"
            )
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigurationError(
                f"class {cls.__qualname__}(pk.State, name={name!r}): name must be a non-empty str"
            )
        cls.__pk_version__ = version
        cls.__pk_schema__ = name or cls.__qualname__

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__()
        # Field types of a state class are trusted: a later process may revive them.
        _serde.register(cls)
        _serde.register_module(cls.__module__)
        for field in cls.model_fields.values():
            _serde.register_type_hints(field.annotation)
