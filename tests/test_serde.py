"""The value serializer: exact round-trips, the class registry, recorded errors, hostile input."""

from __future__ import annotations

import collections
import dataclasses
import decimal
import enum
import json
import math
import os
import pathlib
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta, timezone
from typing import Annotated, Any, ForwardRef, Literal, NamedTuple, Optional, TypeVar
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, RootModel

from persistkit._errors import (
    ConfigurationError,
    SchemaVersionError,
    SerializationError,
    StepFailedError,
)
from persistkit.codec import _registry, _serde
from persistkit.codec._serde import (
    Serializer,
    class_name,
    register,
    register_module,
    register_type_hints,
)

SER = Serializer()


@pytest.fixture
def registry() -> Iterator[None]:
    """Undo registrations a test makes, so tests do not leak trust into each other."""
    saved = dict(_serde._REGISTRY), set(_registry._MODULES)
    yield
    _serde._REGISTRY.clear()
    _serde._REGISTRY.update(saved[0])
    _registry._MODULES.clear()
    _registry._MODULES.update(saved[1])


# -- types used by the tests ---------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    PAIR = (1, 2)


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mode(enum.StrEnum):
    FAST = "fast"


class Perm(enum.Flag):
    R = 1
    W = 2


class Point(NamedTuple):
    x: int
    y: int = 0


class Item(BaseModel):
    name: str
    tags: tuple[str, ...] = ()
    when: datetime | None = None


class Doc(BaseModel):
    model_config = ConfigDict(frozen=True)
    title: str = Field(alias="Title")
    items: list[Item] = []
    level: Level = Level.LOW
    meta: dict[int, str] = {}


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")
    a: int


class Ints(RootModel[list[int]]):
    pass


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: int
    b: tuple[int, ...] = (1, 2)
    total: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", self.a + sum(self.b))


@dataclasses.dataclass
class Outer:
    doc: Doc
    inner: Frozen
    ids: set[uuid.UUID] = dataclasses.field(default_factory=set)


class Tracked(list[Any]):
    """A list subclass of the kind state trackers use."""


class Tag(str):
    pass


class Boom(Exception):
    pass


class Constructed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NeedsTwo(Exception):
    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}/{b}")


# -- strategies ----------------------------------------------------------------

ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
tzinfos = st.one_of(
    st.none(),
    st.sampled_from(ZONES).map(ZoneInfo),
    st.builds(
        timezone,
        st.timedeltas(min_value=timedelta(hours=-23), max_value=timedelta(hours=23)),
    ),
    st.builds(timezone, st.just(timedelta(hours=5, minutes=30)), st.text(min_size=1, max_size=5)),
)
hashable_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**2500, max_value=2**2600),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(max_size=20),
    st.datetimes(timezones=tzinfos, allow_imaginary=True),
    st.dates(),
    st.times(timezones=tzinfos),
    st.timedeltas(),
    st.uuids(),
    st.decimals(allow_nan=True, allow_infinity=True).filter(lambda d: not d.is_nan()),
    st.sampled_from([*Color, *Level, *Mode, Perm.R | Perm.W]),
    st.builds(pathlib.PurePosixPath, st.text(max_size=10)),
)
scalars = st.one_of(
    hashable_scalars,
    st.floats(),  # nan included
    st.binary(max_size=20).map(bytearray),
    st.decimals(allow_nan=True),
)
values = st.recursive(
    scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.lists(kids, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=8), kids, max_size=4),
        st.dictionaries(hashable_scalars, kids, max_size=3),
        st.frozensets(hashable_scalars, max_size=4),
        st.sets(hashable_scalars, max_size=4),
        st.builds(Point, kids, kids),
    ),
    max_leaves=25,
)


def same(a: Any, b: Any) -> bool:
    """Equal and of identical types all the way down (nan equals nan, -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)
    if isinstance(a, (datetime, time)):
        return a == b and a.fold == b.fold and repr(a.tzinfo) == repr(b.tzinfo)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return (
            list(a) == list(b)
            and all(same(a[k], b[k]) for k in a)
            and all(same(x, y) for x, y in zip(a, b, strict=True))
        )
    if isinstance(a, (set, frozenset)):
        return a == b and SER.dumps(a) == SER.dumps(b)
    return bool(a == b)


def roundtrip(value: Any, ser: Serializer = SER) -> Any:
    data = ser.dumps(value)
    json.loads(data)  # always strict, valid JSON
    back = ser.loads(data)
    assert same(value, back), (value, back)
    assert ser.dumps(back) == data
    return back


# -- round-trips ---------------------------------------------------------------


@given(values)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_property_roundtrip_keeps_values_and_types(value: Any) -> None:
    roundtrip(value)


@given(values)
@settings(max_examples=50)
def test_tree_api_matches_bytes_api(value: Any) -> None:
    tree = SER.encode(value)
    assert json.loads(json.dumps(tree)) == tree
    assert same(SER.decode(json.loads(json.dumps(tree))), value)


@pytest.mark.parametrize(
    "value",
    [
        (1, [2, (3,)]),
        {1, "a"},
        frozenset({(1, 2)}),
        {(1, 2): "tuple key", None: 1, 3.5: 2},
        {"__pk__": "t", "v": [1]},  # a plain dict that merely looks like a tag
        Level.HIGH,
        Mode.FAST,
        Perm.R | Perm.W,
        Color.PAIR,
        Point(1, (2, 3)),
        -0.0,
        float("nan"),
        float("-inf"),
        10**5000,
        -(10**5000),
        decimal.Decimal("-0.000"),
        decimal.Decimal("1.20E+7"),
        decimal.Decimal("-Infinity"),
        decimal.Decimal("sNaN"),
        b"\x00\xff",
        bytearray(b"abc"),
        "lone \ud800 surrogate and ünïcode",
        datetime(2021, 10, 31, 2, 30, fold=1, tzinfo=ZoneInfo("Europe/Berlin")),
        datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=UTC),
        datetime(
            2024, 1, 1, tzinfo=timezone(timedelta(hours=-3, seconds=7, microseconds=9), "Odd")
        ),
        datetime(2024, 1, 1, fold=1),
        time(23, 59, 59, 999999, tzinfo=ZoneInfo("Asia/Kolkata")),
        date(1, 1, 1),
        timedelta(days=-5, microseconds=3),
        uuid.UUID(int=0),
        pathlib.PurePosixPath("/tmp/x"),
        pathlib.PureWindowsPath(r"C:\x"),
        pathlib.Path("rel/p"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_examples_roundtrip_exactly(value: Any) -> None:
    roundtrip(value)


def test_utc_and_zoneinfo_identity_is_preserved() -> None:
    assert SER.loads(SER.dumps(datetime(2024, 1, 1, tzinfo=UTC))).tzinfo is UTC
    back = SER.loads(SER.dumps(datetime(2024, 1, 1, tzinfo=ZoneInfo("Europe/Berlin"))))
    assert back.tzinfo is ZoneInfo("Europe/Berlin")


def test_pydantic_models_nested_frozen_aliased_and_with_extras() -> None:
    doc = Doc(
        Title="t",
        items=[Item(name="a", tags=("x",), when=datetime(2024, 1, 1, tzinfo=ZoneInfo("UTC")))],
        level=Level.HIGH,
        meta={1: "one"},
    )
    back = roundtrip(doc)
    assert back == doc and type(back.items[0].tags) is tuple and type(back.level) is Level
    loose = roundtrip(Loose(a=1, extra_field=(1, 2)))  # type: ignore[call-arg]
    assert loose.model_extra == {"extra_field": (1, 2)}
    assert roundtrip(Ints([1, 2])).root == [1, 2]


def test_dataclasses_nested_frozen_with_defaults_and_non_init_fields() -> None:
    value = Outer(Doc(Title="t"), Frozen(1), {uuid.UUID(int=7)})
    back = roundtrip(value)
    assert back == value and back.inner.total == 4 and type(back.inner.b) is tuple
    # A non-init field keeps its recorded value, not the one __post_init__ would compute.
    tree = SER.encode(Frozen(1))
    tree["v"]["total"] = 99
    assert SER.decode(tree).total == 99


def test_list_and_dict_subclasses_come_back_plain() -> None:
    back = SER.loads(SER.dumps({"t": Tracked([1, 2]), "o": collections.OrderedDict(a=1)}))
    assert type(back["t"]) is list and back["t"] == [1, 2]
    assert type(back["o"]) is dict and back["o"] == {"a": 1}


def test_sets_are_deterministic_whatever_the_insertion_order() -> None:
    words = [f"w{i}" for i in range(50)]
    a, b = set(words), set(reversed(words))
    assert SER.dumps(a) == SER.dumps(b)
    assert SER.dumps(frozenset({(1, "a"), (2, "b")})) == SER.dumps(frozenset({(2, "b"), (1, "a")}))


def test_sets_are_deterministic_across_hash_seeds() -> None:
    code = "from persistkit.codec._serde import Serializer; import sys; sys.stdout.buffer.write(Serializer().dumps({'a','bb','ccc',(1,'x'),frozenset({'y','z'})}))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outs) == 1


def test_output_is_compact_utf8_json() -> None:
    assert SER.dumps({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()


# -- what cannot be encoded ----------------------------------------------------


def test_unknown_object_names_path_type_and_fix() -> None:
    with pytest.raises(SerializationError) as err:
        SER.dumps({"messages": [0, 1, 2, {"when": object()}]}, path="state")
    msg = str(err.value)
    assert err.value.path == 'state["messages"][3]["when"]'
    assert "object" in msg and "pydantic models" in msg
    assert "allow_pickle" not in msg and "register" not in msg  # neither makes an object() storable


def test_path_through_model_and_dataclass_fields() -> None:
    @dataclasses.dataclass
    class Holder:
        items: list[Any]

    class Wrapper(BaseModel):
        model_config = ConfigDict(arbitrary_types_allowed=True)
        doc: Any

    with pytest.raises(SerializationError) as err:
        SER.encode(Wrapper(doc=Holder([1, 2, object()])))
    assert err.value.path == "value.doc.items[2]"


def test_str_subclass_is_refused_rather_than_silently_turned_into_str() -> None:
    with pytest.raises(SerializationError, match=r"subclass of str.*str\(\.\.\.\)"):
        SER.dumps([Tag("x")])
    assert (
        type(Serializer(allow_pickle=True).loads(Serializer(allow_pickle=True).dumps(Tag("x"))))
        is Tag
    )


def test_unsupported_tzinfo_is_refused() -> None:
    class Fixed(timezone.__base__):  # type: ignore[misc,name-defined]
        def utcoffset(self, dt: Any) -> timedelta:
            return timedelta(0)

    with pytest.raises(SerializationError, match="tzinfo"):
        SER.dumps(datetime(2024, 1, 1, tzinfo=Fixed()))


def test_cycles_and_deep_nesting_raise_serialization_error() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(SerializationError, match="cycle"):
        SER.dumps(loop)
    cyc: dict[str, Any] = {}
    cyc["self"] = [cyc]
    with pytest.raises(SerializationError, match="cycle"):
        SER.dumps(cyc)
    deep: Any = 1
    for _ in range(2000):
        deep = [deep]
    with pytest.raises(SerializationError, match="deep"):
        SER.dumps(deep)
    ok: Any = 1
    for _ in range(400):
        ok = [ok]
    assert SER.loads(SER.dumps(ok)) == ok
    shared: Any = [1]
    for _ in range(600):  # a DAG, not a cycle: reported as depth, quickly
        shared = [shared, shared]
    with pytest.raises(SerializationError, match="levels deep"):
        SER.dumps(shared)


def test_pickle_is_off_by_default_and_both_sides_must_enable_it() -> None:
    value = {"d": collections.deque([1, 2])}
    with pytest.raises(SerializationError, match=r"cannot serialize an object of type collections\.deque"):
        SER.dumps(value)
    pickling = Serializer(allow_pickle=True)
    data = pickling.dumps(value)
    assert pickling.loads(data) == value
    with pytest.raises(SerializationError, match="pickled") as err:
        SER.loads(data)
    assert err.value.path == 'value["d"]'


# -- the registry --------------------------------------------------------------


def _fresh_module(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            import dataclasses, enum
            @dataclasses.dataclass
            class Point:
                x: int
                y: int
            class Shade(enum.Enum):
                DARK = 1
            class Oops(Exception):
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)


POINT_TREE = {"__pk__": "dc", "c": "pk_serde_mod:Point", "v": {"x": 1, "y": 2}}


def test_unregistered_class_is_refused_without_importing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, registry: None
) -> None:
    _fresh_module(tmp_path, monkeypatch, "pk_serde_mod")
    with pytest.raises(SerializationError) as err:
        SER.decode({"steps": [POINT_TREE]}, path="result")
    msg = str(err.value)
    assert err.value.path == 'result["steps"][0]'
    assert "pk_serde_mod:Point" in msg and "persistkit.register(pk_serde_mod.Point)" in msg
    assert "annotate the step's return type" in msg
    assert "pk_serde_mod" not in sys.modules


def test_allowlisted_module_is_imported_and_revived(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, registry: None
) -> None:
    _fresh_module(tmp_path, monkeypatch, "pk_serde_mod")
    point = Serializer(allow_modules=["pk_serde_mod"]).decode(POINT_TREE)
    assert (type(point).__module__, point.x, point.y) == ("pk_serde_mod", 1, 2)
    with pytest.raises(SerializationError):  # the instance allowlist is not global
        Serializer(allow_modules=["pk_serde"]).decode(POINT_TREE)
    register_module("pk_serde_mod")
    assert SER.decode(POINT_TREE).y == 2


def test_allowlisted_class_must_be_of_the_tagged_kind(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fresh_module(tmp_path, monkeypatch, "pk_serde_mod2")
    ser = Serializer(allow_modules=["pk_serde_mod2"])
    with pytest.raises(SerializationError, match="not a dataclass"):
        ser.decode({"__pk__": "dc", "c": "pk_serde_mod2:Shade", "v": {}})
    with pytest.raises(SerializationError, match="<locals>"):
        ser.decode({"__pk__": "dc", "c": "pk_serde_mod2:f.<locals>.X", "v": {}})


def test_encoding_registers_the_class_and_explicit_registration_works(registry: None) -> None:
    @dataclasses.dataclass
    class Local:
        n: int

    tree = {"__pk__": "dc", "c": class_name(Local), "v": {"n": 1}}
    with pytest.raises(SerializationError, match="not registered"):
        SER.decode(tree)
    SER.encode(Local(0))
    assert SER.decode(tree) == Local(1)
    _serde._REGISTRY.pop(class_name(Local))
    assert register(Local) is Local
    assert SER.decode(tree) == Local(1)
    with pytest.raises(ConfigurationError):
        register("nope")  # type: ignore[type-var]


def test_register_type_hints_walks_annotations(registry: None) -> None:
    class Leaf(enum.Enum):
        A = "a"

    class Lit(enum.Enum):
        B = 1

    # Real type objects: this module's string annotations cannot see a function's locals.
    Part = dataclasses.make_dataclass("Part", [("leaf", Leaf)])

    class Node(BaseModel):
        parts: dict[str, list[Part]] = {}
        child: Optional[Node] = None  # noqa: UP045 - the old spelling must work too
        kind: Literal[Lit.B] = Lit.B

    Node.model_rebuild(_types_namespace={"Node": Node, "Part": Part, "Lit": Lit})

    class Unrelated(BaseModel):
        x: int

    T = TypeVar("T", bound=Unrelated)
    register_type_hints(Annotated[list[Node] | None, "meta"])
    register_type_hints(tuple[T, ...])
    for cls in (Leaf, Lit, Part, Node, Unrelated):
        assert _serde._REGISTRY.get(class_name(cls)) is cls
    for weird in (
        Any,
        "Missing",
        T,
        int,
        None,
        Literal[1, "a"],
        list[ForwardRef("Nope")],
        42,
        object(),
    ):
        register_type_hints(weird)


# -- recorded exceptions ---------------------------------------------------------


def revive(exc: BaseException, ser: Serializer = SER) -> BaseException:
    tree = json.loads(json.dumps(SER.encode_exception(exc)))
    return ser.decode_exception(tree)


def test_builtin_exceptions_revive_with_args_and_notes() -> None:
    err = ValueError("bad", 3)
    err.add_note("while parsing")
    back = revive(err)
    assert type(back) is ValueError and back.args == ("bad", 3)
    assert back.__notes__ == ["while parsing"]
    assert type(revive(TimeoutError("slow"))) is TimeoutError
    assert revive(KeyError(("a", 1))).args == (("a", 1),)


def test_module_level_custom_exception_revives() -> None:
    # No code of its own runs when it is made: it revives from an imported module
    back = revive(Boom("x"))
    assert type(back) is Boom and str(back) == "x"


def test_an_exception_with_its_own_constructor_revives_only_when_registered(registry: None) -> None:
    # Not registered, its module not allowlisted, and making it would run its __init__:
    # data (class name and message), never a constructor call
    back = revive(Constructed("x"))
    assert type(back) is StepFailedError and back.type_name == "test_serde.Constructed"
    assert back.original_message == "x"
    register(Constructed)
    back = revive(Constructed("x"))
    assert type(back) is Constructed and str(back) == "x"


def test_local_exception_becomes_step_failed() -> None:
    class Local(Exception):
        pass

    back = revive(Local("went wrong"))
    assert isinstance(back, StepFailedError)
    assert back.type_name.endswith("Local") and back.original_message == "went wrong"
    assert "went wrong" in str(back) and "could not be revived" in str(back)


def test_exception_that_cannot_be_rebuilt_becomes_step_failed() -> None:
    back = revive(NeedsTwo(1, 2))
    assert isinstance(back, StepFailedError) and back.original_message == "1/2"


def test_exception_in_unimported_module_is_not_imported(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fresh_module(tmp_path, monkeypatch, "pk_serde_mod3")
    tree = {"__pk__": "ex", "c": "pk_serde_mod3:Oops", "v": {"args": ["x"], "str": "x"}}
    assert isinstance(SER.decode_exception(tree), StepFailedError)
    assert "pk_serde_mod3" not in sys.modules
    assert (
        type(Serializer(allow_modules=["pk_serde_mod3"]).decode_exception(tree)).__name__ == "Oops"
    )


def test_unencodable_exception_args_are_recorded_as_repr() -> None:
    back = revive(ValueError(object, {1, 2}, lambda: 0))
    assert back.args[0] == repr(object) and back.args[1] == {1, 2}
    assert isinstance(back.args[2], str) and "lambda" in back.args[2]


def test_malformed_exception_record_raises() -> None:
    for bad in (None, {}, {"__pk__": "ex", "c": 1, "v": {}}, {"__pk__": "ex", "c": "a:b", "v": []}):
        with pytest.raises(SerializationError):
            SER.decode_exception(bad)


# -- hostile and corrupt input ---------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe",
        b'"\xed\xa0\x80"',
        b"{",
        b"[1,]",
        b"NaN",
        b"1" * 5000,
        b"[" * 100_000 + b"]" * 100_000,
        b'{"__pk__":"zz","v":1}',
        b'{"__pk__":["t"],"v":1}',
        b'{"__pk__":"t","v":"abc"}',
        b'{"__pk__":"t"}',
        b'{"__pk__":"t","v":[],"extra":1}',
        b'{"__pk__":"b","v":"not base64!"}',
        b'{"__pk__":"b","v":7}',
        b'{"__pk__":"s","v":[[1]]}',
        b'{"__pk__":"d","v":[[1]]}',
        b'{"__pk__":"d","v":[[[],1]]}',
        b'{"__pk__":"i","v":"xyz"}',
        b'{"__pk__":"f","v":"1.5"}',
        b'{"__pk__":"dt","v":"yesterday"}',
        b'{"__pk__":"dt","v":["2024-01-01T00:00:00",["z","../../etc/passwd"],0]}',
        b'{"__pk__":"dt","v":["2024-01-01T00:00:00",["o",999999,0],0]}',
        b'{"__pk__":"dt","v":["2024-01-01T00:00:00",null,2]}',
        b'{"__pk__":"td","v":[1e9,0,0]}',
        b'{"__pk__":"td","v":[1000000000,0,0]}',
        b'{"__pk__":"u","v":"nope"}',
        b'{"__pk__":"dec","v":"12abc"}',
        b'{"__pk__":"pa","v":["os",""]}',
        b'{"__pk__":"e","c":"tests.test_serde:Level","v":99}',
        b'{"__pk__":"m","c":"os:system","v":{}}',
        b'{"__pk__":"x","v":"gASVAAAAAAAAAAAu"}',
    ],
)
def test_malformed_bytes_raise_serialization_error(data: bytes) -> None:
    with pytest.raises(SerializationError):
        SER.loads(data)


def test_invalid_model_data_raises_with_path() -> None:
    tree = SER.encode({"doc": Item(name="n")})
    tree["doc"]["v"]["name"] = [1]
    # Well-formed data its class no longer accepts: the class changed shape (issue 18).
    with pytest.raises(SchemaVersionError) as err:
        SER.decode(tree)
    assert str(err.value).startswith('value["doc"].name: the stored Item') and "@pk.migration(Item" in str(err.value)
    assert isinstance(err.value.__cause__, ValueError)


def test_non_json_trees_and_inputs_raise() -> None:
    with pytest.raises(SerializationError):
        SER.decode({"a": (1, 2)})
    with pytest.raises(SerializationError):
        SER.loads("text")  # type: ignore[arg-type]
    assert SER.loads(memoryview(b"[1]")) == [1] and SER.loads(bytearray(b"2")) == 2


def _check_decodes_safely(data: bytes) -> None:
    try:
        value = SER.loads(data)
    except (SerializationError, SchemaVersionError):  # a mutated field name reads as a changed class
        return
    SER.dumps(value)  # whatever decodes is a value persistkit can store again


SAMPLE = SER.dumps(
    {
        "doc": Doc(
            Title="t", items=[Item(name="i", when=datetime(2024, 1, 1, tzinfo=ZoneInfo("UTC")))]
        ),
        "outer": Outer(Doc(Title="u"), Frozen(2)),
        "misc": [(1, 2), {3}, frozenset({4}), {5: 6}, b"7", 10**3000, decimal.Decimal("1.5")],
        "more": [Level.LOW, Point(1), uuid.UUID(int=3), timedelta(1), date(2024, 2, 3)],
        "err": ValueError("v"),
    }
)


@given(st.binary(max_size=200))
@settings(max_examples=300)
def test_fuzz_random_bytes(data: bytes) -> None:
    _check_decodes_safely(data)


@given(st.data())
@settings(max_examples=500)
def test_fuzz_mutated_valid_encodings(data: st.DataObject) -> None:
    buf = bytearray(SAMPLE)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        op = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if op == "flip":
            buf[pos] = data.draw(st.sampled_from(b'{}[]",:0123456789-aefnrstuvx_\\'))
        elif op == "delete":
            del buf[pos : pos + data.draw(st.integers(1, 8))]
        else:
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=4))
    _check_decodes_safely(bytes(buf))


TAGS = [*_serde._DECODERS, "nope"]
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.sampled_from([*TAGS, "2024-01-01", "Europe/Berlin", "o", "z", "AAAA"]),
)
json_trees = st.recursive(
    json_leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.dictionaries(st.sampled_from(["__pk__", "v", "c", "a"]), kids, max_size=3),
        st.fixed_dictionaries(
            {"__pk__": st.sampled_from(TAGS), "v": kids},
            optional={
                "c": st.sampled_from(
                    [class_name(c) for c in (Doc, Item, Frozen, Level, Point, Boom)]
                )
            },
        ),
    ),
    max_leaves=12,
)


@given(json_trees)
@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow])
def test_fuzz_structured_trees(tree: Any) -> None:
    _check_decodes_safely(json.dumps(tree).encode())
