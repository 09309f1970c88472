"""The spec as the model: expected outcomes and observations in the vectors' JSON form, and one
run of an engine judged step by step (shared by the vector runner and the stateful runner)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from pagedprefix.spec import CacheConfig, HybridSpecCache, RequestId, is_hybrid

from ..protocol import (
    ADAPTER_PROTOCOL_VERSION,
    AdapterFactory,
    Capabilities,
    PrefixCacheAdapter,
    close_adapter,
)
from ..protocol.adapters import SpecAdapter
from ..protocol.channels import GROUPS, note_marker
from ..protocol.codec import Json, config_to_json
from .driver import (
    Observation,
    Outcome,
    Step,
    call_engine,
    call_engine_raw,
    describe_step,
    execute,
    is_live,
    observe,
)
from .judge import Judge, first_error, judge_for
from .properties import Violation, at_least

FULL_CAPS = Capabilities(keys=True, protocol_version=ADAPTER_PROTOCOL_VERSION)


class SpecModel:
    """The spec driven by JSON steps; gives the expectation of each step."""

    def __init__(self, config: CacheConfig) -> None:
        self.config = config
        self.adapter = SpecAdapter(config)
        self.hybrid = is_hybrid(config.groups, config.block_size)
        self.pops = 0

    def observe(self, want_keys: bool = False) -> Observation:
        cache = self.adapter.cache
        ids = cache.request_ids()
        return observe(self.adapter, FULL_CAPS, self.config.num_blocks, ids, want_keys, self.hybrid)

    def do(self, step: Step, want_keys: bool = False) -> tuple[Outcome, dict[str, Json]]:
        """Run ``step``; returns the outcome and the expectation
        ``{"error", "result", <observation>, "evictions", "pops"}``.

        ``evictions`` counts keys the spec has evicted; ``pops`` counts blocks it has taken from the
        free queue for new content since creation or the last successful reset. While
        ``pops <= num_blocks`` a never-used block was always available, so no engine needed to
        evict anything: that is "no eviction pressure" for profile ``maximal``.
        """
        old_blocks = 0
        if step["op"] == "append":
            try:
                old_blocks = len(self.adapter.block_table(step["request_id"]))
            except Exception:
                old_blocks = 0
        popped = getattr(self.adapter.cache, "num_pops", 0)
        outcome = execute(self.adapter, step)
        assert outcome.crash is None, f"the spec crashed on {step}: {outcome.crash}"
        cache = self.adapter.cache
        if isinstance(cache, HybridSpecCache):
            if step["op"] == "reset" and (outcome.result or {}).get("reset"):
                self.pops = 0
            self.pops += cache.num_pops - popped
        elif outcome.ok:
            res = outcome.result or {}
            if step["op"] == "allocate":
                self.pops += len(res["block_table"]) - res["num_computed_tokens"] // self.config.block_size
            elif step["op"] == "append":
                self.pops += len(res["copies"]) + len(res["block_table"]) - old_blocks
            elif step["op"] == "reset" and res["reset"]:
                self.pops = 0
        expect: dict[str, Json] = {"error": outcome.error, "result": outcome.result}
        expect.update(self.observe(want_keys))
        expect["evictions"] = self.adapter.num_evictions
        expect["pops"] = self.pops
        if isinstance(cache, HybridSpecCache):
            expect["orphans"] = cache.orphans()
        return outcome, expect


def effective_level(profile: str, caps: Capabilities, config: CacheConfig) -> str:
    """The profile a run is judged at: ``lru``/``exact`` need the engine to follow the config's
    policy (else ``maximal``), ``exact`` needs ``exact_ids`` (else ``lru``);
    ``single-namespace`` is judged like ``core``."""
    level = "core" if profile == "single-namespace" else profile
    if at_least(level, "lru") and not caps.claims_policy_of(config):
        level = "maximal"
    if level == "exact" and not caps.exact_ids:
        level = "lru"
    return level


def _valid_id(request_id: object) -> bool:
    return isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool))


def live_after(judge: Judge, step: Step, outcome: Outcome) -> list[RequestId]:
    """The requests that should be live after ``step`` given its outcome."""
    live = list(judge.live)
    if outcome.ok and first_error(step, judge.live) is None:
        op = step["op"]
        if op == "allocate":
            live.append(step["request_id"])
        elif op == "fork":
            live.append(step["child_id"])
        elif op == "free":
            live.remove(step["request_id"])
    return live


@dataclass
class EngineRun:
    """One engine instance judged step by step.

    Every adapter call goes through :func:`~pagedprefix.conformance.judging.driver.call_engine` (or
    ``execute``): an exception that is not a spec error, or a malformed value, is an
    ``engine-errors`` violation routed through the judge (so a disabled property is looked past
    like any other); :class:`~pagedprefix.conformance.protocol.watchdog.EngineHung` ends the run.
    """

    adapter: PrefixCacheAdapter
    config: CacheConfig
    judge: Judge
    last_outcome: Outcome | None = None
    """What the engine returned at the last step (shown at a violating step)."""
    trace: bool = False
    """Also read the live requests' tables and the free count just before each ``step()``, to
    show what ``step()`` changed (a rendering replay only: it adds pure queries to the calls)."""
    last_observation: Observation | None = None
    """The engine's observation after the last step (``None`` until one was taken)."""
    last_step_changes: list[str] = field(default_factory=list)
    """With ``trace``: what the last ``step()`` changed (:func:`step_changes`)."""

    @classmethod
    def start(
        cls,
        factory: AdapterFactory,
        config: CacheConfig,
        profile: str,
        expected_initial: Observation | None,
        disabled: frozenset[str] = frozenset(),
        adapter: PrefixCacheAdapter | None = None,
    ) -> EngineRun:
        """Build the engine (unless ``adapter`` is given) and check its fresh state."""
        if adapter is None:
            adapter = build_adapter(factory, config)
        caps = adapter_capabilities(adapter)
        judge = judge_for(config, effective_level(profile, caps, config), disabled, caps)
        run = cls(adapter, config, judge)
        with run.routed():
            obs = run.observe([], False)
        judge.start(obs, expected_initial)
        return run

    @property
    def caps(self) -> Capabilities:
        return self.adapter.capabilities

    @property
    def sends_lookups(self) -> bool:
        """Lookups are sent unless the engine has none, or has an impure one and the profile
        compares eviction order (``lru``, ``exact``)."""
        caps = self.caps
        return caps.lookup and (caps.lookup_is_pure or not at_least(self.judge.level, "lru"))

    def observe(self, live: list[RequestId], want_keys: bool) -> Observation:
        hybrid = is_hybrid(self.config.groups, self.config.block_size)
        return observe(self.adapter, self.caps, self.config.num_blocks, live, want_keys, hybrid)

    @contextlib.contextmanager
    def routed(self) -> Iterator[None]:
        """Violations raised by adapter calls in the body go through the judge (``disabled``)."""
        try:
            yield
        except Violation as v:
            self.judge.fail(v.prop, v.message, v.detail)

    def do(self, step: Step, expected: dict[str, Json] | None) -> Outcome:
        """Run one step on the engine, call its step boundary, observe and judge."""
        if step["op"] == "lookup" and not self.sends_lookups:
            return Outcome(skipped=True)
        self.last_outcome = None
        self.last_observation = None
        self.last_step_changes = []
        outcome = execute(self.adapter, step)
        self.last_outcome = outcome
        if outcome.crash is not None:
            self.judge.fail("engine-errors", f"{describe_step(step)} crashed: {outcome.crash}", outcome.trace)
        live = live_after(self.judge, step, outcome)
        with self.routed():
            before = self._before_step(live) if self.trace else None
            call_engine("step()", self.adapter.step)
            leaked = False
            if not outcome.ok and step["op"] in ("allocate", "fork"):
                new_id = step["request_id"] if step["op"] == "allocate" else step["child_id"]
                if _valid_id(new_id) and new_id not in self.judge.live:
                    leaked = is_live(self.adapter, new_id)
            want_keys = expected is not None and "keys" in expected
            obs = self.observe(live, want_keys)
        self.last_observation = obs
        if before is not None:
            self.last_step_changes = step_changes(before, obs)
        self.judge.check(step, outcome, obs, expected, leaked)
        return outcome

    def _before_step(self, live: list[RequestId]) -> Observation:
        """The free count and the live requests' tables, read just before ``step()`` (no events
        are taken: the observation after ``step()`` still receives them)."""
        hybrid = is_hybrid(self.config.groups, self.config.block_size)
        caps = replace(self.caps, ref_cnt=False, free_queue=False, keys=False, events=False)
        return observe(self.adapter, caps, self.config.num_blocks, live, False, hybrid)

    def close(self) -> None:
        close_adapter(self.adapter)


def step_changes(before: Observation, after: Observation) -> list[str]:
    """What ``step()`` changed between two observations (``before`` read just before it): each
    rewritten block table with its entries before and after, and the free count."""
    changes: list[str] = []
    for field_name, call in (("tables", "block_table"), ("group_tables", "block_tables")):
        old = {repr(rid): t for rid, t in before.get(field_name, [])}
        for rid, table in after.get(field_name, []):
            was = old.get(repr(rid))
            if was is not None and was != table:
                changes.append(f"{call}({rid!r}) {was} -> {table}")
    if before.get("num_free_blocks") != after.get("num_free_blocks"):
        changes.append(f"num_free_blocks {before.get('num_free_blocks')} -> {after.get('num_free_blocks')}")
    return changes


def build_adapter(factory: AdapterFactory, config: CacheConfig) -> PrefixCacheAdapter:
    """``factory(config)``; raises what the factory raises for a config it rejects
    (``UnsupportedConfig``, a spec error), and an ``engine-errors`` :class:`Violation` for any other
    exception or for a product that is not an adapter."""
    what = f"the factory, for config {config_to_json(config)}"
    adapter: PrefixCacheAdapter = call_engine_raw(what, lambda: factory(config), start=True)
    adapter_capabilities(adapter)
    if is_hybrid(config.groups, config.block_size):
        note_marker(GROUPS)  # the engine's kv_cache_groups channel is reached (protocol.channels)
    return adapter


ADAPTER_METHODS = ("allocate", "append", "free", "block_table", "num_free_blocks", "step")
HYBRID_METHODS = ("block_tables", "new_step")
DECLARED_METHODS: dict[str, tuple[str, ...]] = {
    "lookup": ("lookup",),
    "fork": ("fork",),
    "reset": ("reset_prefix_cache",),
    "ref_cnt": ("ref_cnt",),
    "free_queue": ("free_blocks",),
    "keys": ("block_hash",),
    "spells_extras": ("spell_extras",),
    "events": ("take_events", "cached_keys"),
}


def adapter_capabilities(adapter: object) -> Capabilities:
    """The adapter's declared :class:`Capabilities`; an ``engine-errors`` :class:`Violation` if
    it is not an adapter (missing operations, no or malformed capabilities)."""
    missing = [m for m in ADAPTER_METHODS if not callable(getattr(adapter, m, None))]
    caps = getattr(adapter, "capabilities", None)
    if missing or not isinstance(caps, Capabilities):
        what = f"missing {', '.join(missing)}" if missing else "its capabilities are not a Capabilities"
        raise Violation(
            "engine-errors", f"the factory returned {type(adapter).__name__}, not an adapter ({what})"
        )
    try:
        caps.check()
    except ValueError as exc:
        raise Violation("engine-errors", f"the adapter's capabilities are malformed: {exc}") from None
    undone = [
        m
        for cap, methods in DECLARED_METHODS.items()
        for m in methods
        if getattr(caps, cap) and not callable(getattr(adapter, m, None))
    ]
    if caps.groups:
        undone += [m for m in HYBRID_METHODS if not callable(getattr(adapter, m, None))]
    if undone:
        raise Violation("engine-errors", f"the adapter declares capabilities but lacks {', '.join(undone)}")
    return caps
