"""Executing one JSON step on an adapter, and observing an adapter's state.

A *step* is a JSON object ``{"op": OP, ...arguments}``:

=========  ====================================================
op         arguments
=========  ====================================================
allocate   ``request_id``, ``tokens``, optional ``extras``
append     ``request_id``, ``tokens``
fork       ``parent_id``, ``child_id``
free       ``request_id``
lookup     ``tokens``, optional ``extras``
reset      (none) — ``reset_prefix_cache``
=========  ====================================================

An *observation* is a JSON object: ``num_free_blocks``; ``tables`` (``[request_id, block_table]``
for every live request, ints first then strs, each sorted); and, when the adapter declares them,
``ref_cnt`` (one entry per physical block), ``free_blocks`` (the free_block_queue, head first) and
``keys`` (``[request_id, [hex key or null per table entry]]``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pagedprefix.spec import RequestId
from pagedprefix.spec.cache import request_sort_key

from .codec import Json, error_kind, extra_kinds_of, extras_from_json
from .properties import Violation
from .protocol import Capabilities, PrefixCacheAdapter

OPS: tuple[str, ...] = ("allocate", "append", "fork", "free", "lookup", "reset")
Step = dict[str, Json]
Observation = dict[str, Json]


@dataclass(frozen=True)
class Outcome:
    """What an operation did: a JSON ``result``, or a spec ``error`` kind, or a ``crash`` (an
    exception that is not one of the spec's typed errors, or a malformed result)."""

    result: dict[str, Json] | None = None
    error: str | None = None
    crash: str | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and self.crash is None

    def describe(self) -> str:
        if self.crash is not None:
            return f"crash: {self.crash}"
        if self.error is not None:
            return f"{self.error}" + (f" ({self.message})" if self.message else "")
        return json.dumps(self.result, sort_keys=True)


def _ints(value: Any, what: str) -> list[int]:
    out = [int(x) for x in value]
    if any(isinstance(x, bool) for x in value):
        raise TypeError(f"{what} holds a bool")
    return out


def _run(adapter: PrefixCacheAdapter, step: Step) -> dict[str, Json]:
    op = step["op"]
    if op == "allocate":
        extras = extras_from_json(step.get("extras"))
        alloc = adapter.allocate(step["request_id"], step["tokens"], extras)
        return {
            "num_computed_tokens": int(alloc.num_computed_tokens),
            "block_table": _ints(alloc.block_table, "block_table"),
        }
    if op == "append":
        res = adapter.append(step["request_id"], step["tokens"])
        return {
            "copies": [_ints(pair, "copy") for pair in res.copies],
            "block_table": _ints(res.block_table, "block_table"),
        }
    if op == "fork":
        adapter.fork(step["parent_id"], step["child_id"])
        return {}
    if op == "free":
        adapter.free(step["request_id"])
        return {}
    if op == "lookup":
        return {
            "num_computed_tokens": int(adapter.lookup(step["tokens"], extras_from_json(step.get("extras"))))
        }
    if op == "reset":
        value = adapter.reset_prefix_cache()
        if not isinstance(value, bool):
            raise TypeError(f"reset_prefix_cache returned {value!r}, not a bool")
        return {"reset": value}
    raise ValueError(f"unknown op {op!r}")


def execute(adapter: PrefixCacheAdapter, step: Step) -> Outcome:
    """Run ``step`` on ``adapter``; never raises (an unexpected exception becomes a crash)."""
    try:
        result = _run(adapter, step)
    except Exception as exc:
        kind = error_kind(exc)
        if kind is None:
            return Outcome(crash=f"{type(exc).__name__}: {exc}")
        return Outcome(error=kind, message=str(exc))
    return Outcome(result=result)


def sorted_ids(ids: Iterable[RequestId]) -> list[RequestId]:
    """Request ids in the canonical order: ints first, then strs, each sorted."""
    return sorted(ids, key=request_sort_key)


def observe(
    adapter: PrefixCacheAdapter,
    caps: Capabilities,
    num_blocks: int,
    live_ids: Iterable[RequestId],
    want_keys: bool = False,
) -> Observation:
    """The adapter's observable state (see the module docstring). ``live_ids`` are the requests the
    caller believes live; an adapter that cannot report one of them violates ``accounting``."""
    obs: Observation = {}
    try:
        obs["num_free_blocks"] = int(adapter.num_free_blocks())
    except Exception as exc:
        raise Violation("accounting", f"num_free_blocks() raised {type(exc).__name__}: {exc}") from None
    tables: list[Json] = []
    for rid in sorted_ids(live_ids):
        try:
            table = _ints(adapter.block_table(rid), "block_table")
        except Exception as exc:
            raise Violation(
                "accounting", f"block_table({rid!r}) of a live request raised {type(exc).__name__}: {exc}"
            ) from None
        tables.append([rid, table])
    obs["tables"] = tables
    if caps.ref_cnt:
        obs["ref_cnt"] = [int(adapter.ref_cnt(b)) for b in range(num_blocks)]
    if caps.free_queue:
        obs["free_blocks"] = _ints(adapter.free_blocks(), "free_blocks")
    if want_keys and caps.keys:
        keys: list[Json] = []
        for rid, table in tables:
            hashes = [adapter.block_hash(b) for b in table]
            keys.append([rid, [None if h is None else bytes(h).hex() for h in hashes]])
        obs["keys"] = keys
    return obs


def is_live(adapter: PrefixCacheAdapter, request_id: RequestId) -> bool:
    """Whether the adapter reports ``request_id`` as live (``block_table`` does not raise)."""
    try:
        adapter.block_table(request_id)
    except Exception:
        return False
    return True


def step_requirements(step: Step) -> set[str]:
    """Capabilities a step needs: ``fork``, ``reset``, ``extra:KIND``."""
    needs: set[str] = set()
    if step["op"] == "fork":
        needs.add("fork")
    if step["op"] == "reset":
        needs.add("reset")
    for kind in extra_kinds_of(step.get("extras")):
        needs.add(f"extra:{kind}")
    return needs


def describe_step(step: Step) -> str:
    """A one-line, Python-like rendering of a step."""
    op = step["op"]
    args: list[str] = []
    for name in ("request_id", "parent_id", "child_id", "tokens", "extras"):
        if name in step and not (name == "extras" and step[name] in (None, {})):
            args.append(json.dumps(step[name], sort_keys=True))
    name = "reset_prefix_cache" if op == "reset" else op
    return f"{name}({', '.join(args)})"
