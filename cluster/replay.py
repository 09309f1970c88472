"""The cluster replay: a trace through ``R`` replicas, routed by what their KV-cache events say.

Model (everything else is the replay's own, :mod:`pagedprefix.replay.sim`):

- ``R`` replicas, each an engine of ``num_blocks`` blocks with its own
  :class:`~pagedprefix.replay.sim.Scheduler` (FIFO queue, ``max_running``, decode steps,
  preemption), all under one clock of ``step_ms`` ms per step (:data:`DEFAULT_STEP_MS` when the
  replay's ``step_ms`` is not set: routing happens at arrival times, so the clock is never off).
- At its arrival a request is routed (:mod:`.router`) and joins that replica's queue. Before each
  decision the router drains the transport (:mod:`.transport`) into its indexer
  (:class:`~pagedprefix.cluster.indexer.ReferenceIndexer` by default, or any
  :class:`~pagedprefix.cluster.indexer.KVIndexer`), resyncs the replicas it asked for from their
  ``cached_keys()`` (the snapshot comes straight from the replica, a call a real router makes over
  the network), and asks it for the request's keys (hashed as the engines hash them). Load comes
  from each replica's blocks in use at that moment (a metric replicas publish beside their events).
- After each step every replica publishes one batch of the events of its operations (numbered from
  0 per engine instance; none when nothing happened, as vLLM publishes one batch per engine step
  with events; with ``heartbeat`` an empty one then, so that a loss never stays unseen).
- Faults: ``drop_events`` loses each batch on the way with that probability (seeded per replica,
  so every transport loses the same batches); ``restarts`` replaces a replica's engine with a new
  one (empty cache, numbering from 0) just before a given arrival; its running requests go back to
  the front of its queue and are admitted again (their hit stays that of the first admission).
- An *oracle* subscriber gets every batch without faults (and is told of restarts): its answers
  are the replicas' real indexes (SEMANTICS.md section 9). A decision is *stale* when the router's
  indexer answers differently for some replica, a *misroute* when the router would have chosen
  another replica from the oracle's answers. With ``oracle_routing`` the router routes on the
  oracle: the cluster's hit rate then is what perfect knowledge gives under the same faults, and the
  difference is the hit rate lost to stale or lost events.

Measures (:class:`ClusterResult`): cluster token hit rate (sum of hits at first admission over
sum of prompt tokens, rejected requests as misses, as the replay's), prefill tokens saved (the hit
tokens), load imbalance (the largest replica's computed prefill tokens over the mean; 1 is even),
requests per replica, batches published and dropped, resyncs, stale decisions and misroutes.
"""

from __future__ import annotations

import inspect
import math
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from pagedprefix.impl import BlockManager
from pagedprefix.replay.bound import prefix_hit_bound
from pagedprefix.replay.engines import EngineFactory
from pagedprefix.replay.sim import (
    Executor,
    ProgressFn,
    ReplayConfig,
    ReplayCounts,
    ReplayResult,
    Scheduler,
    decode_starts,
    scheduler_steps,
    unbounded_blocks,
)
from pagedprefix.replay.synth import prompt_tokens
from pagedprefix.replay.trace import TraceRequest, check_requests
from pagedprefix.spec import CacheConfig, InvalidConfig
from pagedprefix.spec.events import Event, EventBatch, GroupKey
from pagedprefix.spec.keys import SEEDED_BY_DEFAULT

from ._interim_events import EventingEngine
from .conform import IndexerFactory
from .indexer import IndexerConfig, KVIndexer, ReferenceIndexer
from .prefix import full_groups
from .router import DEFAULT_LAMBDA, ROUTERS, ReplicaView, choose
from .transport import TRANSPORTS, Transport, open_transport

DEFAULT_STEP_MS = 200.0
"""Simulated ms per scheduler step when the replay gives none: one step decodes ``decode_chunk``
(16) tokens per sequence, so 200 ms is 12.5 ms per token, a mid-size model on one GPU."""
MAX_REPLICAS = 256


@dataclass(frozen=True)
class ClusterOptions:
    """The cluster replay's own knobs (the rest is :class:`~pagedprefix.replay.ReplayConfig`).

    Attributes:
        replicas: ``R``, 1 to :data:`MAX_REPLICAS`.
        router: one of :data:`~pagedprefix.cluster.router.ROUTERS`.
        lam: ``prefix_aware``'s tokens of cached prefix per block in use (>= 0).
        drop_events: probability in ``[0, 1]`` that a published batch is lost.
        restarts: ``(replica, arrival)`` pairs: replica restarts just before that request arrives.
        transport: ``inprocess`` or ``zmq``.
        fault_seed: seed of the losses.
        heartbeat: a replica publishes an empty batch after every step it has no events, so a lost
            batch is seen within a step even when the replica goes idle (vLLM publishes only
            non-empty batches: off by default).
    """

    replicas: int = 1
    router: str = "round_robin"
    lam: float = DEFAULT_LAMBDA
    drop_events: float = 0.0
    restarts: tuple[tuple[int, int], ...] = ()
    transport: str = "inprocess"
    fault_seed: int = 0
    heartbeat: bool = False

    def validate(self) -> None:
        """Raise :class:`~pagedprefix.spec.InvalidConfig` for a knob out of range."""
        if type(self.replicas) is not int or not 1 <= self.replicas <= MAX_REPLICAS:
            raise InvalidConfig(f"replicas must be an int in [1, {MAX_REPLICAS}], got {self.replicas!r}")
        if self.router not in ROUTERS:
            raise InvalidConfig(f"unknown router {self.router!r}; choose from {', '.join(ROUTERS)}")
        if self.transport not in TRANSPORTS:
            raise InvalidConfig(f"unknown transport {self.transport!r}; choose from {', '.join(TRANSPORTS)}")
        if not (math.isfinite(self.lam) and self.lam >= 0):
            raise InvalidConfig(f"the router's lambda must be a finite number >= 0, got {self.lam!r}")
        if not (math.isfinite(self.drop_events) and 0 <= self.drop_events <= 1):
            raise InvalidConfig(f"drop_events must be a probability in [0, 1], got {self.drop_events!r}")
        for replica, arrival in self.restarts:
            if not 0 <= replica < self.replicas or arrival < 0:
                raise InvalidConfig(f"restart {replica}@{arrival}: the replica must be in "
                                    f"[0, {self.replicas}) and the arrival >= 0")

    @property
    def faulty(self) -> bool:
        return self.drop_events > 0 or bool(self.restarts)

    def restart_text(self) -> str:
        return ",".join(f"{r}@{a}" for r, a in self.restarts)


def normalize_cached_keys(keys: Mapping[Any, int]) -> Counter[GroupKey]:
    """An engine's ``cached_keys()`` as ``(group, key) -> copies``: a bare ``bytes`` key is group 0."""
    first = next(iter(keys), None)
    if isinstance(keys, Counter) and isinstance(first, tuple):
        return keys  # already (group, key) -> copies (spec.events.GroupKey)
    out: Counter[GroupKey] = Counter()
    for k, n in keys.items():
        out[(0, k) if isinstance(k, bytes) else (int(k[0]), bytes(k[1]))] += int(n)
    return out


def emits_events(engine: object) -> bool:
    """Whether the engine has its own event queue (``take_events()`` and ``cached_keys()``)."""
    return callable(getattr(engine, "take_events", None)) and callable(getattr(engine, "cached_keys", None))


def takes_events(factory: object) -> bool:
    """Whether ``factory`` accepts an ``events`` keyword (the built-in engines' ``create``)."""
    try:
        return "events" in inspect.signature(factory).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False


def records_events(engine: object) -> bool:
    """Whether a new engine has a working event queue: :func:`emits_events`, and its first
    ``take_events()`` (nothing has happened yet) does not refuse (``BlockManager`` created
    without ``events=True`` raises ``RuntimeError``)."""
    if not emits_events(engine):
        return False
    try:
        return list(engine.take_events()) == []  # type: ignore[attr-defined]
    except RuntimeError:
        return False


class Replica:
    """One engine instance at a time, its scheduler, and its publisher's numbering."""

    def __init__(self, name: str, factory: EngineFactory, cache_config: CacheConfig,
                 reqs: Sequence[TraceRequest], config: ReplayConfig, starts: Sequence[int]) -> None:
        self.name = name
        self.factory = factory
        self.cache_config = cache_config
        self.engine = self._new_engine()
        result = ReplayResult(engine="", trace="", block_size=config.block_size,
                              num_blocks=cache_config.num_blocks, unbounded=config.num_blocks is None,
                              max_running=config.max_running, decode_chunk=config.decode_chunk,
                              samples=config.samples, requests=len(reqs))
        self.sched = Scheduler(Executor(self.engine, cache_config), reqs, config, result, starts)
        self.next_seq = 0
        self.operations = 0
        self.peak_in_use = 0
        self.evictions: int | None = 0
        self.published = 0
        self.dropped = 0

    def _new_engine(self) -> Any:
        """The replica's engine with its own event queue (``factory(config, events=True)`` where
        the factory takes ``events``, as ``SpecCache.create`` and ``BlockManager.create`` do);
        an engine without one gets the stream derived from its block hashes (``_interim_events``)."""
        if takes_events(self.factory):
            return self.factory(self.cache_config, events=True)  # type: ignore[call-arg]
        engine = self.factory(self.cache_config)
        return engine if records_events(engine) else EventingEngine(engine, self.cache_config)

    def restart(self) -> None:
        """A new engine instance (its state is lost: empty cache, numbering from 0); running requests
        go back to the front of the queue."""
        self._keep_stats()
        self.sched.requeue_running()
        self.engine = self._new_engine()
        self.sched.ex = Executor(self.engine, self.cache_config)
        self.next_seq = 0

    def _keep_stats(self) -> None:
        ex = self.sched.ex
        self.operations += ex.operations
        self.peak_in_use = max(self.peak_in_use, ex.peak_in_use)
        ev = ex.evictions()
        self.evictions = None if ev is None or self.evictions is None else self.evictions + ev

    def finish(self) -> None:
        self._keep_stats()

    def publish(self, heartbeat: bool = False) -> EventBatch | None:
        """The batch of the events since the last one (``None``: nothing happened, unless
        ``heartbeat``: then an empty batch)."""
        events: list[Event] = []
        for item in self.engine.take_events():
            # An engine adapter that numbers batches itself (the vLLM adapter: one per operation)
            # hands batches; the replica publishes one per step, as vLLM's scheduler does.
            events.extend(item.events if isinstance(item, EventBatch) else (item,))
        if not events and not heartbeat:
            return None
        batch = EventBatch(self.next_seq, tuple(events))
        self.next_seq += 1
        self.published += 1
        return batch

    def snapshot(self) -> tuple[int, Counter[GroupKey]]:
        """``(number of the latest batch published, cached_keys())``: the full resync's input."""
        return self.next_seq - 1, normalize_cached_keys(self.engine.cached_keys())

    def view(self, cached: int | None) -> ReplicaView:
        in_use = self.cache_config.num_blocks - self.engine.num_free_blocks()
        return ReplicaView(cached, in_use, len(self.sched.waiting) + len(self.sched.running))


@dataclass(kw_only=True)
class ClusterResult(ReplayCounts):
    """What one cluster replay measured: the replay's counts over all replicas
    (:class:`~pagedprefix.replay.sim.ReplayCounts`) and the cluster's own; :meth:`row` flattens it
    for CSV and JSON."""

    replicas: int
    router: str
    lam: float
    transport: str
    drop_events: float
    restarts: str
    indexer: str
    heartbeat: bool
    step_ms: float
    load_imbalance: float = 1.0
    requests_per_replica: str = ""
    batches_published: int = 0
    batches_dropped: int = 0
    resyncs: int = 0
    stale_decisions: int | None = None
    misroutes: int | None = None
    oracle_token_hit_rate: float | None = None
    routes: list[int] = field(default_factory=list)
    """Per request: the replica it was routed to."""

    NOT_FLAT: ClassVar[tuple[str, ...]] = ("hits", "routes")

    @property
    def prefill_tokens_saved(self) -> int:
        return self.hit_tokens

    @property
    def hit_rate_lost(self) -> float | None:
        """The oracle-routed twin's hit rate minus this one's (only when a fault was injected)."""
        if self.oracle_token_hit_rate is None:
            return None
        return self.oracle_token_hit_rate - self.token_hit_rate

    def row(self) -> dict[str, Any]:
        out = super().row()
        out["prefill_tokens_saved"] = self.prefill_tokens_saved
        out["hit_rate_lost"] = self.hit_rate_lost
        return out


class KeyHasher:
    """The request's block keys, hashed as every replica hashes them (one shared root and seed).

    An engine with its own ``request_keys(tokens) -> list[bytes]`` (the vLLM adapter: vLLM's
    ``Request`` hasher, in the form its events publish) is asked, on an instance of its own built
    by ``factory``; any other gets impl's chain, equal to the spec's by the key vectors. (Before,
    every engine got impl's chain, so a router over vLLM replicas never found a key they had
    published: no prefix hit at all.)"""

    def __init__(self, cache_config: CacheConfig, factory: EngineFactory | None = None) -> None:
        small = replace(cache_config, num_blocks=min(cache_config.num_blocks, 64))  # hashing only
        own = getattr(factory(small), "request_keys", None) if factory is not None else None
        self._own: Callable[[Sequence[int]], list[bytes]] | None = own if callable(own) else None
        self.manager = BlockManager.create(replace(cache_config, num_blocks=1))

    def keys(self, tokens: Sequence[int]) -> list[bytes]:
        if self._own is not None:
            return [bytes(k) for k in self._own(tokens)]
        return self.manager.block_keys(tokens)


def shared_seed(config: ReplayConfig) -> ReplayConfig:
    """``config`` with one hash seed for every replica: a router can only compare keys that all
    replicas compute alike (vLLM needs one ``PYTHONHASHSEED`` across a fleet for the same reason).
    A seeded-by-default hash without a pinned seed gets a secret random one, shared."""
    if config.hash_seed is None and config.hash_algo in SEEDED_BY_DEFAULT:
        return replace(config, hash_seed=secrets.randbits(64))
    return config


class _Cluster:
    """The state of one cluster replay (module docstring); :func:`run_cluster` drives it."""

    def __init__(self, reqs: Sequence[TraceRequest], config: ReplayConfig, options: ClusterOptions,
                 factory: EngineFactory, indexer_factory: IndexerFactory, oracle_routing: bool) -> None:
        self.reqs, self.config, self.options = reqs, config, options
        self.oracle_routing = oracle_routing
        num_blocks = unbounded_blocks(reqs, config) if config.num_blocks is None else config.num_blocks
        self.cache_config = config.cache_config(num_blocks)
        names = [f"r{i}" for i in range(options.replicas)]
        starts = decode_starts(reqs, config)
        self.replicas = [Replica(name, factory, self.cache_config, reqs, config, starts) for name in names]
        indexer_config = IndexerConfig(groups=full_groups(config.block_size), sources=tuple(names))
        self.indexer: KVIndexer = indexer_factory(indexer_config)
        self.oracle = ReferenceIndexer(indexer_config)
        self.losses = {name: random.Random(f"drop/{options.fault_seed}/{name}") for name in names}
        self.pending: set[str] = set()
        self.resyncs = 0
        self.stale = 0
        self.misroutes = 0
        self.routes: list[int] = []
        self.hasher = KeyHasher(self.cache_config, factory) if options.router == "prefix_aware" else None

    def _deliver(self, transport: Transport) -> None:
        """Everything the transport carried so far into the indexer, and the resyncs it asks for.
        Routers that do not use the indexer only drain the transport."""
        arrived = transport.drain()
        if self.hasher is None:
            return
        for source, batch in arrived:
            if self.indexer.events(source, batch):
                self.pending.add(source)
        for replica in self.replicas:
            if replica.name in self.pending:
                seq, keys = replica.snapshot()
                self.indexer.resync(replica.name, seq, keys)
                self.resyncs += 1
        self.pending.clear()

    def route(self, i: int, transport: Transport) -> int:
        self._deliver(transport)
        options, req = self.options, self.reqs[i]
        if self.hasher is None:
            r = choose(options.router, [rep.view(None) for rep in self.replicas], i, options.lam)
        else:
            keys = [self.hasher.keys(prompt_tokens(req.hash_ids, req.input_length))]
            said = self.indexer.query(keys, req.input_length)
            real = self.oracle.query(keys, req.input_length)
            names = [rep.name for rep in self.replicas]
            mine = [rep.view(said.get(rep.name)) for rep in self.replicas]
            truth = [rep.view(real[rep.name]) for rep in self.replicas]
            r_said = choose(options.router, mine, i, options.lam)
            r_real = choose(options.router, truth, i, options.lam)
            self.stale += any(said.get(n) != real[n] for n in names)
            self.misroutes += r_said != r_real
            r = r_real if self.oracle_routing else r_said
        self.routes.append(r)
        return r

    def restart(self, replica: Replica) -> None:
        replica.restart()
        self.oracle.resync(replica.name, -1, {})

    def step(self, clock: float, transport: Transport) -> None:
        for replica in self.replicas:
            replica.sched.admit(clock)
            replica.sched.decode()
            batch = replica.publish(self.options.heartbeat)
            if batch is None:
                continue
            self.oracle.events(replica.name, batch)
            if self.losses[replica.name].random() < self.options.drop_events:
                replica.dropped += 1
            else:
                transport.send(replica.name, batch)


def run_cluster(
    requests: Sequence[TraceRequest],
    config: ReplayConfig,
    options: ClusterOptions,
    factory: EngineFactory,
    *,
    indexer_factory: IndexerFactory | None = None,
    indexer_name: str = "reference",
    engine_name: str = "",
    trace_name: str = "",
    oracle_routing: bool = False,
    progress: ProgressFn | None = None,
) -> ClusterResult:
    """Replay ``requests`` through a cluster (module docstring); ``num_blocks`` is per replica.

    Raises, before anything runs: :class:`~pagedprefix.spec.InvalidConfig` (a bad ``config`` or
    ``options``, or ``dedup_on_full`` with an engine that emits no events of its own),
    :class:`~pagedprefix.replay.TraceError` (bad ``requests``), ``ImportError`` (``zmq`` without
    pyzmq); :class:`~pagedprefix.cluster.transport.TransportError` when ZeroMQ does not deliver.
    """
    config.validate()
    options.validate()
    reqs = check_requests(requests)
    config = shared_seed(config)
    step_ms = DEFAULT_STEP_MS if config.step_ms is None else config.step_ms
    config = replace(config, step_ms=step_ms)
    try:
        cluster = _Cluster(reqs, config, options, factory, indexer_factory or ReferenceIndexer,
                           oracle_routing)
    except ValueError as exc:  # the interim wrapper's refusals
        raise InvalidConfig(str(exc)) from None
    restarts: dict[int, list[int]] = {}
    for replica_index, arrival in options.restarts:
        restarts.setdefault(arrival, []).append(replica_index)
    result = ClusterResult(
        engine=engine_name, trace=trace_name, replicas=options.replicas, router=options.router,
        lam=options.lam, transport=options.transport, drop_events=options.drop_events,
        restarts=options.restart_text(), heartbeat=options.heartbeat,
        indexer="oracle" if oracle_routing else indexer_name, block_size=config.block_size,
        num_blocks=cluster.cache_config.num_blocks, max_running=config.max_running, step_ms=step_ms,
        requests=len(reqs),
    )
    transport = open_transport("inprocess" if oracle_routing else options.transport,
                               [r.name for r in cluster.replicas])
    t0 = time.perf_counter()
    try:
        _drive(cluster, reqs, step_ms, restarts, transport, result, progress)
    finally:
        transport.close()
        close = getattr(cluster.indexer, "close", None)
        if callable(close):
            close()
        result.wall_s = time.perf_counter() - t0
    _settle(cluster, reqs, result)
    return result


def _drive(cluster: _Cluster, reqs: Sequence[TraceRequest], step_ms: float, restarts: dict[int, list[int]],
           transport: Transport, result: ClusterResult, progress: ProgressFn | None) -> None:
    """The replay's clock over every replica: at each arrival, restarts first, then routing; then
    one step of every replica, and publication."""

    def arrive(i: int) -> None:
        for replica_index in restarts.get(i, []):
            cluster.restart(cluster.replicas[replica_index])
        cluster.replicas[cluster.route(i, transport)].sched.enqueue(i)

    for clock in scheduler_steps(reqs, step_ms, lambda: any(r.sched.busy for r in cluster.replicas), arrive,
                                 lambda: sum(r.sched.finished for r in cluster.replicas), progress):
        cluster.step(clock, transport)
        result.steps += 1
    if progress is not None:
        progress(len(reqs), len(reqs))


def _settle(cluster: _Cluster, reqs: Sequence[TraceRequest], result: ClusterResult) -> None:
    """The cluster's measures from its replicas' (module docstring)."""
    hits = [-1] * len(reqs)
    computed = [0] * len(cluster.replicas)
    evictions = []
    for replica in cluster.replicas:
        replica.finish()
        evictions.append(replica.evictions)
        sched, part = replica.sched, replica.sched.result
        for counter in ("admitted", "completed", "rejected", "aborted", "preemptions"):
            setattr(result, counter, getattr(result, counter) + getattr(part, counter))
        for i, h in enumerate(sched.hits):
            if h >= 0:
                hits[i] = h
        result.peak_blocks_in_use = max(result.peak_blocks_in_use, replica.peak_in_use)
        result.batches_published += replica.published
        result.batches_dropped += replica.dropped
    result.evictions = None if None in evictions else sum(e for e in evictions if e is not None)
    for i, r in enumerate(cluster.routes):
        computed[r] += reqs[i].input_length - max(hits[i], 0)
    result.hits, result.routes = hits, cluster.routes
    result.prompt_tokens = sum(r.input_length for r in reqs)
    result.hit_tokens = sum(h for h in hits if h > 0)
    mean = sum(computed) / len(computed)
    result.load_imbalance = max(computed) / mean if mean else 1.0
    counts = Counter(cluster.routes)
    result.requests_per_replica = "/".join(str(counts[k]) for k in range(len(cluster.replicas)))
    result.resyncs = cluster.resyncs
    if cluster.hasher is not None:
        result.stale_decisions, result.misroutes = cluster.stale, cluster.misroutes
    result.bound_token_hit_rate = prefix_hit_bound(reqs, cluster.config.block_size).token_hit_rate


def run_with_twin(requests: Sequence[TraceRequest], config: ReplayConfig, options: ClusterOptions,
                  factory: EngineFactory, **kwargs: Any) -> ClusterResult:
    """:func:`run_cluster`, and when a fault is injected also its oracle-routed twin (same faults,
    perfect knowledge), whose hit rate goes into ``oracle_token_hit_rate``."""
    result = run_cluster(requests, config, options, factory, **kwargs)
    if options.faulty:
        twin_args = {k: v for k, v in kwargs.items() if k not in ("progress", "indexer_factory")}
        twin = run_cluster(requests, config, options, factory, oracle_routing=True, **twin_args)
        result.oracle_token_hit_rate = twin.token_hit_rate
    return result
