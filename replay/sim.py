"""The replay model: a trace's requests driven through an engine, one scheduler step at a time.

Model (all choices are deterministic, so two engines see the same operation sequence):

- Requests enter a FIFO waiting queue in trace (timestamp) order: all at once by default, or, with
  ``step_ms`` set, when the simulated clock reaches their timestamp (each scheduler step takes
  ``step_ms`` ms; an idle scheduler jumps to the next arrival).
- Admission: while fewer than ``max_running`` requests run, the head of the queue is ``allocate``d
  (its prompt from :mod:`pagedprefix.replay.synth`). ``OutOfBlocks`` makes it wait at the head (it is
  retried after the next ``free``; nobody overtakes it) and counts it as *delayed*. A prompt needing
  more blocks than the whole pool (``OutOfBlocks.never_fits``) is *rejected*: counted as an all-miss
  request and never waited on. With ``samples > 1`` the admitted request is ``fork``ed into that many
  sequences (parallel sampling), which share the prompt's blocks and copy the partial last block on
  write.
- Decode: every step, each running sequence ``append``s up to ``decode_chunk`` of its own decode tokens
  (unique per sequence, from the reserved range), until ``output_length`` tokens (capped by
  ``max_output``) are generated; then all its sequences are ``free``d.
- A decode step that raises ``OutOfBlocks`` preempts the most recently admitted running request
  (vLLM's recompute preemption: its blocks are freed, it goes back to the front of the queue and later
  restarts from its prompt) and retries; if the failing request is the only one running it can never
  finish and is *aborted* (freed and counted).
- Hit accounting: a request's hit is the ``num_computed_tokens`` of its *first* admission.
  Token hit rate = sum of hits / sum of ``input_length`` over every request (rejected ones included,
  as misses); block hit rate = sum of ``hits // block_size`` / sum of ``ceil(input_length/block_size)``.
  With a pool large enough never to evict, the token hit rate equals the bound of
  :mod:`pagedprefix.replay.bound`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from pagedprefix.spec import (
    MAX_NUM_BLOCKS,
    Allocation,
    AppendResult,
    CacheConfig,
    InvalidConfig,
    KVCacheGroup,
    OutOfBlocks,
    describe_groups,
    hit_alignment,
)
from pagedprefix.spec.cache import check_config, seed_redacted_repr
from pagedprefix.spec.errors import safe_repr

from .bound import prefix_hit_bound
from .divergence import Divergence
from .engines import EngineFactory, ReplayEngine, num_evictions
from .synth import decode_tokens, prompt_tokens
from .trace import TraceRequest, check_requests, finite_number

ProgressFn = Callable[[int, int], None]
MAX_SAMPLES = 1024
"""Most sequences per request (``ReplayConfig.samples``)."""
MAX_KNOB = 2**31 - 1
"""Upper bound of the int knobs ``max_running``, ``decode_chunk`` and ``max_output``."""
ORPHAN_SAMPLE = 256
"""Finished requests between two samples of the orphan count (a hybrid engine's ``orphans()``)."""


def _int_knob(name: str, value: object, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise InvalidConfig(f"{name} must be an int in [{low}, {high}], got {safe_repr(value)}")


@dataclass(frozen=True)
class ReplayConfig:
    """Knobs of one replay.

    Attributes:
        block_size: tokens per block.
        num_blocks: pool size; ``None`` means unbounded (enough that nothing is ever evicted).
        max_running: most requests admitted at once.
        decode_chunk: decode tokens appended per sequence per step.
        max_output: cap on each request's ``output_length`` (``None``: no cap).
        samples: sequences per request (``> 1``: ``fork`` and copy-on-write).
        step_ms: simulated ms per scheduler step; ``None`` ignores arrival times.
        hash_algo, hash_seed, free_order, dedup_on_full: passed to :class:`CacheConfig`.
        groups: hybrid KV-cache groups (SEMANTICS.md section 8) over the one pool, e.g. a
            gpt-oss-like ``(full(16), sliding(128, 16))``; ``None``: the one full-attention group.
            With groups, ``block_size`` must be their gcd (``pagedprefix replay --groups`` sets it).
        retention: ``"replay"`` (default) or ``"dense"``, for the sliding and Mamba groups.
    """

    block_size: int = 16
    num_blocks: int | None = 16000
    max_running: int = 16
    decode_chunk: int = 16
    max_output: int | None = None
    samples: int = 1
    step_ms: float | None = None
    hash_algo: str = "sha256"
    hash_seed: int | None = None
    free_order: str = "unhashed_to_head"
    dedup_on_full: bool = False
    groups: tuple[KVCacheGroup, ...] | None = None
    retention: str = "replay"

    def __repr__(self) -> str:
        return seed_redacted_repr(self)  # hash_seed shows as <set> (docs/SECURITY.md "Secrets")

    def validate(self) -> None:
        """Raise :class:`pagedprefix.spec.InvalidConfig` (a ``ValueError``) for a knob of the wrong
        type or out of range: ints must be exact ints (not ``bool``) — ``max_running`` and
        ``decode_chunk`` in ``[1, 2**31 - 1]``, ``samples`` in ``[1, MAX_SAMPLES]``, ``max_output``
        ``None`` or in ``[0, 2**31 - 1]``, ``num_blocks`` ``None`` or in ``[1, MAX_NUM_BLOCKS]`` —,
        ``step_ms`` ``None`` or a finite number >= 0 (a NaN clock would never reach an arrival), and
        the cache fields must pass :func:`pagedprefix.spec.check_config`."""
        if self.num_blocks is not None:
            _int_knob("num_blocks", self.num_blocks, 1, MAX_NUM_BLOCKS)
        _int_knob("max_running", self.max_running, 1, MAX_KNOB)
        _int_knob("decode_chunk", self.decode_chunk, 1, MAX_KNOB)
        _int_knob("samples", self.samples, 1, MAX_SAMPLES)
        if self.max_output is not None:
            _int_knob("max_output", self.max_output, 0, MAX_KNOB)
        step = self.step_ms
        if step is not None and (not finite_number(step) or step < 0):
            raise InvalidConfig(f"step_ms must be None or a finite number >= 0, got {safe_repr(step)}")
        check_config(self.cache_config(1))

    def output_length(self, req: TraceRequest) -> int:
        if self.max_output is None:
            return req.output_length
        return min(req.output_length, self.max_output)

    def cache_config(self, num_blocks: int) -> CacheConfig:
        return CacheConfig(
            block_size=self.block_size,
            num_blocks=num_blocks,
            hash_algo=self.hash_algo,
            hash_seed=self.hash_seed,
            free_order=self.free_order,
            dedup_on_full=self.dedup_on_full,
            groups=self.groups,
            retention=self.retention,
        )

    def describe_groups(self) -> str:
        """``full(16)+sliding(128,16)``, or ``""`` without hybrid groups."""
        return "" if self.groups is None else describe_groups(self.groups)


def unbounded_blocks(requests: Sequence[TraceRequest], config: ReplayConfig) -> int:
    """A pool size that never evicts: every sequence's final block count, summed (at least 1);
    with hybrid groups, every entry of every group, and for a Mamba group one checkpoint per
    multiple of the hit alignment besides its running state."""
    groups = config.groups
    if groups is None:
        b = config.block_size
        total = sum(
            config.samples * -(-(r.input_length + config.output_length(r)) // b) for r in requests
        )
        return max(total, 1)
    align = hit_alignment(groups)
    total = 0
    for r in requests:
        n = r.input_length + config.output_length(r)
        per = sum(n // align + 2 if g.kind == "mamba" else -(-n // g.block_size) for g in groups)
        total += config.samples * per
    return max(total, 1)


@dataclass(kw_only=True)
class ReplayCounts:
    """What every replay measures, of one engine (:class:`ReplayResult`) or of a cluster of
    replicas (:class:`pagedprefix.cluster.replay.ClusterResult`): the scheduler's request counts,
    prompt and hit tokens (a request's hit is that of its first admission), the pool's peak, the
    steps and the wall time. Rates are properties; :meth:`row` flattens it for CSV and JSON."""

    engine: str
    trace: str
    block_size: int
    num_blocks: int
    max_running: int
    requests: int = 0
    admitted: int = 0
    completed: int = 0
    rejected: int = 0
    aborted: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    evictions: int | None = None
    peak_blocks_in_use: int = 0
    steps: int = 0
    wall_s: float = 0.0
    bound_token_hit_rate: float | None = None
    hits: list[int] = field(default_factory=list)
    """Per request (trace order): hit tokens at first admission, ``-1`` if never admitted."""

    NOT_FLAT: ClassVar[tuple[str, ...]] = ("hits",)
    """The fields :meth:`row` leaves out (per-request lists, nested results)."""

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def row(self) -> dict[str, Any]:
        """Flat fields (none of :attr:`NOT_FLAT`), with the rates, for CSV and JSON."""
        out = {k: v for k, v in asdict(self).items() if k not in self.NOT_FLAT}
        out["token_hit_rate"] = self.token_hit_rate
        return out


@dataclass(kw_only=True)
class ReplayResult(ReplayCounts):
    """What one replay of one engine measured (the counts of :class:`ReplayCounts` and these)."""

    unbounded: bool
    decode_chunk: int
    samples: int
    delayed: int = 0
    prompt_blocks: int = 0
    hit_blocks: int = 0
    decode_tokens: int = 0
    spec_evictions: int | None = None
    cow_copies: int = 0
    operations: int = 0
    mean_wait_ms: float | None = None
    bound_block_hit_rate: float | None = None
    groups: str = ""
    """The hybrid groups (``full(16)+sliding(128,16)``), ``""`` for the one full group."""
    retention: str = ""
    orphans: int | None = None
    """Keyed blocks no lookup can reach because a sibling group's block for the same boundary is
    gone, when the replay ends (engines with ``orphans()``: the hybrid spec and impl)."""
    orphans_peak: int | None = None
    """The most orphans seen at once, sampled every :data:`ORPHAN_SAMPLE` finished requests."""
    divergence: Divergence | None = None

    NOT_FLAT: ClassVar[tuple[str, ...]] = ("hits", "divergence")

    @property
    def block_hit_rate(self) -> float:
        return self.hit_blocks / self.prompt_blocks if self.prompt_blocks else 0.0

    def row(self) -> dict[str, Any]:
        out = super().row()
        out["block_hit_rate"] = self.block_hit_rate
        out["diverged"] = self.divergence is not None
        return out


class Executor:
    """Runs the replay's operations on one engine and tracks peak usage. The lockstep executor
    (:mod:`pagedprefix.replay.lockstep`) subclasses it to run the spec alongside."""

    def __init__(self, engine: ReplayEngine, config: CacheConfig) -> None:
        self.engine = engine
        self.num_blocks = config.num_blocks
        self.operations = 0
        self.peak_in_use = 0

    def _after(self) -> None:
        self.operations += 1
        in_use = self.num_blocks - self.engine.num_free_blocks()
        if in_use > self.peak_in_use:
            self.peak_in_use = in_use

    def allocate(self, rid: int, req: TraceRequest, tokens: list[int]) -> Allocation:
        try:
            return self.engine.allocate(rid, tokens)
        finally:
            self._after()

    def append(self, rid: int, start: int, tokens: list[int]) -> AppendResult:
        try:
            return self.engine.append(rid, tokens)
        finally:
            self._after()

    def fork(self, parent: int, child: int) -> None:
        self.engine.fork(parent, child)
        self._after()

    def free(self, rid: int) -> None:
        self.engine.free(rid)
        self._after()

    def evictions(self) -> int | None:
        return num_evictions(self.engine)

    def finish(self, result: ReplayResult) -> None:
        """Add what this executor learned to ``result`` when the replay ends (nothing here)."""


ExecutorFactory = Callable[[ReplayEngine, CacheConfig], Executor]


@dataclass
class _Run:
    index: int
    decoded: int = 0
    alive: bool = True


class ReplayStopped(Exception):
    """Raised by an executor to end the replay early (the lockstep executor, at a divergence)."""


def decode_starts(requests: Sequence[TraceRequest], config: ReplayConfig) -> list[int]:
    """Where each request's decode tokens start in the reserved range (prefix sums of
    ``samples * output_length``), so every sequence of every request decodes unique tokens."""
    starts: list[int] = []
    acc = 0
    for r in requests:
        starts.append(acc)
        acc += config.output_length(r) * config.samples
    return starts


class Scheduler:
    """One engine's scheduler of the replay model (module docstring): a FIFO waiting queue, at most
    ``max_running`` admitted requests, one decode step at a time, preemption on ``OutOfBlocks``.

    :func:`run_replay` drives one; the cluster replay (``pagedprefix.cluster``) drives one per
    replica under a shared clock. Requests are named by their index in ``requests`` (the whole
    trace); counters go to ``result`` and ``hits[i]`` is request ``i``'s hit at its first admission
    here (``-1``: never admitted here). ``finished`` counts requests completed, rejected or aborted.
    """

    def __init__(self, ex: Executor, requests: Sequence[TraceRequest], config: ReplayConfig,
                 result: ReplayResult, starts: Sequence[int]) -> None:
        self.ex = ex
        self.reqs = requests
        self.config = config
        self.result = result
        self.starts = starts
        self.outs = [config.output_length(r) for r in requests]
        self.hits = [-1] * len(requests)
        self.delayed = [False] * len(requests)
        self.waits: list[float] = []
        self.waiting: deque[int] = deque()
        self.running: list[_Run] = []
        self.finished = 0
        self._head_tokens: tuple[int, list[int]] | None = None
        self._retry_admission = True
        count = getattr(ex.engine, "orphans", None)  # hybrid engines: the orphans diagnostic
        self._count_orphans: Callable[[], int] | None = count if callable(count) else None
        self._orphan_samples: list[int] = []

    @property
    def busy(self) -> bool:
        """Whether a request waits or runs here."""
        return bool(self.waiting or self.running)

    def enqueue(self, i: int) -> None:
        """Request ``i`` arrives: it joins the tail of the waiting queue."""
        self.waiting.append(i)

    def _rid(self, i: int, s: int) -> int:
        return i * self.config.samples + s

    def _release(self, run: _Run) -> None:
        for s in reversed(range(self.config.samples)):
            self.ex.free(self._rid(run.index, s))
        run.alive = False
        self.running.remove(run)
        self._retry_admission = True

    def _finish(self) -> None:
        self.finished += 1
        if self._count_orphans is not None and self.finished % ORPHAN_SAMPLE == 0:
            self._orphan_samples.append(int(self._count_orphans()))

    def admit(self, clock: float) -> None:
        """Admit from the head of the queue, FIFO, while fewer than ``max_running`` run (``clock``:
        the simulated ms now, for waiting times when arrival times are on)."""
        config, result = self.config, self.result
        while self.waiting and len(self.running) < config.max_running and self._retry_admission:
            i = self.waiting[0]
            req = self.reqs[i]
            if self._head_tokens is None or self._head_tokens[0] != i:
                self._head_tokens = (i, prompt_tokens(req.hash_ids, req.input_length))
            try:
                alloc = self.ex.allocate(self._rid(i, 0), req, self._head_tokens[1])
            except OutOfBlocks as exc:
                if exc.never_fits or not self.running:
                    # Cannot fit even with nothing else running: never wait on it.
                    self.waiting.popleft()
                    self._head_tokens = None
                    if self.hits[i] < 0:
                        result.rejected += 1
                    else:
                        result.aborted += 1
                    self._finish()
                    continue
                self.delayed[i] = True
                self._retry_admission = False
                break
            self.waiting.popleft()
            self._head_tokens = None
            if self.hits[i] < 0:
                self.hits[i] = alloc.num_computed_tokens
                result.admitted += 1
                if config.step_ms is not None:
                    self.waits.append(clock - float(req.timestamp))
            for s in range(1, config.samples):
                self.ex.fork(self._rid(i, 0), self._rid(i, s))
            self.running.append(_Run(i))

    def decode(self) -> None:
        """One decode step: every running sequence appends up to ``decode_chunk`` tokens; finished
        requests are freed; ``OutOfBlocks`` preempts the latest admitted request (or aborts a
        request that runs alone)."""
        for run in list(self.running):
            if run.alive:
                self._decode_one(run)

    def _decode_one(self, run: _Run) -> None:
        config, result = self.config, self.result
        i = run.index
        count = min(config.decode_chunk, self.outs[i] - run.decoded)
        for s in range(config.samples if count > 0 else 0):
            start = self.starts[i] + s * self.outs[i] + run.decoded
            toks = decode_tokens(start, count)
            while run.alive:
                try:
                    res = self.ex.append(self._rid(i, s), start, toks)
                except OutOfBlocks:
                    victim = self.running[-1]
                    if victim is run and len(self.running) == 1:
                        self._release(run)
                        result.aborted += 1
                        self._finish()
                    else:
                        self._release(victim)
                        self.waiting.appendleft(victim.index)
                        self.delayed[victim.index] = True
                        result.preemptions += 1
                    continue
                result.cow_copies += len(res.copies)
                result.decode_tokens += count
                break
            if not run.alive:
                return
        run.decoded += count
        if run.decoded >= self.outs[i]:
            self._release(run)
            result.completed += 1
            self._finish()

    def requeue_running(self) -> list[int]:
        """Forget every running request (its engine is gone: a restart) and put it back at the front
        of the queue in admission order, to be admitted again; returns their indexes. Their hits
        stay those of their first admission."""
        indexes = [run.index for run in self.running]
        for run in self.running:
            run.alive = False
        self.running.clear()
        self.waiting.extendleft(reversed(indexes))
        self._head_tokens = None
        self._retry_admission = True
        return indexes

    def settle(self, with_bound: bool = True) -> None:
        """Fill ``result`` when the replay ends: hits, token and block counts over *every* request
        of ``requests`` (so a replica's share of a cluster is summed by the caller, not here),
        waits, peak usage, evictions and, if asked, the unbounded bound."""
        result, bsz = self.result, self.config.block_size
        self.ex.finish(result)
        result.hits = self.hits
        result.delayed = sum(self.delayed)
        result.operations = self.ex.operations
        result.peak_blocks_in_use = self.ex.peak_in_use
        result.evictions = self.ex.evictions()
        if self._count_orphans is not None:
            result.orphans = int(self._count_orphans())
            result.orphans_peak = max([*self._orphan_samples, result.orphans])
        for r, h in zip(self.reqs, self.hits):
            result.prompt_tokens += r.input_length
            result.prompt_blocks += -(-r.input_length // bsz)
            if h > 0:
                result.hit_tokens += h
                result.hit_blocks += h // bsz
        if self.waits:
            result.mean_wait_ms = sum(self.waits) / len(self.waits)
        if with_bound:
            bound = prefix_hit_bound(self.reqs, bsz)
            result.bound_token_hit_rate = bound.token_hit_rate
            result.bound_block_hit_rate = bound.block_hit_rate


def scheduler_steps(requests: Sequence[TraceRequest], step_ms: float | None, busy: Callable[[], bool],
                    arrive: Callable[[int], None], finished: Callable[[], int],
                    progress: ProgressFn | None = None) -> Iterator[float]:
    """The replay's clock, shared by one scheduler (:func:`run_replay`) and a cluster's replicas:
    yields the simulated ms of each scheduler step, once ``arrive(i)`` has been called for every
    request ``i`` that has arrived by then, until every request has arrived and none is ``busy``.

    Without ``step_ms`` every request arrives before the first step (the clock stays 0); with it,
    requests arrive at their timestamps, each step advances the clock by ``step_ms`` and an idle
    scheduler jumps to the next arrival. ``progress(finished(), n)`` is called every 64 finished
    requests; the caller runs the step's admissions and decodes."""
    n = len(requests)
    next_arrival, clock, reported = 0, 0.0, 0
    while next_arrival < n or busy():
        if step_ms is None:
            for i in range(next_arrival, n):
                arrive(i)
            next_arrival = n
        else:
            if not busy() and next_arrival < n:
                clock = max(clock, float(requests[next_arrival].timestamp))
            while next_arrival < n and requests[next_arrival].timestamp <= clock:
                arrive(next_arrival)
                next_arrival += 1
        yield clock
        if step_ms is not None:
            clock += step_ms
        done = finished()
        if progress is not None and done >= reported + 64:
            reported = done
            progress(done, n)


def run_replay(
    requests: Sequence[TraceRequest],
    config: ReplayConfig,
    factory: EngineFactory,
    *,
    engine_name: str = "",
    trace_name: str = "",
    executor: ExecutorFactory = Executor,
    progress: ProgressFn | None = None,
    with_bound: bool = True,
) -> ReplayResult:
    """Replay ``requests`` (in the order given) through the engine ``factory`` builds.

    ``executor`` runs each operation; :class:`pagedprefix.replay.lockstep.LockstepExecutor` runs
    the spec alongside, and the replay then stops at the first divergence, which is returned in
    ``result.divergence`` (with the operation sequence up to it, see
    :class:`pagedprefix.replay.divergence.Divergence`).

    Raises, before anything runs: :class:`pagedprefix.spec.InvalidConfig` (``config`` is not a
    :class:`ReplayConfig`, or :meth:`ReplayConfig.validate` fails; also from the engine, e.g. a
    pool too large for memory) and :class:`pagedprefix.replay.TraceError` (``requests`` is not a
    list of valid :class:`TraceRequest`). With a valid config it always terminates: every scheduler
    step decodes, admits, rejects or finishes a request, or advances the clock to the next arrival.
    """
    if not isinstance(config, ReplayConfig):
        raise InvalidConfig(f"config must be a ReplayConfig, got {type(config).__name__}")
    config.validate()
    reqs = check_requests(requests)
    n = len(reqs)
    unbounded = config.num_blocks is None
    num_blocks = unbounded_blocks(reqs, config) if config.num_blocks is None else config.num_blocks
    cache_config = config.cache_config(num_blocks)
    engine = factory(cache_config)
    ex = executor(engine, cache_config)
    result = ReplayResult(
        engine=engine_name, trace=trace_name, block_size=config.block_size, num_blocks=num_blocks,
        unbounded=unbounded, max_running=config.max_running, decode_chunk=config.decode_chunk,
        samples=config.samples, requests=n, groups=config.describe_groups(),
        retention=config.retention if config.groups is not None else "",
    )
    sched = Scheduler(ex, reqs, config, result, decode_starts(reqs, config))
    t0 = time.perf_counter()
    try:
        for clock in scheduler_steps(reqs, config.step_ms, lambda: sched.busy, sched.enqueue,
                                     lambda: sched.finished, progress):
            sched.admit(clock)
            sched.decode()
            result.steps += 1
    except ReplayStopped:
        pass
    finally:
        result.wall_s = time.perf_counter() - t0
    sched.settle(with_bound)
    if progress is not None:
        progress(sched.finished, n)
    return result
