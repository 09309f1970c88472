"""Lockstep checking against the spec: ``--check-spec`` and :func:`check_trace_slice`.

Every operation the replay issues runs on the engine under test and on a fresh
:class:`pagedprefix.spec.SpecCache` built from the same :class:`CacheConfig`. After each operation the
two must agree on:

- the outcome: the same result, or the same error kind (``OutOfBlocks`` with the same ``never_fits``);
- ``num_computed_tokens`` of every admission;
- block tables and copy-on-write copies: exactly, or, for an engine whose ``capabilities.exact_ids``
  is false, up to one consistent renaming of physical block ids for the whole run;
- ``num_free_blocks()``; ``num_evictions`` when the engine exposes it; and the free_block_queue order
  (``free_blocks()``) when the engine exposes it and promises exact ids.

An engine that has a ``step()`` method (keys published after compute) gets it called after each
operation. The first disagreement stops the replay and becomes a :class:`Divergence`: the index of the
operation, what the spec and the engine did, and the operation sequence up to and including it,
which :meth:`Divergence.save` writes as JSON and :func:`rerun_repro` replays.

Repro JSON format (version 1)::

    {"format": "pagedprefix.replay.repro", "version": 1,
     "config": {CacheConfig fields}, "divergence": {"op_index", "reason", "expected", "actual"},
     "ops": [{"op": "allocate", "rid": 0, "hash_ids": [...], "input_length": 7000},
             {"op": "append", "rid": 0, "decode_start": 0, "count": 16},
             {"op": "fork", "parent": 0, "child": 1}, {"op": "free", "rid": 0}, ...]}

Prompt tokens are ``synth.prompt_tokens(hash_ids, input_length)``, decode tokens
``synth.decode_tokens(decode_start, count)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagedprefix.conformance.protocol.codec import config_from_json, config_to_json
from pagedprefix.conformance.protocol.watchdog import EngineLost, check_budget
from pagedprefix.spec import (
    Allocation,
    AppendResult,
    CacheConfig,
    HybridAllocation,
    HybridAppendResult,
    OutOfBlocks,
    PrefixCacheError,
    create_cache,
)

from .divergence import REPRO_FORMAT, REPRO_VERSION, Divergence
from .engines import EngineFactory, ReplayEngine, num_evictions
from .sim import Executor, ReplayConfig, ReplayResult, ReplayStopped, run_replay
from .synth import decode_tokens, prompt_tokens
from .trace import TraceRequest, load_trace

OpRecord = tuple[Any, ...]


class DivergenceFound(ReplayStopped):
    """Raised inside the replay when the lockstep executor records a divergence."""


class _Renaming:
    """One consistent bijection spec block id -> engine block id, built as ids are first seen."""

    def __init__(self) -> None:
        self.fwd: dict[int, int] = {}
        self.bwd: dict[int, int] = {}

    def same(self, spec_ids: tuple[int, ...], engine_ids: tuple[int, ...]) -> bool:
        if len(spec_ids) != len(engine_ids):
            return False
        for s, e in zip(spec_ids, engine_ids):
            if self.fwd.setdefault(s, e) != e or self.bwd.setdefault(e, s) != s:
                return False
        return True


def _describe(value: object) -> str:
    if isinstance(value, (HybridAllocation, HybridAppendResult)):
        return repr(value)
    if isinstance(value, Allocation):
        return (f"Allocation(num_computed_tokens={value.num_computed_tokens}, "
                f"block_table={list(value.block_table)})")
    if isinstance(value, AppendResult):
        copies = [list(c) for c in value.copies]
        return f"AppendResult(copies={copies}, block_table={list(value.block_table)})"
    if isinstance(value, BaseException):
        return f"{type(value).__name__}({value})"
    return repr(value)


def _config_json(config: CacheConfig) -> dict[str, Any]:
    """The config's JSON form (``conformance.codec``: hybrid fields only when not the default)."""
    return config_to_json(config)


def _op_json(op: OpRecord) -> dict[str, Any]:
    kind = op[0]
    if kind == "allocate":
        req: TraceRequest = op[2]
        return {"op": "allocate", "rid": op[1], "hash_ids": list(req.hash_ids),
                "input_length": req.input_length, "request": req.index, "line": req.line}
    if kind == "append":
        return {"op": "append", "rid": op[1], "decode_start": op[2], "count": op[3]}
    if kind == "fork":
        return {"op": "fork", "parent": op[1], "child": op[2]}
    return {"op": "free", "rid": op[1]}


@dataclass(frozen=True)
class _Mismatch:
    reason: str
    expected: str | None = None
    actual: str | None = None


class LockstepExecutor(Executor):
    """Runs each operation on the engine and on the spec and stops at the first disagreement."""

    def __init__(self, engine: ReplayEngine, config: CacheConfig, *, deep: bool = True) -> None:
        super().__init__(engine, config)
        self.config = config
        self.spec = create_cache(config)  # the hybrid spec for hybrid groups
        caps = getattr(engine, "capabilities", None)
        self.exact = bool(getattr(caps, "exact_ids", True))
        self.renaming = _Renaming()
        self.log: list[OpRecord] = []
        self.divergence: Divergence | None = None
        engine_free_blocks = getattr(engine, "free_blocks", None)
        self.engine_free_blocks: Callable[[], Any] | None = (
            engine_free_blocks if deep and self.exact and callable(engine_free_blocks) else None
        )
        step = getattr(engine, "step", None)
        self.engine_step: Callable[[], Any] | None = step if callable(step) else None

    def finish(self, result: ReplayResult) -> None:
        """Record the divergence (if any) and the spec's eviction count in ``result``."""
        result.divergence = self.divergence
        result.spec_evictions = self.spec.num_evictions

    def _engine_call(self, call: Callable[[], Any]) -> tuple[bool, Any]:
        """``(True, value)``, or ``(False, exception)`` for an engine failure to compare; an engine
        that hung or exited, or the run's spent time budget (``EngineLost``), ends the replay."""
        check_budget("the trace slice")  # in-process engines are not guarded call by call here
        try:
            value = call()
        except EngineLost:
            raise
        except Exception as exc:  # any engine failure is an outcome to compare
            return False, exc
        if self.engine_step is not None:
            try:
                self.engine_step()
            except EngineLost:
                raise
            except Exception as exc:
                return False, exc
        return True, value

    @staticmethod
    def _spec_call(call: Callable[[], Any]) -> tuple[bool, Any]:
        try:
            return True, call()
        except PrefixCacheError as exc:
            return False, exc

    def _same_tables(self, spec: Any, engine: Any) -> bool:
        """Per-group tables: the same ``None`` entries, the same ids (or one renaming)."""
        if len(spec) != len(engine) or any(
            [b is None for b in s] != [b is None for b in e] for s, e in zip(spec, engine)
        ):
            return False
        flat = [b for t in spec for b in t if b is not None]
        return self._same_ids(tuple(flat), tuple(b for t in engine for b in t if b is not None))

    def _same_hybrid(self, expected: Any, actual: Any) -> str | None:
        if type(actual) is not type(expected):
            return f"the engine returned {type(actual).__name__}, not {type(expected).__name__}"
        if isinstance(expected, HybridAllocation):
            want, got = expected.num_computed_tokens, actual.num_computed_tokens
            if want != got:
                return f"num_computed_tokens {got} != spec's {want}"
        if isinstance(expected, HybridAppendResult):
            spec_copies = tuple(x for pair in expected.copies for x in pair)
            if not self._same_ids(spec_copies, tuple(x for pair in actual.copies for x in pair)):
                return "copy-on-write copies differ"
        if not self._same_tables(expected.block_tables, actual.block_tables):
            return "block tables differ"
        if [c[:2] for c in expected.checkpoints] != [c[:2] for c in actual.checkpoints] or not self._same_ids(
            tuple(c[2] for c in expected.checkpoints), tuple(c[2] for c in actual.checkpoints)
        ):
            return "checkpoints differ"
        return None

    def _same_value(self, expected: object, actual: object) -> str | None:
        if isinstance(expected, (HybridAllocation, HybridAppendResult)):
            return self._same_hybrid(expected, actual)
        if isinstance(expected, Allocation):
            if not isinstance(actual, Allocation):
                return "the engine returned no Allocation"
            if expected.num_computed_tokens != actual.num_computed_tokens:
                return (f"num_computed_tokens {actual.num_computed_tokens} != spec's "
                        f"{expected.num_computed_tokens}")
            if not self._same_ids(tuple(expected.block_table), tuple(actual.block_table)):
                return "block tables differ"
            return None
        if isinstance(expected, AppendResult):
            if not isinstance(actual, AppendResult):
                return "the engine returned no AppendResult"
            spec_copies = tuple(x for pair in expected.copies for x in pair)
            engine_copies = tuple(x for pair in actual.copies for x in pair)
            if not self._same_ids(spec_copies, engine_copies):
                return "copy-on-write copies differ"
            if not self._same_ids(tuple(expected.block_table), tuple(actual.block_table)):
                return "block tables differ"
        return None

    def _same_ids(self, spec_ids: tuple[int, ...], engine_ids: tuple[int, ...]) -> bool:
        if self.exact:
            return tuple(spec_ids) == tuple(engine_ids)
        return self.renaming.same(spec_ids, engine_ids)

    def _compare(self, expected: tuple[bool, Any], actual: tuple[bool, Any]) -> _Mismatch | None:
        ok_s, val_s = expected
        ok_e, val_e = actual
        if ok_s != ok_e:
            if ok_s:
                return _Mismatch("the engine failed where the spec succeeded")
            return _Mismatch("the engine succeeded where the spec failed")
        if not ok_s:
            if type(val_s) is not type(val_e) and not (
                isinstance(val_s, OutOfBlocks) and isinstance(val_e, OutOfBlocks)
            ):
                names = f"{type(val_e).__name__} instead of {type(val_s).__name__}"
                return _Mismatch(f"different errors: {names}")
            if isinstance(val_s, OutOfBlocks) and val_s.never_fits != val_e.never_fits:
                return _Mismatch(f"OutOfBlocks.never_fits {val_e.never_fits} != spec's {val_s.never_fits}")
            return None
        reason = self._same_value(val_s, val_e)
        if reason is not None:
            return _Mismatch(reason)
        free_s, free_e = self.spec.num_free_blocks(), self.engine.num_free_blocks()
        if free_s != free_e:
            return _Mismatch(f"num_free_blocks {free_e} != spec's {free_s}",
                             f"num_free_blocks={free_s}", f"num_free_blocks={free_e}")
        ev = num_evictions(self.engine)
        if ev is not None and ev != self.spec.num_evictions:
            return _Mismatch(f"num_evictions {ev} != spec's {self.spec.num_evictions}",
                             f"num_evictions={self.spec.num_evictions}", f"num_evictions={ev}")
        if self.engine_free_blocks is not None:
            queue_e = tuple(self.engine_free_blocks())
            queue_s = self.spec.free_blocks()
            if queue_e != queue_s:
                at = next((i for i, (a, b) in enumerate(zip(queue_s, queue_e)) if a != b),
                          min(len(queue_s), len(queue_e)))
                lo = max(0, at - 2)
                return _Mismatch(
                    "free_block_queue order differs",
                    f"free_block_queue[{lo}:{at + 6}]={list(queue_s[lo:at + 6])} (length {len(queue_s)})",
                    f"free_block_queue[{lo}:{at + 6}]={list(queue_e[lo:at + 6])} (length {len(queue_e)})",
                )
        return None

    def _run(self, op: OpRecord, engine_call: Callable[[], Any], spec_call: Callable[[], Any]) -> Any:
        self.log.append(op)
        actual = self._engine_call(engine_call)
        expected = self._spec_call(spec_call)
        mismatch = self._compare(expected, actual)
        self._after()
        if mismatch is not None:
            self.divergence = Divergence(
                op_index=len(self.log) - 1,
                reason=mismatch.reason,
                expected=mismatch.expected if mismatch.expected is not None else _describe(expected[1]),
                actual=mismatch.actual if mismatch.actual is not None else _describe(actual[1]),
                ops=[_op_json(o) for o in self.log],
                config=_config_json(self.config),
            )
            raise DivergenceFound(mismatch.reason)
        ok, value = actual
        if not ok:
            raise value
        return value

    def allocate(self, rid: int, req: TraceRequest, tokens: list[int]) -> Allocation:
        result: Allocation = self._run(
            ("allocate", rid, req),
            lambda: self.engine.allocate(rid, tokens),
            lambda: self.spec.allocate(rid, tokens),
        )
        return result

    def append(self, rid: int, start: int, tokens: list[int]) -> AppendResult:
        result: AppendResult = self._run(
            ("append", rid, start, len(tokens)),
            lambda: self.engine.append(rid, tokens),
            lambda: self.spec.append(rid, tokens),
        )
        return result

    def fork(self, parent: int, child: int) -> None:
        self._run(("fork", parent, child), lambda: self.engine.fork(parent, child),
                  lambda: self.spec.fork(parent, child))

    def free(self, rid: int) -> None:
        self._run(("free", rid), lambda: self.engine.free(rid), lambda: self.spec.free(rid))


# ----- reproductions ----------------------------------------------------------------------------


def load_repro(path: str | Path) -> tuple[CacheConfig, list[dict[str, Any]]]:
    """The cache config and operations of a saved reproduction."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != REPRO_FORMAT or data.get("version") != REPRO_VERSION:
        raise ValueError(f"{path}: not a {REPRO_FORMAT} version {REPRO_VERSION} file")
    return config_from_json(data["config"]), list(data["ops"])


def run_ops(ops: list[dict[str, Any]], config: CacheConfig, factory: EngineFactory) -> Divergence | None:
    """Run operations (repro format) on a fresh engine and spec in lockstep; the first divergence.

    ``OutOfBlocks`` raised by both alike is part of a normal sequence and is not a divergence.
    """
    ex = LockstepExecutor(factory(config), config)
    try:
        for op in ops:
            kind = op["op"]
            try:
                if kind == "allocate":
                    req = TraceRequest(int(op.get("request", 0)), int(op.get("line", 0)), 0.0,
                                       int(op["input_length"]), 0, tuple(op["hash_ids"]))
                    ex.allocate(op["rid"], req, prompt_tokens(req.hash_ids, req.input_length))
                elif kind == "append":
                    ex.append(op["rid"], op["decode_start"], decode_tokens(op["decode_start"], op["count"]))
                elif kind == "fork":
                    ex.fork(op["parent"], op["child"])
                elif kind == "free":
                    ex.free(op["rid"])
                else:
                    raise ValueError(f"unknown operation {kind!r}")
            except OutOfBlocks:
                continue
    except DivergenceFound:
        pass
    return ex.divergence


def rerun_repro(path: str | Path, factory: EngineFactory) -> Divergence | None:
    """Replay a saved reproduction against ``factory``; ``None`` when it no longer diverges."""
    config, ops = load_repro(path)
    return run_ops(ops, config, factory)


# ----- the bounded slice the conformance suite runs ---------------------------------------------


@dataclass
class SliceResult:
    """Outcome of :func:`check_trace_slice`.

    Attributes:
        passed: no divergence and the slice evicted (so eviction order was exercised).
        divergence: the first divergence, or ``None``.
        replay: the replay's measurements (engine side).
        spec_evictions: evictions the spec performed.
        operations: operations compared.
    """

    passed: bool
    divergence: Divergence | None
    replay: ReplayResult
    spec_evictions: int
    operations: int

    def summary(self) -> str:
        if self.divergence is not None:
            return f"FAIL after {self.operations} operations: {self.divergence}"
        status = "PASS" if self.passed else "FAIL (no eviction: the slice did not exercise eviction)"
        return (
            f"{status}: {self.operations} operations on {self.replay.requests} requests agree with the spec "
            f"({self.spec_evictions} evictions, {self.replay.preemptions} preemptions, "
            f"token hit rate {self.replay.token_hit_rate:.4f})"
        )


SLICE_DEFAULTS = ReplayConfig(block_size=16, num_blocks=4096, max_running=8, decode_chunk=64, max_output=128)


def check_trace_slice(
    factory: EngineFactory,
    *,
    trace: str = "conversation",
    requests: int = 300,
    block_size: int = SLICE_DEFAULTS.block_size,
    num_blocks: int = 4096,
    max_running: int = SLICE_DEFAULTS.max_running,
    decode_chunk: int = SLICE_DEFAULTS.decode_chunk,
    max_output: int | None = SLICE_DEFAULTS.max_output,
    samples: int | None = None,
    repro_path: str | Path | None = None,
) -> SliceResult:
    """Replay the first ``requests`` requests of a trace through ``factory``'s engine in lockstep with
    the spec, in a pool small enough to evict, and report the first divergence.

    The defaults (300 conversation requests, block size 16, 4096 blocks, 8 running, decode capped at
    128 tokens in chunks of 64, two samples per request) make 2,331 operations that evict 195,101
    blocks, preempt twice, reject the 12 largest prompts and copy 276 partial blocks on write; they
    take about 10 s with the optimized engine against the spec (the spec's key hashing dominates).
    ``samples=None`` means 2 when the engine can ``fork`` (no ``capabilities``, or
    ``capabilities.fork`` true) and 1 otherwise. ``factory`` is any
    ``Callable[[CacheConfig], engine]`` (a conformance ``AdapterFactory`` included). When it diverges
    and ``repro_path`` is given, the reproduction JSON is written there (see :func:`rerun_repro`).
    ``passed`` also requires that the slice evicted at least once.
    """
    if samples is None:
        probe = factory(CacheConfig(block_size=block_size, num_blocks=1))
        samples = 2 if bool(getattr(getattr(probe, "capabilities", None), "fork", True)) else 1
    loaded = load_trace(trace, limit=requests)
    config = ReplayConfig(block_size=block_size, num_blocks=num_blocks, max_running=max_running,
                          decode_chunk=decode_chunk, max_output=max_output, samples=samples)
    name = getattr(factory, "__qualname__", repr(factory))
    result = run_replay(loaded.requests, config, factory, engine_name=str(name), trace_name=trace,
                        executor=LockstepExecutor, with_bound=False)
    spec_evictions = result.spec_evictions or 0
    if result.divergence is not None and repro_path is not None:
        result.divergence.save(repro_path)
    passed = result.divergence is None and spec_evictions > 0
    return SliceResult(passed, result.divergence, result, spec_evictions, result.operations)
