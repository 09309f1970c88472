"""Adversarial Python values for the property tests of every public class (``test_hostile_*.py``).

:func:`hostile` draws what a hostile but fair caller could pass anywhere: ``None``, bools, floats
(NaN, infinities, ``-0.0``), ints far outside every range (``2**64``, ``-1``, ``2**31``, an int with
more digits than ``repr`` converts), strings with lone surrogates, bytes, containers of mixed
types, dicts, sets, numpy arrays and scalars, torch tensors of every dtype and odd shapes, objects
whose ``__eq__``, ``__hash__``, ``__index__``, ``__len__``, ``__iter__``, ``__repr__`` or ``__bool__``
raise, and subclasses of ``int``, ``str``, ``list`` and ``tuple`` whose methods lie or raise.

``HOSTILE_EXAMPLES`` (environment) sets the number of Hypothesis examples per property test: a
few dozen by default (CI); a long run sets it in the thousands. :data:`CALLS` counts the calls each
test made, printed at the end of a run with ``-s``.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "40"))
CALLS: Counter[str] = Counter()


def hostile_settings(steps: int = 30) -> Any:
    """Settings of a hostile property test: ``EXAMPLES`` examples, no deadline."""
    return settings(
        max_examples=EXAMPLES,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


class Boom(Exception):
    """What the hostile objects raise: never a documented error, so a test catches its escape."""


class Evil:
    """Every dunder a validator might call raises."""

    def _boom(self, *args: object, **kwargs: object) -> Any:
        raise Boom("hostile dunder")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _boom  # type: ignore[assignment]
    __hash__ = __index__ = __int__ = __float__ = __len__ = __iter__ = __bool__ = _boom  # type: ignore[assignment]
    __repr__ = __str__ = __getitem__ = __contains__ = _boom  # type: ignore[assignment]


class EvilInt(int):
    """An int whose comparisons, hash, index, repr and arithmetic raise."""

    def _boom(self, *args: object, **kwargs: object) -> Any:
        raise Boom("hostile int")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _boom  # type: ignore[assignment]
    __hash__ = __index__ = __int__ = __repr__ = __add__ = __radd__ = __sub__ = _boom  # type: ignore[assignment]
    __mul__ = __floordiv__ = __mod__ = __bool__ = __format__ = __str__ = _boom  # type: ignore[assignment]


class EvilStr(str):
    """A str whose hash, equality, encoding and repr raise."""

    def _boom(self, *args: object, **kwargs: object) -> Any:
        raise Boom("hostile str")

    __eq__ = __ne__ = __hash__ = __repr__ = __len__ = encode = __format__ = __str__ = _boom  # type: ignore[assignment]


class EvilList(list):  # type: ignore[type-arg]
    """A list whose length, iteration and indexing raise."""

    def _boom(self, *args: object, **kwargs: object) -> Any:
        raise Boom("hostile list")

    __len__ = __iter__ = __getitem__ = __eq__ = __repr__ = __bool__ = _boom  # type: ignore[assignment]


class LyingTuple(tuple):  # type: ignore[type-arg]
    """A tuple that claims a different length and contents than it holds."""

    def __len__(self) -> int:
        return 3

    def __iter__(self) -> Any:
        return iter([1, 2, 3])

    def __getitem__(self, index: Any) -> Any:
        return 1


SURROGATES = ("\ud800", "a\udfff", "\udc80x", "ok\ud83d")
SPECIAL_FLOATS = (math.nan, math.inf, -math.inf, -0.0, 0.0, 1.5, 1e308, -1e-300)
SPECIAL_INTS = (-1, 0, 1, 2**31 - 1, 2**31, 2**32, 2**32 - 1, 2**63, 2**64, -(2**64))


def huge_int() -> int:
    """An int with more digits than ``repr`` converts (Python's 4300-digit limit)."""
    return 10**5000


def _tensors() -> st.SearchStrategy[object]:
    import torch

    dtypes = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
              torch.uint8, torch.bool, torch.complex64)
    shapes = ((), (0,), (1,), (3,), (2, 2), (1, 1, 1), (2, 1, 1, 1), (0, 2, 1, 1), (2, 2, 1, 2), (4, 2))

    @st.composite
    def tensor(draw: st.DrawFn) -> object:
        dtype = draw(st.sampled_from(dtypes))
        shape = draw(st.sampled_from(shapes))
        kind = draw(st.sampled_from(["zeros", "full", "meta", "grad", "strided"]))
        if kind == "meta":
            return torch.empty(shape, dtype=dtype, device="meta")
        t = torch.zeros(shape, dtype=dtype)
        if kind == "full" and t.numel():
            t = torch.full(shape, draw(st.sampled_from([-1, 7, 2**20])), dtype=torch.int64).to(dtype)
        if kind == "grad" and dtype.is_floating_point:
            t = t.requires_grad_(True)
        if kind == "strided" and t.dim() >= 2:
            t = t.transpose(0, 1)
        return t

    return tensor()


def hostile(with_tensors: bool = False) -> st.SearchStrategy[object]:
    """Any adversarial value (module docstring); containers nest them."""
    leaves = st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from(SPECIAL_FLOATS),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(SPECIAL_INTS),
        st.builds(huge_int),
        st.integers(),
        st.sampled_from(SURROGATES),
        st.text(max_size=5),
        st.binary(max_size=5),
        st.builds(Evil),
        st.builds(EvilInt, st.integers(0, 5)),
        st.builds(EvilStr, st.sampled_from(["a", "x", ""])),
        st.builds(lambda: EvilList([1, 2])),
        st.builds(lambda: LyingTuple((5,))),
        st.sampled_from([np.int64(3), np.float32(1.0), np.array([1, 2]), np.array([], dtype=np.int32),
                         np.zeros((2, 2)), np.bool_(True)]),
        st.sampled_from([object(), type, print, Ellipsis, NotImplemented, 1j, range(3), slice(1)]),
        *([_tensors()] if with_tensors else []),
    )
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.lists(inner, max_size=3).map(tuple),
            st.dictionaries(st.text(max_size=2), inner, max_size=2),
            st.frozensets(st.integers(-1, 3), max_size=3),
        ),
        max_leaves=6,
    )


def adversarial_strings() -> st.SearchStrategy[object]:
    """Strings a validator must look into: lone surrogates, empty, NUL, long, non-ASCII, a lying
    ``str`` subclass."""
    return st.one_of(
        st.sampled_from(SURROGATES),
        st.sampled_from(["", "\x00", "é", "x" * 300, "[/red]", " "]),
        st.builds(EvilStr, st.sampled_from(["a", ""])),
        st.text(max_size=3),
    )


def adversarial_numbers() -> st.SearchStrategy[object]:
    """Numbers just outside (or pretending to be inside) an int range."""
    return st.one_of(
        st.sampled_from(SPECIAL_INTS),
        st.sampled_from(SPECIAL_FLOATS),
        st.booleans(),
        st.builds(EvilInt, st.integers(0, 3)),
        st.sampled_from([np.int64(1), np.uint32(2), np.float64(0.0)]),
        st.builds(huge_int),
    )


def near_valid_list(
    valid: st.SearchStrategy[list[Any]], bad: st.SearchStrategy[object]
) -> st.SearchStrategy[Any]:
    """A valid list with one entry replaced by ``bad`` (or the list wrapped in a lying subclass)."""

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        items = list(draw(valid))
        kind = draw(st.sampled_from(["replace", "append", "tuple", "evil"]))
        if kind == "evil":
            return EvilList(items)
        if kind == "tuple":
            return tuple(items)
        if items and kind == "replace":
            items[draw(st.integers(0, len(items) - 1))] = draw(bad)
        else:
            items.append(draw(bad))
        return items

    return build()


def mixed(valid: st.SearchStrategy[Any], with_tensors: bool = False) -> st.SearchStrategy[Any]:
    """Mostly ``valid`` values (so operations succeed and build state), often hostile ones."""
    return st.one_of(valid, valid, hostile(with_tensors))


def report(name: str) -> None:
    """Print how many calls the tests of ``name`` made (seen with ``pytest -s``)."""
    total = sum(v for k, v in CALLS.items() if k.startswith(name))
    print(f"\n[hostile] {name}: {total} calls " + ", ".join(f"{k}={v}" for k, v in sorted(CALLS.items())
                                                      if k.startswith(name)))
