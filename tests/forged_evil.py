"""A module the application below imports, that no stored record may reach: each function
called, and each class constructed, appends its name to the file named by
``$PK_FORGED_MARKER`` (tests/test_forged_names.py asserts that file never appears)."""

from __future__ import annotations

import dataclasses
import os

from pydantic import BaseModel, model_validator


def touch(what: str) -> None:
    with open(os.environ["PK_FORGED_MARKER"], "a") as f:
        f.write(what + "\n")


def evil(*args: object, **kwargs: object) -> None:
    touch("evil")


@dataclasses.dataclass
class Boom:
    x: int = 0

    def __post_init__(self) -> None:
        touch("Boom")


class BoomModel(BaseModel):
    x: int = 0

    @model_validator(mode="after")
    def _ran(self) -> BoomModel:
        touch("BoomModel")
        return self


class BoomError(Exception):
    def __init__(self, *args: object) -> None:
        touch("BoomError")
        super().__init__(*args)
