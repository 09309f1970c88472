"""Minimal counterexamples: replay a failing operation sequence and shrink it, deterministically.

The stateful runner hands over the first failing example as Hypothesis generated it
(:class:`Found`). :func:`minimize` then replays edited versions on fresh engines and keeps every
edit after which the *same property* still fails:

1. drop chunks of steps (halves, quarters, … single steps), and every step of one request;
2. shrink the config: fewer blocks, a smaller block size, the default policy, the default hash;
3. merge an append into the allocate or append just before it on the same request;
4. drop extras from every step at once (all, then one kind at a time);
5. simplify single steps: drop extras (all, then one kind at a time), shorten token lists.

The passes repeat until none helps or the replay budget is spent. The budget is a *count* of
replays, never a clock, so the same failure always shrinks to the same sequence.
:func:`minimize` replays the minimal sequence once more with ``trace`` (pure table and free-count
queries just before each ``step()``), so that :func:`render_failure` prints, besides what the
engine and the spec did at every step (the violating step included) and a ready-to-save vector,
what each ``step()`` changed (``step(): block_table(1) [1] -> [0]; num_free_blocks 0 -> 1``) and,
when it precedes the violating step, the step where the engine's observable state first departs
from the spec's (:func:`first_departure`: ``<-- departs from the spec here (...)``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from pagedprefix.spec import (
    CacheConfig,
    PrefixCacheError,
    check_config,
    describe_groups,
    hash_granularity,
    is_hybrid,
)

from ..judging.driver import Observation, Outcome, Step, describe_step
from ..judging.judge import Lost, Renaming
from ..judging.model import EngineRun, SpecModel, adapter_capabilities, build_adapter
from ..judging.properties import Violation
from ..protocol import AdapterFactory, Capabilities, UnsupportedConfig, close_adapter
from ..protocol.codec import Json
from ..protocol.placeholders import form_of, step_form_violation
from ..protocol.watchdog import BudgetSpent
from .vector_format import dumps, make_case, schema_version_of, spec_version

DEFAULT_POLICY = ("unhashed_to_head", False)


@dataclass(frozen=True)
class Found:
    """A failing example: the property, the engine's config, the spec's config (the engine's
    declared policy, when it differs from the config's) and the steps, without expectations."""

    prop: str
    engine_config: CacheConfig
    model_config: CacheConfig
    steps: list[Step]


@dataclass
class Replay:
    """One replay of a step list: the violation it ends in (if any), each step with the spec's
    expectation, and what the engine did at each step (the violating one included)."""

    violation: Violation | None
    steps: list[dict[str, Json]]
    outcomes: list[Outcome | None]
    initial: Json
    config: CacheConfig | None = None
    """The spec's config the expectations come from (the vector's config)."""
    observations: list[Observation | None] = field(default_factory=list)
    """The engine's observation after each step (``None`` where none was taken)."""
    step_changes: list[list[str]] = field(default_factory=list)
    """What ``step()`` changed at each step (a traced replay only; empty lists otherwise)."""
    policy: bool = False
    """The judge compared the spec's eviction order (profile ``lru`` or ``exact``)."""
    cut_short: str = ""
    """Why the minimizer stopped before it was done (the run's time budget ran out), or ``""``."""


@dataclass
class Failure:
    """The minimal counterexample of one property."""

    prop: str
    message: str
    sequence: str
    vector: dict[str, Json]
    detail: str = ""

    def render(self) -> str:
        detail = f"\n\n{self.detail}" if self.detail else ""
        return (
            f"[{self.prop}] {self.message}{detail}\n\nMinimal operation sequence:\n{self.sequence}\n\n"
            f"Ready-to-save vector (conformance/vectors schema):\n{dumps(self.vector)}"
        )


def model_config_for(config: CacheConfig, caps: Capabilities) -> CacheConfig:
    """The spec's config for an engine built with ``config``: the engine's own declared spec
    policy when it claims one that differs from the config's (it is judged by what it claims)."""
    if not caps.claims_policy_of(config) and caps.claims_a_spec_policy():
        assert caps.dedup_on_full is not None
        hybrid = is_hybrid(config.groups, config.block_size)
        dedup = False if hybrid else caps.dedup_on_full  # no dedup_on_full with hybrid groups
        config = replace(config, free_order=caps.free_order, dedup_on_full=dedup)
        if hybrid:
            if caps.retention in ("replay", "dense"):
                config = replace(config, retention=caps.retention)
            if caps.group_free_order in ("group_major", "reversed_concat"):
                config = replace(config, group_free_order=caps.group_free_order)
    return config


def replay(
    factory: AdapterFactory,
    config: CacheConfig,
    steps: list[Step],
    profile: str,
    disabled: frozenset[str],
    trace: bool = False,
) -> Replay:
    """Run ``steps`` on a fresh engine built with ``config`` and the spec; stop at the first
    violation. A config the engine does not support replays as "no violation". ``trace``: also
    record what each ``step()`` changed (:attr:`EngineRun.trace`)."""
    try:
        check_config(config)  # a candidate the spec rejects is no counterexample
        adapter = build_adapter(factory, config)
    except (UnsupportedConfig, PrefixCacheError):  # a candidate config the engine rejects
        return Replay(None, [], [], None)
    try:
        model = SpecModel(model_config_for(config, adapter_capabilities(adapter)))
        initial = model.observe()
        done: list[dict[str, Json]] = []
        outcomes: list[Outcome | None] = []
        seen: list[Observation | None] = []
        changes: list[list[str]] = []
        run: EngineRun | None = None

        def ended(v: Violation | None) -> Replay:
            policy = run is not None and run.judge.policy
            return Replay(v, done, outcomes, initial, model.config, seen, changes, policy)

        try:
            run = EngineRun.start(factory, model.config, profile, initial, disabled, adapter=adapter)
            run.trace = trace
            for step in steps:
                _, expect = model.do(step)
                done.append({**step, "expect": expect})
                try:
                    outcomes.append(run.do(step, expect))
                finally:
                    seen.append(run.last_observation)
                    changes.append(list(run.last_step_changes))
        except Violation as v:
            if run is not None and len(outcomes) < len(done):
                outcomes.append(run.last_outcome)
            return ended(v)
        except Lost:
            return ended(None)
        return ended(None)
    finally:
        close_adapter(adapter)


@dataclass(eq=False)
class Shrinker:
    """Keeps the smallest replay that still fails with ``prop`` (see the module docstring):
    ``config`` and ``steps`` are the smallest failing candidate so far, ``best`` its replay."""

    factory: AdapterFactory
    found: Found
    profile: str
    disabled: frozenset[str]
    caps: Capabilities
    budget: int
    prop: str = field(init=False)
    config: CacheConfig = field(init=False)
    steps: list[Step] = field(init=False)
    best: Replay | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.prop = self.found.prop
        self.config = self.found.engine_config
        self.steps = list(self.found.steps)

    def attempt(self, config: CacheConfig, steps: list[Step]) -> bool:
        """Replay a candidate; keep it (truncated at its violation) if it still fails."""
        if self.budget <= 0 or not self.in_form(steps):
            return False
        self.budget -= 1
        try:
            r = replay(self.factory, config, steps, self.profile, self.disabled)
        except BudgetSpent as spent:  # the run's time budget: keep the smallest failure so far
            if self.best is None:
                raise
            self.best.cut_short = str(spent)
            self.budget = 0
            return False
        if r.violation is None or r.violation.prop != self.prop:
            return False
        self.config, self.steps, self.best = config, steps[: len(r.steps)], r
        return True

    def in_form(self, steps: list[Step]) -> bool:
        """Every request of ``steps`` is one the engine may be sent: in the placeholder form when
        it declares one (:mod:`pagedprefix.conformance.protocol.placeholders`)."""
        form = form_of(self.caps)
        return form is None or all(step_form_violation(s, form) is None for s in steps)

    def run(self) -> Replay | None:
        if not self.attempt(self.config, self.steps):
            return None
        progress = True
        while progress and self.budget > 0:
            progress = False
            for shrink in (
                self.drop_chunks,
                self.drop_requests,
                self.shrink_config,
                self.merge_appends,
                self.drop_extras_everywhere,
                self.simplify_steps,
            ):
                progress = shrink() or progress
        return self.best

    def drop_chunks(self) -> bool:
        improved = False
        size = max(1, len(self.steps) // 2)
        while size >= 1:
            i = 0
            while i < len(self.steps):
                cand = self.steps[:i] + self.steps[i + size :]
                if cand and self.attempt(self.config, cand):
                    improved = True
                else:
                    i += size
            size //= 2
        return improved

    def drop_requests(self) -> bool:
        """Every step of one request dropped at once (its admission, appends, forks and free):
        a request's lifetime is spread over steps that no chunk holds together."""
        improved = False
        for rid in _request_ids(self.steps):
            cand = [step for step in self.steps if not _mentions(step, rid)]
            if not cand or len(cand) == len(self.steps):
                continue
            # Without the request the pool has room to spare: the eviction it forced may need a
            # smaller pool to happen again.
            pools = range(self.config.num_blocks, self.caps.min_blocks - 1, -1)
            if any(self.attempt(replace(self.config, num_blocks=n), cand) for n in pools):
                improved = True
        return improved

    def shrink_config(self) -> bool:
        improved = False
        for cand in self._smaller_configs():
            if self.attempt(cand, self.steps):
                improved = True
        return improved

    def _smaller_configs(self) -> Iterator[CacheConfig]:
        c = self.config
        for n in range(self.caps.min_blocks, c.num_blocks):
            yield replace(c, num_blocks=n)
        if c.groups is not None and is_hybrid(c.groups, c.block_size):
            yield from self._simpler_groups()
            return
        sizes = self.caps.block_sizes or tuple(range(1, c.block_size))
        for b in sizes:
            if b < self.config.block_size:  # one full group: the default groups of the new size
                yield replace(self.config, block_size=b, groups=None)
        if (self.config.free_order, self.config.dedup_on_full) != DEFAULT_POLICY:
            yield replace(self.config, free_order=DEFAULT_POLICY[0], dedup_on_full=DEFAULT_POLICY[1])
        if self.config.hash_algo != "sha256" or self.config.verify_tokens:
            yield replace(self.config, hash_algo="sha256", verify_tokens=False)

    def _simpler_groups(self) -> Iterator[CacheConfig]:
        """A hybrid config with one group fewer (its block size the new gcd), then the default
        retention and group free order."""
        groups = self.config.groups or ()
        for i in range(len(groups)):
            fewer = groups[:i] + groups[i + 1 :]
            if fewer:
                cand = replace(self.config, groups=fewer, block_size=hash_granularity(fewer))
                if self.caps.supports_groups(cand) and is_hybrid(cand.groups, cand.block_size):
                    yield cand
        if self.config.retention != "replay" or self.config.group_free_order != "group_major":
            yield replace(self.config, retention="replay", group_free_order="group_major")

    def merge_appends(self) -> bool:
        """An append merged into the allocate or append just before it on the same request."""
        improved = False
        i = 0
        while i + 1 < len(self.steps):
            a, b = self.steps[i], self.steps[i + 1]
            same = a.get("request_id") == b.get("request_id")
            if a["op"] in ("allocate", "append") and b["op"] == "append" and same and _token_list(a, b):
                merged = {**a, "tokens": list(a["tokens"]) + list(b["tokens"])}
                if self.attempt(self.config, self.steps[:i] + [merged] + self.steps[i + 2 :]):
                    improved = True
                    continue
            i += 1
        return improved

    def drop_extras_everywhere(self) -> bool:
        """Extras (all of them, then one kind at a time) dropped from every step at once: a hit
        that needs equal extras on two steps survives only a change made to both."""
        kinds = sorted(
            {k for step in self.steps if isinstance(step.get("extras"), dict) for k in step["extras"]}
        )
        improved = False
        for drop in [None, *kinds]:
            cand = [_without_extras(step, drop) for step in self.steps]
            if cand != self.steps and self.attempt(self.config, cand):
                improved = True
        return improved

    def simplify_steps(self) -> bool:
        improved = False
        for i in range(len(self.steps)):
            if i >= len(self.steps):
                break
            for edit in simplifications(self.steps[i]):
                if self.attempt(self.config, self.steps[:i] + [edit] + self.steps[i + 1 :]):
                    improved = True
                    break
        return improved


_ID_FIELDS = ("request_id", "parent_id", "child_id")


def _request_ids(steps: list[Step]) -> list[Json]:
    """The request ids the steps use, in order of first use (hashable ones only)."""
    seen: list[Json] = []
    for step in steps:
        for name in _ID_FIELDS:
            rid = step.get(name)
            if isinstance(rid, (str, int)) and not any(type(rid) is type(s) and rid == s for s in seen):
                seen.append(rid)
    return seen


def _mentions(step: Step, rid: Json) -> bool:
    return any(type(step.get(name)) is type(rid) and step.get(name) == rid for name in _ID_FIELDS)


def _token_list(*steps: Step) -> bool:
    return all(isinstance(step.get("tokens"), list) for step in steps)


def _without_extras(step: Step, kind: str | None) -> Step:
    """``step`` without its extras (``kind=None``) or without one kind of extra."""
    extras = step.get("extras")
    if not isinstance(extras, dict):
        return step
    if kind is None:
        return {k: v for k, v in step.items() if k != "extras"}
    kept = {k: v for k, v in extras.items() if k != kind}
    if kept:
        return {**step, "extras": kept}
    return {k: v for k, v in step.items() if k != "extras"}


def simplifications(step: Step) -> list[Step]:
    """Smaller variants of one step, most aggressive first: an admission as a lookup, without
    extras, without one kind of extra, with a shorter token list (keeping extras valid is the
    replay's business: an invalid variant fails differently and is dropped)."""
    out: list[Step] = []
    if step["op"] == "allocate":  # the same question without the admission
        out.append({k: v for k, v in step.items() if k not in ("op", "request_id")} | {"op": "lookup"})
    extras = step.get("extras")
    if isinstance(extras, dict) and extras:
        out.append({k: v for k, v in step.items() if k != "extras"})
        if len(extras) > 1:
            out.extend({**step, "extras": {k: v for k, v in extras.items() if k != kind}} for kind in extras)
    tokens = step.get("tokens")
    if isinstance(tokens, list) and len(tokens) > 1:
        lengths = sorted({1, len(tokens) // 2, len(tokens) - 1} - {0, len(tokens)})
        out.extend({**step, "tokens": tokens[:n]} for n in lengths)
    return out


def minimize(
    factory: AdapterFactory,
    found: Found,
    profile: str,
    disabled: frozenset[str],
    caps: Capabilities,
    budget: int,
) -> Replay | None:
    """The smallest failing replay reachable within ``budget`` replays (``None``: the failure does
    not reproduce — a non-deterministic engine). When the run's time budget runs out after the
    first replay failed, the smallest failing replay so far, with ``cut_short`` set;
    :class:`~pagedprefix.conformance.protocol.watchdog.BudgetSpent` when it runs out before."""
    shrinker = Shrinker(factory, found, profile, disabled, caps, budget)
    best = shrinker.run()
    if best is None or best.cut_short:
        return best
    traced = replay(factory, shrinker.config, shrinker.steps, profile, disabled, trace=True)
    assert best.violation is not None
    same = traced.violation is not None and traced.violation.prop == best.violation.prop
    if same and len(traced.steps) == len(best.steps):
        return traced
    return best  # the extra queries before step() changed the engine's course: shown untraced


class _Departure:
    """The first step at which the engine's observable state departs from the spec's: its
    outcome (error kind, hit length, reset result), the tables and copies it returned, and the
    observation after ``step()`` (free count, live requests' tables, ref counts, the free queue:
    its order only when ``order``), each up to one consistent renaming of block ids."""

    def __init__(self, order: bool) -> None:
        self.renaming = Renaming()
        self.order = order

    def same(self, spec_ids: Json, engine_ids: Json) -> bool:
        if not isinstance(spec_ids, list) or not isinstance(engine_ids, list):
            return bool(spec_ids == engine_ids)
        if len(spec_ids) != len(engine_ids):
            return False
        for s, e in zip(spec_ids, engine_ids):
            if isinstance(s, list) or isinstance(e, list):
                if not self.same(s, e):
                    return False
            elif s is None or e is None:
                if s is not e:
                    return False
            elif not self.renaming.pair(int(s), int(e)):
                return False
        return True

    def find(self, outcome: Outcome | None, obs: Observation | None, exp: dict[str, Json]) -> str | None:
        """What departs at this step (``None``: nothing observed departs, or nothing to compare)."""
        if outcome is None or outcome.skipped:
            return None
        if outcome.crash is not None or outcome.error != exp["error"]:
            return f"engine {outcome.describe()}, spec {exp['error'] or 'succeeds'}"
        res, want = outcome.result or {}, exp["result"] or {}
        for key in ("num_computed_tokens", "reset"):
            if key in want and res.get(key) != want[key]:
                return f"{key}: engine {res.get(key)}, spec {want[key]}"
        for key in ("block_table", "block_tables", "copies"):
            if key in want and not self.same(want[key], res.get(key)):
                return f"{key}: engine {res.get(key)}, spec {want[key]}"
        if obs is None:
            return None
        if obs["num_free_blocks"] != exp["num_free_blocks"]:
            return f"num_free_blocks: engine {obs['num_free_blocks']}, spec {exp['num_free_blocks']}"
        for key, call in (("tables", "block_table"), ("group_tables", "block_tables")):
            spec_tables = {repr(rid): t for rid, t in exp.get(key, [])}
            for rid, table in obs.get(key, []):
                if repr(rid) not in spec_tables or not self.same(spec_tables[repr(rid)], table):
                    return f"{call}({rid!r}): engine {table}, spec {spec_tables.get(repr(rid))}"
        if "ref_cnt" in obs and "ref_cnt" in exp:
            for s, e in sorted(self.renaming.s2e.items()):
                if obs["ref_cnt"][e] != exp["ref_cnt"][s]:
                    return f"ref_cnt({e}): engine {obs['ref_cnt'][e]}, spec (block {s}) {exp['ref_cnt'][s]}"
        queues = "free_blocks" in obs and "free_blocks" in exp
        if self.order and queues and not self.same(exp["free_blocks"], obs["free_blocks"]):
            return f"free queue: engine {obs['free_blocks']}, spec {exp['free_blocks']}"
        return None


def first_departure(result: Replay) -> tuple[int, str] | None:
    """The index of the first step whose engine observation departs from the spec's, and what
    departs there (:class:`_Departure`); ``None`` when none does before the replay ends."""
    departure = _Departure(result.policy)
    for i, entry in enumerate(result.steps):
        outcome = result.outcomes[i] if i < len(result.outcomes) else None
        obs = result.observations[i] if i < len(result.observations) else None
        found = departure.find(outcome, obs, entry["expect"])
        if found is not None:
            return i, found
    return None


def render_failure(result: Replay, profile: str) -> Failure:
    """The readable sequence and the ready-to-save vector of a failing replay."""
    assert result.violation is not None and result.config is not None
    v = result.violation
    config = result.config
    lines = [
        f"  config: block_size={config.block_size} num_blocks={config.num_blocks} "
        f"free_order={config.free_order} dedup_on_full={config.dedup_on_full}"
        + (f" hash_algo={config.hash_algo}" if config.hash_algo != "sha256" else "")
        + (" verify_tokens=True" if config.verify_tokens else "")
        + (
            f" groups={describe_groups(config.groups)} retention={config.retention}"
            f" group_free_order={config.group_free_order}"
            if config.groups is not None and is_hybrid(config.groups, config.block_size)
            else ""
        )
    ]
    last = len(result.steps) - 1
    departs = first_departure(result)
    for i, entry in enumerate(result.steps):
        exp = entry["expect"]
        spec_says = exp["error"] or json.dumps(exp["result"], sort_keys=True)
        outcome = result.outcomes[i] if i < len(result.outcomes) else None
        engine_says = "(no result)" if outcome is None else outcome.describe()
        if departs is not None and departs[0] == i and i != last:
            engine_says += f"   <-- departs from the spec here ({departs[1]})"
        if i == last:
            engine_says += f"   <-- violates {v.prop}"
        changed = result.step_changes[i] if i < len(result.step_changes) else []
        if changed:
            engine_says += "\n      step(): " + "; ".join(changed)
        s = {k: val for k, val in entry.items() if k != "expect"}
        lines.append(
            f"  {i + 1:2d}. {describe_step(s)}\n      engine: {engine_says}\n      spec:   {spec_says}"
        )
    if not result.steps:
        lines.append(f"  (at creation)   <-- violates {v.prop}")
    case = make_case(
        f"counterexample/{v.prop}",
        f"Found by the stateful runner: [{v.prop}] {v.message}",
        "counterexample",
        profile,
        config,
        initial=result.initial,
        steps=result.steps,
    )
    vector: dict[str, Json] = {
        "schema_version": schema_version_of([case]),
        "spec_version": spec_version(),
        "group": "counterexamples",
        "description": "Saved counterexample of the stateful conformance runner.",
        "cases": [case],
    }
    return Failure(v.prop, v.message, "\n".join(lines), vector, v.detail)
