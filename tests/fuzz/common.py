"""What the decoder fuzz tests share: the example budget, byte mutations and the one property they check.

``LIFTLOG_FUZZ_EXAMPLES=<n>`` runs every property with ``n`` examples (a
soak); unset, each property uses its own small default so the suite stays
fast in CI.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from typing import Any, Final, Protocol, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

__all__ = [
    "BINARY",
    "EXAMPLES",
    "decodes_or_refuses",
    "fuzz_settings",
    "json_mutated",
    "json_values",
    "mutate",
    "mutated",
    "names",
]

T = TypeVar("T")


class Draw(Protocol):
    """What draws an example: a composite strategy's ``draw`` or ``st.data()``'s ``data.draw``."""

    def __call__(self, strategy: st.SearchStrategy[T], label: Any = None, /) -> T: ...


#: Examples per property when LIFTLOG_FUZZ_EXAMPLES is set (a soak); None keeps each test's default.
EXAMPLES: Final = int(os.environ["LIFTLOG_FUZZ_EXAMPLES"]) if os.environ.get("LIFTLOG_FUZZ_EXAMPLES") else None

#: Random input for property 1.
BINARY: Final = st.binary(max_size=2000)

#: Short names, non-ASCII included: stream names, subjects, server ids.
names = st.text(st.characters(codec="utf-8"), max_size=12)

# Values that make length and count fields interesting: zero, -1, the sign bit, the largest values.
_BOUNDARIES: Final = (
    b"\x00\x00\x00\x00",
    b"\xff\xff\xff\xff",
    b"\xff\xff\xff\xfc",  # -4: a record length that does not move the cursor
    b"\x7f\xff\xff\xff",
    b"\x80\x00\x00\x00",
    b"\x00\x00\xff\xff",
    b"\x7f\xff\xff\xff\xff\xff\xff\xff",
    b"\xff\xff",
    b"\x00",
    b"\x80",
)


def fuzz_settings(default: int) -> settings:
    """``default`` examples (or LIFTLOG_FUZZ_EXAMPLES), no deadline: a slow CI machine must not fail a run."""
    return settings(
        max_examples=EXAMPLES or default,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def mutate(draw: Draw, data: bytes) -> bytes:
    """One to three of: flip a byte, truncate, insert bytes, duplicate a slice, overwrite with a boundary value."""
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(("flip", "truncate", "insert", "duplicate", "overwrite")))
        n = len(data)
        if kind == "flip" and n:
            i = draw(st.integers(0, n - 1))
            data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
        elif kind == "truncate" and n:
            data = data[: draw(st.integers(0, n - 1))]
        elif kind == "duplicate" and n:
            start = draw(st.integers(0, n - 1))
            piece = data[start : start + draw(st.integers(1, 64))]
            at = draw(st.integers(0, n))
            data = data[:at] + piece + data[at:]
        elif kind == "overwrite" and n:
            value = draw(st.sampled_from(_BOUNDARIES))
            at = draw(st.integers(0, n - 1))
            data = data[:at] + value + data[at + len(value) :]
        else:  # insert (also what an empty input gets)
            at = draw(st.integers(0, n))
            data = data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:]
    return data


def mutated(
    valid: st.SearchStrategy[bytes], reseal: Callable[[bytes], bytes] | None = None
) -> st.SearchStrategy[bytes]:
    """Valid encodings from ``valid``, mutated; ``reseal`` then fixes up a checksum so the damage gets past it."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        data = mutate(draw, draw(valid))
        return reseal(data) if reseal is not None else data

    return build()


def decodes_or_refuses(
    decode: Callable[[bytes], T],
    data: bytes,
    errors: type[BaseException] | tuple[type[BaseException], ...],
    same: Callable[[T, T], bool] | None = None,
) -> T | None:
    """The property: ``decode(data)`` returns (the same value twice) or raises one of ``errors``.

    Any other exception propagates and fails the test. Returns the value, or None when it was refused.
    A documented ValueError must not be a bare UnicodeDecodeError, which names no field.
    """
    try:
        first = decode(data)
    except errors as exc:
        assert not isinstance(exc, UnicodeDecodeError), f"a bare UnicodeDecodeError: {exc}"
        assert str(exc), f"{type(exc).__name__} without a message"
        return None
    second = decode(data)
    assert same(first, second) if same is not None else first == second, "decoding is not deterministic"
    return first


def json_values(max_leaves: int = 6) -> st.SearchStrategy[Any]:
    """Any JSON value, with the awkward ones: integers no int64 or float holds, infinities, NaN, nesting."""
    leaves = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.sampled_from([10**400, -(10**400), 2**63, -(2**63) - 1])
        | st.floats()
        | st.text(max_size=8)
    )
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
        max_leaves=max_leaves,
    )


#: JSON values that break careless field handling: numbers no int or float holds, NaN, the wrong type.
_AWKWARD: Final[tuple[Any, ...]] = (
    10**400,
    -(10**400),
    float("inf"),
    float("-inf"),
    float("nan"),
    2**63,
    -1,
    1.5,
    True,
    None,
    "",
    "x",
    [],
    {},
    [1, "a"],
    {"": 1},
)


def json_mutated(valid: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Valid JSON encodings with one or two objects or lists somewhere inside changed: a field set to an
    awkward or any JSON value, a field removed, or an item replaced. Byte mutations mostly make JSON that
    does not parse; these reach the field checks behind the parser."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        body = json.loads(draw(valid))
        for _ in range(draw(st.integers(1, 2))):
            containers: list[Any] = []
            stack = [body]
            while stack:
                item = stack.pop()
                if isinstance(item, dict):
                    containers.append(item)
                    stack.extend(item.values())
                elif isinstance(item, list):
                    containers.append(item)
                    stack.extend(item)
            if not containers:
                return json.dumps(draw(json_values())).encode()
            target = draw(st.sampled_from(containers))
            value = copy.deepcopy(draw(st.sampled_from(_AWKWARD) | json_values()))  # never shared, never itself
            if isinstance(target, dict):
                keys = sorted(target)
                key = (
                    draw(st.sampled_from(keys)) if keys and draw(st.integers(0, 3)) != 0 else draw(st.text(max_size=6))
                )
                if key in target and not draw(st.integers(0, 3)):
                    del target[key]
                else:
                    target[key] = value
            elif target:
                target[draw(st.integers(0, len(target) - 1))] = value
            else:
                target.append(value)
        return json.dumps(body).encode()

    return build()
