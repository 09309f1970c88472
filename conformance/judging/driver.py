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
new_step   (none) — a scheduler step boundary (hybrid engines: recurrent states are published)
=========  ====================================================

An *observation* is a JSON object: ``num_free_blocks``; ``tables`` (``[request_id, block_table]``
for every live request, ints first then strs, each sorted); and, when the adapter declares them,
``ref_cnt`` (one entry per physical block), ``free_blocks`` (the free_block_queue, head first),
``keys`` (``[request_id, [hex key or null per table entry]]``) and, for ``events``, ``cached_keys``
(``[group, hex key, count]``, sorted) and ``events`` (the batches published since the last
observation: observing an events engine *takes* its events; :mod:`.event_check`).

For a config with hybrid KV-cache groups (SEMANTICS.md section 8) the tables are
``group_tables`` instead (``[request_id, [[block or null, ...] per group]]``, from the adapter's
``block_tables``) and ``keys`` holds one list per group. Hybrid results: allocate
``{"num_computed_tokens", "block_tables", "checkpoints": [[group, num_tokens, block], ...]}``,
append ``{"copies", "block_tables", "checkpoints"}``, fork ``{"copies"}``.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from pagedprefix.spec import PrefixCacheError, RequestId
from pagedprefix.spec.cache import request_sort_key

from ..protocol import Capabilities, EngineUnavailable, PrefixCacheAdapter, UnsupportedConfig
from ..protocol.channels import note_request
from ..protocol.codec import Json, error_kind, extra_kinds_of, extras_from_json
from ..protocol.watchdog import EngineLost, candidate_exit, describe_exception, exception_summary, guarded
from .event_check import cached_keys_json, check_events_json, events_json
from .properties import Violation

OPS: tuple[str, ...] = ("allocate", "append", "fork", "free", "lookup", "reset", "new_step")
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
    trace: str = ""
    """The engine's traceback of a crash."""
    skipped: bool = False
    """Not sent (a lookup to an engine that declares none)."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.crash is None

    def describe(self) -> str:
        if self.skipped:
            return "not sent (no lookup declared)"
        if self.crash is not None:
            return f"crash: {self.crash}"
        if self.error is not None:
            return f"{self.error}" + (f" ({self.message})" if self.message else "")
        return json.dumps(self.result, sort_keys=True)


def _int(value: Any, what: str) -> int:
    """``value`` as an int: ints and int-like numbers (``operator.index``), never bools or floats."""
    if isinstance(value, bool):
        raise TypeError(f"{what} is a bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} is {value!r:.80}, not an int") from None


def _ints(value: Any, what: str) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what} is {value!r:.80}, not a sequence of ints")
    return [_int(x, what) for x in value]


def group_tables_json(value: Any, what: str = "block_tables") -> list[list[int | None]]:
    """Per-group tables as JSON: a sequence (one per group) of sequences of ints or ``None``."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what} is {value!r:.80}, not one table per group")
    out: list[list[int | None]] = []
    for table in value:
        if not isinstance(table, (list, tuple)):
            raise TypeError(f"{what} holds {table!r:.80}, not a table")
        out.append([None if b is None else _int(b, what) for b in table])
    return out


def _copies(value: Any) -> list[list[int]]:
    if not isinstance(value, (list, tuple)) or any(len(_ints(c, "copy")) != 2 for c in value):
        raise TypeError(f"copies is {value!r:.80}, not a sequence of (src, dst) pairs")
    return [_ints(pair, "copy") for pair in value]


def _checkpoints(value: Any) -> list[list[int]]:
    if not isinstance(value, (list, tuple)) or any(len(_ints(c, "checkpoint")) != 3 for c in value):
        raise TypeError(f"checkpoints is {value!r:.80}, not a sequence of (group, num_tokens, block)")
    return [_ints(c, "checkpoint") for c in value]


def _run(adapter: PrefixCacheAdapter, step: Step) -> dict[str, Json]:
    op = step["op"]
    if op == "allocate":
        extras = extras_from_json(step.get("extras"))
        note_request(step.get("extras"))
        alloc = adapter.allocate(step["request_id"], step["tokens"], extras)
        computed = _int(alloc.num_computed_tokens, "num_computed_tokens")
        if hasattr(alloc, "block_tables"):
            return {
                "num_computed_tokens": computed,
                "block_tables": group_tables_json(alloc.block_tables),
                "checkpoints": _checkpoints(getattr(alloc, "checkpoints", ())),
            }
        return {"num_computed_tokens": computed, "block_table": _ints(alloc.block_table, "block_table")}
    if op == "append":
        res = adapter.append(step["request_id"], step["tokens"])
        if hasattr(res, "block_tables"):
            return {
                "copies": _copies(res.copies),
                "block_tables": group_tables_json(res.block_tables),
                "checkpoints": _checkpoints(getattr(res, "checkpoints", ())),
            }
        return {"copies": _copies(res.copies), "block_table": _ints(res.block_table, "block_table")}
    if op == "fork":
        forked = adapter.fork(step["parent_id"], step["child_id"])
        copies = getattr(forked, "copies", None)
        return {} if copies is None else {"copies": _copies(copies)}
    if op == "new_step":
        adapter.new_step()  # type: ignore[attr-defined]
        return {}
    if op == "free":
        adapter.free(step["request_id"])
        return {}
    if op == "lookup":
        lookup_extras = extras_from_json(step.get("extras"))
        note_request(step.get("extras"))
        return {
            "num_computed_tokens": _int(
                adapter.lookup(step["tokens"], lookup_extras), "lookup"
            )
        }
    if op == "reset":
        value = adapter.reset_prefix_cache()
        if not isinstance(value, bool):
            raise TypeError(f"reset_prefix_cache returned {value!r}, not a bool")
        return {"reset": value}
    raise ValueError(f"unknown op {op!r}")


def execute(adapter: PrefixCacheAdapter, step: Step) -> Outcome:
    """Run ``step`` on ``adapter``. An exception that is not one of the spec's typed errors, or a
    malformed result, becomes a crash (with its traceback); only
    :class:`~pagedprefix.conformance.protocol.watchdog.EngineLost` (a hang, or the candidate's exit: a
    ``BaseException`` from it becomes ``EngineExited``) escapes."""
    op = str(step.get("op"))
    try:
        with guarded(OP_CALLS.get(op, op)):
            result = _run(adapter, step)
    except EngineLost:
        raise
    except Exception as exc:
        kind = error_kind(exc)
        if kind is None:
            return Outcome(crash=exception_summary(exc), trace=describe_exception(exc))
        return Outcome(error=kind, message=str(exc))
    except BaseException as exc:
        raise _exited(OP_CALLS.get(op, op), exc) from exc
    return Outcome(result=result)


def _exited(call: str, exc: BaseException) -> BaseException:
    """What a ``BaseException`` out of a candidate's ``call`` becomes: :class:`EngineExited` (the
    run ends, a FAIL), or ``exc`` itself when it is the harness's own interrupt."""
    return candidate_exit(call, exc) or exc


OP_CALLS = {"reset": "reset_prefix_cache"}


def _raise_unexpected(what: str, exc: BaseException) -> NoReturn:
    """An ``engine-errors`` violation for an ``Exception`` from the engine; any other
    ``BaseException`` ends the run (``EngineExited``)."""
    if isinstance(exc, Exception):
        raise Violation(
            "engine-errors", f"{what} raised {exception_summary(exc)}", describe_exception(exc)
        ) from None
    raise _exited(what, exc) from exc


def call_engine_raw(what: str, call: Any, *, start: bool = False) -> Any:
    """``call()`` under the in-process limit (``start``: a factory call, under the start limit,
    :func:`~pagedprefix.conformance.protocol.watchdog.guarded`); spec errors, ``UnsupportedConfig`` and
    ``EngineUnavailable`` (the engine cannot be loaded: a user error) pass through, anything else
    (but :class:`EngineLost`) becomes an ``engine-errors`` violation; a ``BaseException``
    that is not an ``Exception`` ends the run (``EngineExited``)."""
    try:
        with guarded(what, start=start):
            return call()
    except (EngineLost, EngineUnavailable, PrefixCacheError, UnsupportedConfig):
        raise
    except BaseException as exc:
        _raise_unexpected(what, exc)


def call_engine(what: str, call: Any) -> Any:
    """``call()`` (an observation or ``step()``) under the in-process limit. A spec error from it
    is an ``accounting`` violation (the engine disagrees about its own state, e.g. a live request
    it calls unknown); any other exception but :class:`EngineLost` an ``engine-errors`` one (a
    ``BaseException`` ends the run as ``EngineExited``)."""
    try:
        with guarded(what):
            return call()
    except EngineLost:
        raise
    except PrefixCacheError as exc:
        raise Violation("accounting", f"{what} raised {type(exc).__name__}: {exc}") from None
    except BaseException as exc:
        _raise_unexpected(what, exc)


def sorted_ids(ids: Iterable[RequestId]) -> list[RequestId]:
    """Request ids in the canonical order: ints first, then strs, each sorted."""
    return sorted(ids, key=request_sort_key)


def observe(
    adapter: PrefixCacheAdapter,
    caps: Capabilities,
    num_blocks: int,
    live_ids: Iterable[RequestId],
    want_keys: bool = False,
    hybrid: bool = False,
) -> Observation:
    """The adapter's observable state (see the module docstring). ``live_ids`` are the requests the
    caller believes live; an adapter that cannot report one of them violates ``accounting``.
    ``hybrid``: the config has hybrid groups (``group_tables`` instead of ``tables``)."""
    batch = getattr(adapter, "observe_batch", None)
    if callable(batch):
        ids, with_keys = sorted_ids(live_ids), want_keys and caps.keys
        got = call_engine(
            "observe", lambda: batch(ids, caps.ref_cnt, caps.free_queue, with_keys, events=caps.events)
        )
        if got is not None:
            if caps.events:
                missing = [f for f in ("cached_keys", "events") if f not in got]
                if missing:  # judging an empty stream against an empty index would pass unjudged
                    raise Violation(
                        "engine-errors",
                        f"the engine declares events but its observation carries no {' or '.join(missing)}",
                    )
                check_events_json(got)
            return _checked_observation(got, num_blocks)
    obs: Observation = {"num_free_blocks": call_engine("num_free_blocks()", adapter.num_free_blocks)}
    keys_of: Callable[[PrefixCacheAdapter, Json], Json]
    if hybrid:
        tables = _group_tables(adapter, live_ids)
        obs["group_tables"] = tables
        keys_of = _group_keys
    else:
        tables = [[rid, _block_table(adapter, rid)] for rid in sorted_ids(live_ids)]
        obs["tables"] = tables
        keys_of = _table_keys
    if caps.ref_cnt:
        obs["ref_cnt"] = [
            call_engine(f"ref_cnt({b})", lambda b=b: adapter.ref_cnt(b)) for b in range(num_blocks)
        ]
    if caps.free_queue:
        obs["free_blocks"] = call_engine("free_blocks()", adapter.free_blocks)
    if want_keys and caps.keys:
        obs["keys"] = [[rid, keys_of(adapter, table)] for rid, table in tables]
    if caps.events:
        obs["cached_keys"] = cached_keys_json(call_engine("cached_keys()", adapter.cached_keys))  # type: ignore[attr-defined]
        obs["events"] = events_json(call_engine("take_events()", adapter.take_events))  # type: ignore[attr-defined]
    return _checked_observation(obs, num_blocks)


def _block_table(adapter: PrefixCacheAdapter, rid: RequestId) -> Json:
    return call_engine(f"block_table({rid!r}) of a live request", lambda: adapter.block_table(rid))


def _group_tables(adapter: PrefixCacheAdapter, live_ids: Iterable[RequestId]) -> list[Json]:
    """The hybrid observation's ``group_tables``: ``[rid, per-group tables]`` from ``block_tables``."""
    block_tables = getattr(adapter, "block_tables")  # noqa: B009 - declared by hybrid adapters
    tables: list[Json] = []
    for rid in sorted_ids(live_ids):
        got = call_engine(f"block_tables({rid!r}) of a live request", lambda r=rid: block_tables(r))
        try:
            tables.append([rid, group_tables_json(got, f"block_tables({rid!r})")])
        except TypeError as exc:
            raise Violation("engine-errors", str(exc)) from None
    return tables


def _block_hash(adapter: PrefixCacheAdapter, b: int) -> Json:
    return call_engine(f"block_hash({b})", lambda: adapter.block_hash(b))


def _hex(h: Json) -> Json:
    return None if h is None else bytes(h).hex()


def _table_keys(adapter: PrefixCacheAdapter, table: Json) -> Json:
    """The key of every block of one table, as hex (every call made before any is read)."""
    hashes = [_block_hash(adapter, b) for b in table]
    return [_hex(h) for h in hashes]


def _group_keys(adapter: PrefixCacheAdapter, per_group: Json) -> Json:
    """The keys of every group's table, as hex (None for an entry a window dropped)."""
    hashes = [[None if b is None else _block_hash(adapter, b) for b in table] for table in per_group]
    return [[_hex(h) for h in t] for t in hashes]


def _checked_observation(obs: Observation, num_blocks: int) -> Observation:
    """``obs`` with every value of the documented type (ints, lists of ints, hex or null keys);
    anything else is an ``engine-errors`` violation."""

    def fail(what: str, value: object) -> None:
        raise Violation("engine-errors", f"{what} returned {value!r:.200}, not {_WANTS[what.split('(')[0]]}")

    free = obs.get("num_free_blocks")
    if not _is_int(free):
        fail("num_free_blocks()", free)
    for rid, table in obs.get("tables", []):
        if not _int_seq(table):
            fail(f"block_table({rid!r})", table)
    for rid, tables in obs.get("group_tables", []):
        try:
            group_tables_json(tables)
        except TypeError:
            fail(f"block_tables({rid!r})", tables)
    if "ref_cnt" in obs:
        refs = obs["ref_cnt"]
        if not _int_seq(refs) or len(refs) != num_blocks:
            fail("ref_cnt()", refs)
    if "free_blocks" in obs and not _int_seq(obs["free_blocks"]):
        fail("free_blocks()", obs["free_blocks"])
    out = dict(obs)
    out["tables"] = [[rid, [int(b) for b in t]] for rid, t in obs.get("tables", [])]
    if "ref_cnt" in obs:
        out["ref_cnt"] = [int(b) for b in obs["ref_cnt"]]
    if "free_blocks" in obs:
        out["free_blocks"] = [int(b) for b in obs["free_blocks"]]
    return out


_WANTS = {
    "num_free_blocks": "an int",
    "block_table": "a sequence of ints",
    "block_tables": "one sequence of ints or null per group",
    "ref_cnt": "an int per block",
    "free_blocks": "a sequence of ints",
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_seq(value: object) -> bool:
    return isinstance(value, (list, tuple)) and all(_is_int(v) for v in value)


def is_live(adapter: PrefixCacheAdapter, request_id: RequestId) -> bool:
    """Whether the adapter reports ``request_id`` as live (``block_table`` does not raise)."""
    try:
        with guarded("block_table"):
            adapter.block_table(request_id)
    except EngineLost:
        raise
    except Exception:
        return False
    except BaseException as exc:
        raise _exited("block_table", exc) from exc
    return True


def step_requirements(step: Step) -> set[str]:
    """Capabilities a step needs: ``fork``, ``reset``, ``extra:KIND``."""
    needs: set[str] = set()
    if step["op"] == "fork":
        needs.add("fork")
    if step["op"] == "reset":
        needs.add("reset")
    if step["op"] == "new_step":
        needs.add("groups")
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
