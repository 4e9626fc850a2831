"""The generic cell rate algorithm (GCRA) on one stored state, without I/O.

GCRA (ITU-T I.371's virtual scheduling algorithm; the form rate limiters such as
redis-cell and the ``limits`` library's "GCRA" call it) keeps one number per bucket, the
*theoretical arrival time* ``tat``: when the bucket would be empty again had every admitted
call been spaced exactly ``T = period / count`` seconds apart. A call of ``cost`` tokens
fits at ``now`` when ``max(tat, now) + cost * T - tau <= now``, with ``tau = burst * T`` the
tolerance (how far ahead of the even spacing the bucket may run: ``burst`` tokens at once).

Here a call that does not fit *reserves* its place instead of polling: it writes the new
``tat`` at once and sleeps until its start (``tat_new - tau``), so waiters go in the order
their reservations landed, and the count of reservations not yet due is ``(tat - tau - now)
/ T`` — the limit's waiters, read from the same one value. A throttle (``pk.throttle``: a
provider's 429 with its reset time) stores ``until`` beside ``tat`` and bumps an epoch: no
call starts before ``until``, and a waiter whose reservation predates the throttle draws
again when it wakes.

Everything in this module is arithmetic on floats (seconds since the epoch); the plans in
``_limits`` read and compare-and-swap the state in the store's kv.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass

from .._errors import ConfigurationError

__all__ = ["Decision", "LimitSpec", "State", "decide", "parse_rate", "usage"]

_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*$")
#: A wait shorter than this (a microsecond) is float rounding of ``tat - tau``: none.
_EPSILON = 1e-6
#: Fractions of a token below this are float rounding in the usage figures.
_TOKEN_EPSILON = 1e-4
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def parse_rate(rate: object) -> tuple[float, float]:
    """``"500/min"``, ``"50/s"``, ``"10/5s"``, ``"1000/hour"`` → (count, period in seconds)."""
    m = _RATE.match(rate) if isinstance(rate, str) else None
    unit = _UNITS.get(m.group(3)) if m else None
    if m is None or unit is None:
        raise ConfigurationError(
            f"rate={rate!r}: expected a string 'COUNT/PERIOD' such as '500/min', '50/s', '10/5s' or "
            "'1000/hour' (units: s, min, hour, day)"
        )
    count = float(m.group(1))
    period = float(m.group(2) or 1) * unit
    if count <= 0 or period <= 0 or not math.isfinite(count):
        raise ConfigurationError(f"rate={rate!r}: the count and the period must be positive")
    return count, period


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(
            f"limit name {name!r}: expected 1 to 64 characters of letters, digits and _ . : -"
        )
    return name


def check_key(key: object) -> str:
    """A limit's key (a tenant id, a model name): a str or int, "" for the limit's one bucket."""
    if key is None:
        return ""
    if isinstance(key, bool) or not isinstance(key, str | int):
        raise ConfigurationError(
            f"limit key {key!r}: expected a str or an int (a tenant id, a model name)"
        )
    text = str(key)
    if len(text) > 512 or "\x00" in text:
        raise ConfigurationError(f"limit key {text[:40]!r}...: at most 512 characters, no NUL")
    return text


def _positive(what: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(f"{what}={value!r}: expected a positive number")
    return float(value)


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """A declared limit: ``count`` tokens per ``period`` seconds, ``burst`` tokens at once,
    ``tokens_per_call`` drawn by a call that names no ``tokens``, ``timeout`` seconds a call
    waits for capacity by default."""

    name: str
    rate: str
    count: float
    period: float
    burst: float
    tokens_per_call: float
    timeout: float

    @property
    def interval(self) -> float:
        """``T``: seconds per token."""
        return self.period / self.count

    @classmethod
    def build(
        cls, name: str, rate: str, burst: float | None, tokens_per_call: float, timeout: float
    ) -> LimitSpec:
        count, period = parse_rate(rate)
        per_call = _positive("tokens_per_call", tokens_per_call)
        b = per_call if burst is None else burst
        if isinstance(b, bool) or not isinstance(b, int | float) or not math.isfinite(b) or b < 1:
            raise ConfigurationError(
                f"burst={burst!r}: expected a number >= 1 (tokens that may go at once)"
            )
        if b < per_call:
            raise ConfigurationError(
                f"burst={b!r} is below tokens_per_call={tokens_per_call!r}: no call would ever fit; "
                "raise burst to at least tokens_per_call"
            )
        t = _positive("timeout", timeout) if timeout != 0 else 0.0
        return cls(check_name(name), rate, count, period, float(b), per_call, t)

    def dump(self) -> bytes:
        return json.dumps(
            {"r": self.rate, "b": self.burst, "c": self.tokens_per_call, "w": self.timeout},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def load(cls, name: str, raw: bytes) -> LimitSpec:
        d = json.loads(raw)
        count, period = parse_rate(d["r"])
        return cls(name, d["r"], count, period, float(d["b"]), float(d["c"]), float(d["w"]))


@dataclass(frozen=True, slots=True)
class State:
    """One bucket's stored state: ``tat``, the throttle's ``until`` and its ``epoch``."""

    tat: float = 0.0
    until: float = 0.0
    epoch: int = 0

    def dump(self) -> bytes:
        return json.dumps(
            {"t": self.tat, "u": self.until, "e": self.epoch}, separators=(",", ":")
        ).encode()

    @classmethod
    def load(cls, raw: bytes | None) -> State:
        if not raw:
            return cls()
        d = json.loads(raw)
        return cls(float(d["t"]), float(d["u"]), int(d["e"]))

    @classmethod
    def found(cls, raw: bytes | None) -> State:
        """The stored state, or a new bucket's: its epoch is random, so that a bucket deleted
        (``store.limits.delete``) and made again is another epoch than the one a call waiting
        since before the delete reserved in (that call draws again)."""
        return cls.load(raw) if raw else cls(epoch=random.getrandbits(30) + 1)


@dataclass(frozen=True, slots=True)
class Decision:
    """What a draw at ``now`` does: store ``state`` (the reservation) and start after ``wait``
    seconds; or, when ``state is None``, it does not fit within the timeout: retry after ``wait``."""

    state: State | None
    wait: float


def decide(spec: LimitSpec, state: State, now: float, cost: float, timeout: float) -> Decision:
    """The reservation a call of ``cost`` tokens makes at ``now``, waiting at most ``timeout``."""
    if cost > spec.burst:
        raise ConfigurationError(
            f"a draw of {cost:g} tokens from limit {spec.name!r} can never fit: its burst is {spec.burst:g}"
        )
    t = spec.interval
    start = max(now, state.until)
    tat = max(state.tat, start) + cost * t
    begins = max(tat - spec.burst * t, start)
    wait = begins - now
    wait = 0.0 if wait < _EPSILON else wait  # float rounding of tat - tau, not a real wait
    if wait > timeout:
        return Decision(None, wait)
    return Decision(State(tat, state.until, state.epoch), wait)


def throttled(state: State, now: float, retry_after: float) -> State | None:
    """The state after a provider said "not before ``now + retry_after``", or None when an
    earlier throttle already holds that long. Reservations made before it are void (the epoch
    moves: their waiters draw again) and the bucket starts full at ``until``."""
    until = now + retry_after
    if until <= state.until:
        return None
    return State(until, until, state.epoch + 1)


def usage(spec: LimitSpec, state: State, now: float) -> tuple[float, float, float]:
    """(tokens available now, tokens in use, tokens reserved by waiters not yet due).

    In use is read from ``tat`` alone: the tokens drawn within the last burst/rate window
    (``tat - now``, at most the burst). During a throttle nothing is in use (its ``until`` put
    ``tat`` at the reset; the draws since then are reservations, counted as waiting) and none
    is available: ``throttled_until`` says why."""
    t = spec.interval
    tau = spec.burst * t
    if now < state.until:
        available = in_use = 0.0
    else:
        # differences first: seconds since the epoch leave ~2e-7 s of float resolution
        lead = max(state.tat - now, 0.0)
        available = float(min(spec.burst, max(0.0, math.floor((tau - lead) / t + _TOKEN_EPSILON))))
        in_use = float(min(spec.burst, max(0.0, math.ceil(lead / t - _TOKEN_EPSILON))))
    ahead = (
        state.tat - state.until if now < state.until else state.tat - now - tau
    )  # throttled: all wait
    reserved = max(0.0, math.ceil(ahead / t - _TOKEN_EPSILON))
    return available, in_use, reserved
