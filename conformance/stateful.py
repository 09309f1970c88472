"""The stateful runner: a Hypothesis state machine with the spec as the model.

Each example builds a small cache (block size 1-4, a handful of blocks, a policy the engine follows),
then runs random operations — prompts from a tiny alphabet that reuse earlier prompts' prefixes so
hits, evictions and ``OutOfBlocks`` are frequent, appends, forks, frees, lookups, resets and invalid
operations — on the engine and on the spec, judging every step
(:class:`~pagedprefix.conformance.judge.Judge`). Whenever every request has been freed (a
``free_all`` rule does it on purpose) the pool must be whole again.

A failure is shrunk to a minimal operation sequence, printed with the engine's and the spec's
outcomes, and turned into a ready-to-save vector (same schema as ``conformance/vectors``). To see
past a failing property, the runner runs again with that property *disabled*: examples that reach
its violation are discarded, so every property gets its own first counterexample.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, reject, seed
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky, Unsatisfiable
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pagedprefix.spec import (
    CacheConfig,
    Extras,
    LoRA,
    MultiModalItem,
    PrefixCacheError,
    PromptEmbeds,
    check_extras,
)

from .codec import Json, config_to_json, extras_from_json, extras_to_json
from .driver import Outcome, Step, describe_step
from .judge import Lost
from .model import EngineRun, SpecModel
from .properties import PROPERTIES, Violation, at_least, profile_rank
from .protocol import AdapterFactory, Capabilities, UnsupportedConfig, close_adapter
from .vector_format import SCHEMA_VERSION, dumps, make_case, spec_version

POLICIES: tuple[tuple[str, bool], ...] = (
    ("unhashed_to_head", False),
    ("append_all", False),
    ("unhashed_to_head", True),
    ("append_all", True),
)
BLOCK_SIZES = (2, 1, 3, 4)
POOL_SIZES = (4, 8, 2, 12, 3, 16, 6, 1)
IDS: tuple[Json, ...] = ("a", "b", 1, "1", "c", 0)
ALPHABET = (1, 2, 3)
PROBE_CONFIG = CacheConfig(block_size=4, num_blocks=8)


@dataclass
class Failure:
    """The minimal counterexample of one property."""

    prop: str
    message: str
    sequence: str
    vector: dict[str, Json]

    def render(self) -> str:
        return (
            f"[{self.prop}] {self.message}\n\nMinimal operation sequence:\n{self.sequence}\n\n"
            f"Ready-to-save vector (conformance/vectors schema):\n{dumps(self.vector)}"
        )


@dataclass
class PropertyResult:
    """``pass``, ``fail`` or ``skip`` for one property of the stateful run."""

    name: str
    status: str
    detail: str = ""
    failure: Failure | None = None


@dataclass
class StatefulReport:
    """Outcome of :func:`run_conformance`."""

    profile: str
    capabilities: Capabilities | None
    properties: list[PropertyResult] = field(default_factory=list)
    examples: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and all(p.status != "fail" for p in self.properties)

    def failures(self) -> list[Failure]:
        return [p.failure for p in self.properties if p.failure is not None]


@dataclass(frozen=True)
class Found:
    """A failing example as Hypothesis left it: the property, both configs and the steps."""

    prop: str
    engine_config: CacheConfig
    model_config: CacheConfig
    steps: list[Step]


class _Recorder:
    """Keeps the last failure seen (Hypothesis replays its minimal example last)."""

    def __init__(self) -> None:
        self.found: Found | None = None
        self.examples = 0


@dataclass
class Replay:
    """One replay of a step list: the violation it ends in (if any), with what each side did."""

    violation: Violation | None
    steps: list[dict[str, Json]]
    outcomes: list[Outcome | None]
    initial: Json


def replay(
    factory: AdapterFactory,
    found: Found,
    steps: list[Step],
    profile: str,
    disabled: frozenset[str],
) -> Replay:
    """Run ``steps`` on a fresh engine and spec model; stop at the first violation."""
    model = SpecModel(found.model_config)
    initial = model.observe()
    done: list[dict[str, Json]] = []
    outcomes: list[Outcome | None] = []
    adapter = factory(found.engine_config)
    run: EngineRun | None = None
    try:
        run = EngineRun.start(factory, found.model_config, profile, initial, disabled, adapter=adapter)
        for step in steps:
            _, expect = model.do(step)
            done.append({**step, "expect": expect})
            outcomes.append(None)
            outcomes[-1] = run.do(step, expect)
    except Violation as v:
        return Replay(v, done, outcomes, initial)
    except Lost:
        return Replay(None, done, outcomes, initial)
    finally:
        close_adapter(adapter)
    return Replay(None, done, outcomes, initial)


def minimize(
    factory: AdapterFactory, found: Found, profile: str, disabled: frozenset[str], seconds: float
) -> Replay | None:
    """Shrink ``found`` further by replaying edited step lists directly (no Hypothesis overhead):
    drop chunks of steps, then shorten token lists and drop extras, keeping every edit after which
    the same property still fails. Returns the smallest failing replay (``None`` if the failure
    does not reproduce)."""
    deadline = time.perf_counter() + seconds

    def fails(candidate: list[Step]) -> Replay | None:
        r = replay(factory, found, candidate, profile, disabled)
        return r if r.violation is not None and r.violation.prop == found.prop else None

    steps = list(found.steps)
    best = fails(steps)
    if best is None:
        return None
    steps = steps[: len(best.steps)]
    size = max(1, len(steps) // 2)
    while size >= 1 and time.perf_counter() < deadline:
        i = 0
        while i < len(steps) and time.perf_counter() < deadline:
            cand = steps[:i] + steps[i + size :]
            r = fails(cand) if cand else None
            if r is not None:
                steps, best = cand[: len(r.steps)], r
            else:
                i += size
        size //= 2
    for i in range(len(steps)):
        for edit in _simplifications(steps[i]):
            if time.perf_counter() >= deadline:
                break
            cand = steps[:i] + [edit] + steps[i + 1 :]
            r = fails(cand)
            if r is not None:
                steps, best = cand[: len(r.steps)], r
                break
    return best


def _simplifications(step: Step) -> list[Step]:
    """Smaller variants of one step: without extras, with shorter token lists."""
    out: list[Step] = []
    if step.get("extras"):
        out.append({k: v for k, v in step.items() if k != "extras"})
    tokens = step.get("tokens")
    if isinstance(tokens, list) and len(tokens) > 1 and not step.get("extras"):
        out.extend({**step, "tokens": tokens[:n]} for n in range(1, len(tokens)))
    return out


def render_failure(found: Found, result: Replay, profile: str) -> Failure:
    """The readable sequence and the ready-to-save vector of a failing replay."""
    assert result.violation is not None
    v = result.violation
    cfg = found.model_config
    lines = [
        f"  config: block_size={cfg.block_size} num_blocks={cfg.num_blocks} "
        f"free_order={cfg.free_order} dedup_on_full={cfg.dedup_on_full}"
    ]
    for i, (entry, outcome) in enumerate(zip(result.steps, result.outcomes)):
        exp = entry["expect"]
        spec_says = exp["error"] or json.dumps(exp["result"], sort_keys=True)
        engine_says = f"<-- violates {v.prop}" if outcome is None else outcome.describe()
        s = {k: val for k, val in entry.items() if k != "expect"}
        lines.append(
            f"  {i + 1:2d}. {describe_step(s)}\n      engine: {engine_says}\n      spec:   {spec_says}"
        )
    if not result.steps:
        lines.append("  (at creation)")
    case = make_case(
        f"counterexample/{v.prop}",
        f"Found by the stateful runner: [{v.prop}] {v.message}",
        "counterexample",
        profile,
        cfg,
        initial=result.initial,
        steps=result.steps,
    )
    vector: dict[str, Json] = {
        "schema_version": SCHEMA_VERSION,
        "spec_version": spec_version(),
        "group": "counterexamples",
        "description": "Saved counterexample of the stateful conformance runner.",
        "cases": [case],
    }
    return Failure(v.prop, v.message, "\n".join(lines), vector)


_BOOL = st.booleans()
_LORAS = (LoRA("a", 1), LoRA("b", 2), LoRA("x", 0))
_SALTS = ("x", "t2")


@functools.cache
def _lengths(min_size: int, max_size: int) -> st.SearchStrategy[int]:
    return st.sampled_from(range(min_size, max_size + 1))


def _tokens(data: st.DataObject, min_size: int, max_size: int) -> list[int]:
    """Tokens over :data:`ALPHABET` in two draws (a length, then one integer for all the digits):
    far cheaper than a list strategy. Lengths are uniform; digits lean toward runs of the first
    symbol, which share prefixes."""
    n = data.draw(_lengths(min_size, max_size))
    if n == 0:
        return []
    value = data.draw(st.integers(0, len(ALPHABET) ** n - 1))
    out = []
    for _ in range(n):
        value, digit = divmod(value, len(ALPHABET))
        out.append(ALPHABET[digit])
    return out


def _pick(data: st.DataObject, items: Sequence[Any]) -> Any:
    """One of ``items`` (shrinks toward the first); cheaper than a fresh ``sampled_from``."""
    return items[data.draw(st.integers(0, len(items) - 1))]


def _draw_extras(data: st.DataObject, kinds: frozenset[str], n: int) -> Extras | None:
    """Extras over the given kinds for an ``n``-token prompt (most often none)."""
    if not kinds or data.draw(st.integers(0, 3)) != 3:
        return None
    lora = _pick(data, (None, *_LORAS)) if "lora" in kinds else None
    salt = _pick(data, ("", *_SALTS)) if "cache_salt" in kinds else ""
    mm: tuple[MultiModalItem, ...] = ()
    if "mm" in kinds and data.draw(_BOOL):
        start = data.draw(st.integers(0, n - 1))
        mm = (MultiModalItem(_pick(data, ("img-1", "img-2")), start, data.draw(st.integers(1, n - start))),)
    embeds = None
    if "prompt_embeds" in kinds and data.draw(_BOOL):
        embeds = PromptEmbeds((data.draw(st.integers(0, n - 1)),), (_pick(data, (b"\x01", b"\x02")),))
    return Extras(lora, salt, mm, embeds)


INVALID_KINDS = (
    "bad-id",
    "bad-tokens-allocate",
    "bad-tokens-append",
    "bad-tokens-lookup",
    "unknown-append",
    "unknown-free",
    "duplicate-allocate",
    "unknown-fork-parent",
    "duplicate-fork-child",
    "bad-extras",
)
BAD_IDS: tuple[Json, ...] = (True, 1.5, None)
BAD_TOKENS: tuple[Json, ...] = ([], [-1], [2**32], [True], [1.5], "ab")


def make_machine(
    factory: AdapterFactory,
    profile: str,
    disabled: frozenset[str],
    recorder: _Recorder,
    probe: Capabilities,
) -> type[RuleBasedStateMachine]:
    """A state machine class bound to one engine, profile and set of disabled properties."""
    extra_kinds: frozenset[str] = frozenset() if profile == "single-namespace" else frozenset(probe.extras)

    class ConformanceMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.run: EngineRun | None = None
            self.model: SpecModel | None = None
            self.steps: list[dict[str, Json]] = []
            self.outcomes: list[Outcome | None] = []
            self.prompts: list[tuple[list[int], Json]] = []
            self.failed = False
            self.lost = False
            self.initial: Json = None
            self.engine_config: CacheConfig | None = None
            recorder.examples += 1

        # ----- setup and plumbing -------------------------------------------------------

        @initialize(
            block_size=st.sampled_from(BLOCK_SIZES),
            num_blocks=st.sampled_from(POOL_SIZES),
            policy=st.sampled_from(POLICIES),
        )
        def setup(self, block_size: int, num_blocks: int, policy: tuple[str, bool]) -> None:
            config = CacheConfig(block_size, num_blocks, free_order=policy[0], dedup_on_full=policy[1])
            try:
                adapter = factory(config)
            except UnsupportedConfig:
                reject()
            caps = adapter.capabilities
            model_config = config
            if not caps.claims_policy_of(config) and caps.claims_a_spec_policy():
                assert caps.dedup_on_full is not None
                model_config = replace(config, free_order=caps.free_order, dedup_on_full=caps.dedup_on_full)
            self.engine_config = config
            self.model = SpecModel(model_config)
            self.initial = self.model.observe()
            try:
                self.run = EngineRun.start(
                    factory, model_config, profile, self.initial, disabled, adapter=adapter
                )
            except Violation as v:
                self._record(v, None)
                raise
            except Lost:
                self.lost = True
                reject()

        @property
        def B(self) -> int:
            assert self.run is not None
            return int(self.run.config.block_size)

        def live(self) -> list[Json]:
            assert self.run is not None
            return sorted(self.run.judge.live, key=lambda r: (isinstance(r, str), str(r)))

        def caps(self) -> Capabilities:
            assert self.run is not None
            return self.run.caps

        def do(self, step: Step) -> None:
            assert self.run is not None and self.model is not None
            _, expect = self.model.do(step)
            self.steps.append({**step, "expect": expect})
            self.outcomes.append(None)
            try:
                self.outcomes[-1] = self.run.do(step, expect)
            except Violation as v:
                self._record(v, step)
                raise
            except Lost:
                self.lost = True
                reject()
            outcome = self.outcomes[-1]
            if outcome is not None and outcome.ok and step["op"] in ("allocate", "append"):
                assert self.run is not None
                req = self.run.judge.live.get(step["request_id"])
                if req is not None:
                    self.prompts.append((list(req.tokens), step.get("extras")))

        def _record(self, v: Violation, step: Step | None) -> None:
            self.failed = True
            assert self.model is not None and self.engine_config is not None
            raw = [{k: val for k, val in entry.items() if k != "expect"} for entry in self.steps]
            recorder.found = Found(v.prop, self.engine_config, self.model.config, raw)

        # ----- strategies -----------------------------------------------------------------

        def prompt(self, data: st.DataObject, shared: bool) -> tuple[list[int], Json]:
            """Tokens and extras: fresh ones, or (``shared``) a prefix of an earlier request plus a
            short tail, usually with that request's extras (so hits are frequent)."""
            B = self.B
            if not self.prompts or not shared:
                tokens = _tokens(data, 1, 3 * B + 1)
                return tokens, self.extras(data, len(tokens))
            base, base_extras = _pick(data, self.prompts[-8:])
            cut = len(base) - data.draw(st.integers(0, len(base)))
            tokens = (base[:cut] + _tokens(data, 0, B + 1)) or [1]
            if base_extras is not None and not data.draw(_BOOL):
                try:
                    check_extras(extras_from_json(base_extras), len(tokens))
                    return tokens, base_extras
                except PrefixCacheError:
                    pass
            return tokens, self.extras(data, len(tokens))

        def extras(self, data: st.DataObject, n: int) -> Json:
            value = _draw_extras(data, extra_kinds & self.caps().extras, n)
            return None if value is None else extras_to_json(value)

        # ----- rules --------------------------------------------------------------------

        def _allocate(self, data: st.DataObject, shared: bool) -> None:
            live = self.live()
            fresh = [r for r in IDS if r not in live]
            if not fresh:
                if not self.caps().input_errors:
                    return
                fresh = list(IDS)  # every id is live: a DuplicateRequest
            rid = _pick(data, fresh)
            tokens, extras = self.prompt(data, shared)
            step: Step = {"op": "allocate", "request_id": rid, "tokens": tokens}
            if extras:
                step["extras"] = extras
            self.do(step)

        @precondition(lambda self: self.run is not None)
        @rule(data=st.data())
        def allocate(self, data: st.DataObject) -> None:
            self._allocate(data, shared=False)

        @precondition(lambda self: self.run is not None)
        @rule(data=st.data())
        def allocate_shared_prefix(self, data: st.DataObject) -> None:
            self._allocate(data, shared=True)

        @precondition(lambda self: self.run is not None and bool(self.run.judge.live))
        @rule(data=st.data())
        def append(self, data: st.DataObject) -> None:
            rid = _pick(data, self.live())
            self.do({"op": "append", "request_id": rid, "tokens": _tokens(data, 1, self.B + 1)})

        @precondition(lambda self: self.run is not None and self.run.caps.fork and bool(self.run.judge.live))
        @rule(data=st.data())
        def fork(self, data: st.DataObject) -> None:
            """Fork a live request, then (usually) append to the parent or the child.

            Parents whose last block is partial are preferred, and the append follows three times
            in four: that is the write that needs copy-on-write, the rarest situation to reach.
            """
            assert self.run is not None
            live = self.live()
            partial = [r for r in live if len(self.run.judge.live[r].tokens) % self.B]
            parent = _pick(data, partial or live)
            fresh = [r for r in IDS if r not in live]
            if not fresh:
                return
            child = _pick(data, fresh)
            self.do({"op": "fork", "parent_id": parent, "child_id": child})
            if self.run is not None and child in self.run.judge.live and data.draw(st.integers(0, 3)) > 0:
                writer = child if data.draw(_BOOL) else parent
                self.do({"op": "append", "request_id": writer, "tokens": _tokens(data, 1, self.B + 1)})

        @precondition(lambda self: self.run is not None and bool(self.run.judge.live))
        @rule(data=st.data())
        def free(self, data: st.DataObject) -> None:
            self.do({"op": "free", "request_id": _pick(data, self.live())})

        @precondition(lambda self: self.run is not None)
        @rule(data=st.data())
        def lookup_or_reset(self, data: st.DataObject) -> None:
            """Mostly a lookup; one time in four a reset_prefix_cache (when declared)."""
            if self.caps().reset and data.draw(st.integers(0, 3)) == 3:
                self.do({"op": "reset"})
                return
            tokens, extras = self.prompt(data, shared=not data.draw(_BOOL))
            step: Step = {"op": "lookup", "tokens": tokens}
            if extras:
                step["extras"] = extras
            self.do(step)

        @precondition(lambda self: self.run is not None and self.run.caps.input_errors)
        @rule(data=st.data())
        def invalid(self, data: st.DataObject) -> None:
            kind = _pick(data, INVALID_KINDS)
            live = self.live()
            ghost = next((r for r in IDS if r not in live), None)
            step: Step
            if kind == "bad-id":
                step = {"op": "allocate", "request_id": _pick(data, BAD_IDS), "tokens": [1]}
            elif kind == "bad-tokens-allocate":
                step = {
                    "op": "allocate",
                    "request_id": ghost if ghost is not None else "zz",
                    "tokens": _pick(data, BAD_TOKENS),
                }
            elif kind == "bad-tokens-append" and live:
                step = {"op": "append", "request_id": _pick(data, live), "tokens": _pick(data, BAD_TOKENS)}
            elif kind == "bad-tokens-lookup":
                step = {"op": "lookup", "tokens": _pick(data, BAD_TOKENS)}
            elif kind == "unknown-append" and ghost is not None:
                step = {"op": "append", "request_id": ghost, "tokens": [1]}
            elif kind == "unknown-free" and ghost is not None:
                step = {"op": "free", "request_id": ghost}
            elif kind == "duplicate-allocate" and live:
                step = {"op": "allocate", "request_id": _pick(data, live), "tokens": [2, 2]}
            elif kind == "unknown-fork-parent" and ghost is not None and self.caps().fork:
                step = {"op": "fork", "parent_id": ghost, "child_id": "zz"}
            elif kind == "duplicate-fork-child" and len(live) >= 2 and self.caps().fork:
                step = {"op": "fork", "parent_id": live[0], "child_id": live[1]}
            elif kind == "bad-extras" and extra_kinds & self.caps().extras:
                kinds = sorted(extra_kinds & self.caps().extras)
                bad = {
                    "lora": {"lora": {"name": "", "id": 1}},
                    "cache_salt": {"cache_salt": 7},
                    "mm": {"mm_items": [{"identifier": "i", "start": 0, "length": 9}]},
                    "prompt_embeds": {"prompt_embeds": {"positions": [1, 0], "data": ["01", "02"]}},
                }[_pick(data, kinds)]
                step = {
                    "op": "allocate",
                    "request_id": ghost if ghost is not None else "zz",
                    "tokens": [1, 2, 3],
                    "extras": bad,
                }
            else:
                return
            self.do(step)

        @precondition(lambda self: self.run is not None and len(self.run.judge.live) > 1)
        @rule()
        def free_all(self) -> None:
            """Free every live request: the pool must then be whole again."""
            for rid in self.live():
                self.do({"op": "free", "request_id": rid})

        def teardown(self) -> None:
            if self.run is not None:
                self.run.close()

    return ConformanceMachine


@contextlib.contextmanager
def _shrink_deadline(seconds: float | None) -> Iterator[None]:
    """Bound Hypothesis's shrinking time (best effort: it is an internal knob, left alone if absent)."""
    from hypothesis.internal.conjecture import engine

    old = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if seconds is None or old is None:
        yield
        return
    engine.MAX_SHRINKING_SECONDS = seconds  # type: ignore[assignment]
    try:
        yield
    finally:
        engine.MAX_SHRINKING_SECONDS = old


def _base_settings(user: Settings | None, max_examples: int, steps: int) -> Settings:
    if user is not None:
        return Settings(
            user,
            database=None,
            report_multiple_bugs=False,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            verbosity=Verbosity.quiet,
        )
    return Settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        derandomize=False,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        phases=(Phase.generate, Phase.shrink),
    )


def property_skip_reason(name: str, profile: str, caps: Capabilities) -> str | None:
    """Why the stateful run does not check property ``name`` (``None``: it does)."""
    prop = next(p for p in PROPERTIES if p.name == name)
    if name == "block-keys":
        return "checked by the key vectors only"
    if profile_rank(profile) < profile_rank(prop.profile):
        return f"not part of profile {profile}"
    if prop.profile in ("lru", "exact") and not caps.claims_a_spec_policy():
        return f"engine claims free_order={caps.free_order}, dedup_on_full={caps.dedup_on_full}"
    if name == "policy-free-queue" and not caps.free_queue:
        return "capability free_queue not declared"
    if name == "exact-ids" and not caps.exact_ids:
        return "capability exact_ids not declared"
    return None


def run_conformance(
    adapter_factory: AdapterFactory,
    settings: Settings | None = None,
    *,
    profile: str = "exact",
    seed_value: int = 0,
    max_examples: int = 150,
    steps: int = 30,
    time_budget: float | None = None,
    max_failures: int = 4,
    shrink_seconds: float | None = 4.0,
    minimize_seconds: float = 5.0,
    progress: Callable[[int, int], None] | None = None,
    echo: Callable[[str], None] | None = print,
) -> StatefulReport:
    """Run the stateful conformance check of an engine at ``profile``.

    Args:
        adapter_factory: ``config -> adapter``.
        settings: Hypothesis settings to start from (``max_examples``, ``stateful_step_count``
            …); the database is always off and multiple-bug reporting too.
        profile: one of ``single-namespace``, ``core``, ``maximal``, ``lru``, ``exact``.
        seed_value: Hypothesis seed; the same seed gives the same run.
        max_examples, steps: examples per run and operations per example (ignored when
            ``settings`` is given).
        time_budget: seconds after which no new chunk of examples starts.
        max_failures: stop after this many failing properties.
        shrink_seconds: time Hypothesis may shrink each counterexample (``None``: its own limit).
        minimize_seconds: time for the runner's own step-level minimization after that.
        progress: ``progress(done, total)`` after each chunk of examples.
        echo: called with each failure's rendering — the minimal operation sequence and a
            ready-to-save vector (default: printed to stdout; ``None``: silent, the failures are
            in the report either way).
    """
    profile_rank(profile)
    start = time.perf_counter()
    report = StatefulReport(profile, None)
    try:
        probe = adapter_factory(PROBE_CONFIG)
    except UnsupportedConfig as exc:
        report.errors.append(f"the engine rejects the probe config {config_to_json(PROBE_CONFIG)}: {exc}")
        return report
    caps = probe.capabilities
    close_adapter(probe)
    report.capabilities = caps
    base = _base_settings(settings, max_examples, steps)
    total = base.max_examples
    chunk = max(1, min(total, 25))
    disabled: set[str] = set()
    failures: dict[str, Failure] = {}
    examples = 0
    budget_hit = False
    while True:
        recorder = _Recorder()
        machine = make_machine(adapter_factory, profile, frozenset(disabled), recorder, caps)
        done = 0
        found: Found | None = None
        k = 0
        while done < total:
            if time_budget is not None and time.perf_counter() - start > time_budget and done > 0:
                budget_hit = True
                break
            n = min(chunk, total - done)
            seeded: Any = seed(seed_value * 1_000_003 + 7919 * len(disabled) + k)(machine)
            try:
                with _shrink_deadline(shrink_seconds):
                    run_state_machine_as_test(  # type: ignore[no-untyped-call,unused-ignore]
                        seeded, settings=Settings(base, max_examples=n)
                    )
            except Violation:
                found = recorder.found
            except Unsatisfiable:
                report.errors.append("every example was rejected (unsupported configs?)")
            except Flaky as exc:
                report.errors.append(f"the engine behaves non-deterministically: {exc}")
            done += n
            k += 1
            if progress is not None:
                progress(done, total)
            if found is not None or report.errors:
                break
        examples += recorder.examples
        if found is None or report.errors:
            break
        best = minimize(adapter_factory, found, profile, frozenset(disabled), minimize_seconds)
        if best is None:
            report.errors.append(
                f"a failure of {found.prop} did not reproduce on replay (non-deterministic engine?)"
            )
            break
        failure = render_failure(found, best, profile)
        failures[failure.prop] = failure
        if echo is not None:
            echo(failure.render())
        disabled.add(failure.prop)
        if len(failures) >= max_failures or budget_hit:
            break
    for prop in PROPERTIES:
        reason = property_skip_reason(prop.name, profile, caps)
        if prop.name in failures:
            f = failures[prop.name]
            report.properties.append(PropertyResult(prop.name, "fail", f.message, f))
        elif reason is not None:
            report.properties.append(PropertyResult(prop.name, "skip", reason))
        else:
            note = f"{examples} examples"
            if disabled:
                note += f" (examples violating {', '.join(sorted(disabled))} first were discarded)"
            if at_least(profile, prop.profile):
                report.properties.append(PropertyResult(prop.name, "pass", note))
    report.examples = examples
    report.seconds = time.perf_counter() - start
    return report
