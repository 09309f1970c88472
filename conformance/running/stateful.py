"""The stateful runner: random operation sequences on the engine and on the spec, judged step by step.

Each *example* draws a small cache config (a block size and pool size the engine supports, one of
the four spec policies, sometimes a weak hash with ``verify_tokens``), a random subset of the
operation families of :mod:`~pagedprefix.conformance.generation.generate` (swarm testing), then sends
``steps`` operations, each run on the engine and on the spec
(:class:`~pagedprefix.conformance.judging.model.SpecModel`) and judged
(:class:`~pagedprefix.conformance.judging.judge.Judge`). Hypothesis draws every choice, so a seed fixes
the run; its shrinking is off and :mod:`~pagedprefix.conformance.generation.minimize` shrinks instead, by a
replay count, so the same seed gives the same report on any machine.

A run is defined by ``max_examples``, split into chunks of :data:`CHUNK` examples, each chunk
seeded from ``seed``. When a property fails, its counterexample is minimized and the chunk is
run again with that property *disabled* (examples reaching its violation are discarded), so every
failing property gets its own first counterexample and the run still covers every planned
example. The wall-clock ``time_budget`` bounds the whole run: when it runs out, the engine call in
flight is cut (:class:`~pagedprefix.conformance.protocol.watchdog.BudgetSpent`), no new chunk
starts, and the report is marked *incomplete*. An engine call that does not return
(:class:`~pagedprefix.conformance.protocol.watchdog.EngineHung`), or one that exits (``EngineExited``),
ends the run at once.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, reject, seed
from hypothesis import settings as Settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException, Unsatisfiable
from pagedprefix import spec

from ..generation.generate import FAMILIES, Context, Draw, FamilyInfo
from ..generation.minimize import Failure, Found, minimize, model_config_for, render_failure
from ..judging.driver import Outcome, Step
from ..judging.judge import Lost
from ..judging.model import EngineRun, SpecModel, adapter_capabilities, build_adapter
from ..judging.properties import PROPERTIES, Violation, at_least, profile_rank
from ..protocol import AdapterFactory, Capabilities, UnsupportedConfig, close_adapter
from ..protocol.codec import config_to_json
from ..protocol.watchdog import BudgetSpent, EngineLost, budget_seconds, run_budget, time_left

POLICIES: tuple[tuple[str, bool], ...] = (
    ("unhashed_to_head", False),
    ("append_all", False),
    ("unhashed_to_head", True),
    ("append_all", True),
)
BLOCK_SIZES = (2, 1, 3, 4)
POOL_SIZES = (4, 8, 2, 12, 3, 16, 6, 1)
PROBE_BLOCK_SIZES = (4, 16, 2, 1, 8, 32, 64, 128, 256)
PROBE_POOL = 64
CHUNK = 25
MINIMIZE_REPLAYS = 1500
ADMITTING = frozenset({"admit_fresh", "admit_shared", "readmit", "aligned"})


@dataclass
class PropertyResult:
    """``pass``, ``fail`` or ``skip`` for one property of the stateful run."""

    name: str
    status: str
    detail: str = ""
    failure: Failure | None = None


@dataclass
class StatefulReport:
    """Outcome of :func:`run_conformance`.

    ``examples``/``planned``: examples run and planned; ``incomplete``: the time budget stopped the
    run before every planned example ran, or cut a minimization short (a safety stop, not a
    verdict); ``hung``: an engine call
    did not return, or the engine exited (``EngineLost``: the run ended there).
    """

    profile: str
    capabilities: Capabilities | None
    properties: list[PropertyResult] = field(default_factory=list)
    examples: int = 0
    planned: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    stopped: str = ""
    """What stopped the run early (the time budget, and where), or ``""``."""
    hung: EngineLost | None = None
    hybrid_examples: int = 0
    """Examples whose config had hybrid groups (engines declaring ``groups``)."""
    orphans_max: int = 0
    """The most keyed blocks the spec model held stranded at once in those examples (the orphans
    diagnostic of HYBRID.md section 4.3; not a verdict)."""
    found_order: list[str] = field(default_factory=list)
    """Failing properties in the order the run found them (the first is the bug's first symptom)."""

    @property
    def ok(self) -> bool:
        return not self.errors and all(p.status != "fail" for p in self.properties)

    @property
    def incomplete(self) -> bool:
        """The time budget cut the run short (:attr:`stopped` says where)."""
        return bool(self.stopped)

    def failures(self) -> list[Failure]:
        return [p.failure for p in self.properties if p.failure is not None]


# ----- probing the engine -----------------------------------------------------------------------


def probe(factory: AdapterFactory) -> tuple[Capabilities, spec.CacheConfig]:
    """The engine's capabilities, from the first of :data:`PROBE_BLOCK_SIZES` (with
    :data:`PROBE_POOL` blocks) its factory does not reject with ``UnsupportedConfig``.

    Raises ``UnsupportedConfig`` when it rejects them all, a spec error when the factory raises
    one for these valid configs, and an ``engine-errors`` :class:`Violation` for anything else.
    """
    last: UnsupportedConfig | None = None
    for block_size in PROBE_BLOCK_SIZES:
        config = spec.CacheConfig(block_size=block_size, num_blocks=PROBE_POOL)
        try:
            adapter = build_adapter(factory, config)
        except UnsupportedConfig as exc:
            last = exc
            continue
        try:
            return adapter_capabilities(adapter), config
        finally:
            close_adapter(adapter)
    raise last or UnsupportedConfig("no probe config")


HYBRID_SIZE_FAMILIES: tuple[tuple[int, ...], ...] = ((2, 4), (4,), (2, 3, 6), (4, 6), (1, 2, 4), (2,))
"""Block sizes a hybrid example's groups take: families whose gcd and lcm differ from the sizes
themselves, so the fine chain, the hit alignment and the key selection are exercised."""
HYBRID_POOL_SIZES = (12, 24, 8, 40, 16, 6, 64, 4)
TARGETED_POOL_PROMPTS = (16, 8, 32)
"""Pools of the targeted shapes (:data:`HYBRID_SHAPES`), in the blocks of a ``3A + 1``-token prompt
in every group: the shapes need a sibling admitted while the first prompt is still cached."""


HYBRID_SHAPES: tuple[tuple[str, ...], ...] = (
    ("full", "full", "sliding"),
    ("full", "full", "mamba"),
    ("full", "sliding", "full"),
    ("full", "mamba", "full"),
    ("full", "sliding", "mamba"),
    ("sliding", "mamba", "sliding"),
    ("mamba", "sliding"),
    ("full", "mamba"),
    ("full", "sliding"),
    ("chunked", "chunked"),
    ("chunked", "chunked", "chunked"),
)
"""Group kinds of the shapes the public hybrid bug classes need (issue 21 section 2): two full
groups of different block sizes with a group that lowers the hit (vllm-ascend #14283); groups
whose fixpoint takes more than one pass (vLLM PR #31707): three of window kinds, or two chunked
groups of different chunks (a chunked group is valid at every multiple of its chunk, so from the
first group's chunk boundary the second lowers the hit to one of its own, where the first needs
entries of a chunk nothing holds); a full group and a Mamba or sliding group (the junction, vLLM
#45238; the copy source of a moving Mamba state)."""


CHUNK_MULTIPLES: dict[int, list[tuple[int, ...]]] = {
    2: [(2, 3), (3, 2)],
    3: list(itertools.permutations((1, 2, 3))),
}
"""Chunks, in multiples of ``A``, of a targeted shape's two or three chunked groups: different
chunks in every order (the fixpoint class; a chunk of one ``A`` divides every other, so a pair
with one needs no second pass)."""


OPENING = ("boundary_sibling", "boundary_sibling")
"""Families a hybrid example opens with (when its swarm has them): a long prompt, then its sibling
below the replay boundary, a step and a third sighting, while no block has been reused yet (the
judge checks what retention promises only until then)."""


def _targeted_shape(
    draw: Draw, kinds: Sequence[str], families: Sequence[tuple[int, ...]]
) -> list[tuple[str, int]] | None:
    """One of :data:`HYBRID_SHAPES` the engine supports, block sizes from one of ``families`` (a
    shape with two full groups takes a family of two sizes or more when there is one, and gives
    them different sizes); ``None`` when no shape fits the declared kinds."""
    shapes = [s for s in HYBRID_SHAPES if all(k in kinds for k in s)]
    if not shapes:
        return None
    shape = draw.pick(shapes)
    fulls = [i for i, kind in enumerate(shape) if kind == "full"]
    wide = [f for f in families if len(f) >= 2]
    family = draw.pick(wide if len(fulls) >= 2 and wide else families)
    specs = [(kind, draw.pick(family)) for kind in shape]
    if len(fulls) >= 2 and len(family) >= 2:
        first, second = draw.pick([(a, b) for a in family for b in family if a != b])
        specs[fulls[0]], specs[fulls[1]] = ("full", first), ("full", second)
    return specs


def draw_hybrid_config(draw: Draw, caps: Capabilities) -> spec.CacheConfig | None:
    """One to three groups of the kinds the engine declares, one time in three in one of the
    targeted shapes of :data:`HYBRID_SHAPES` (block sizes from one family it supports; chunked
    groups take ``B = A``, windows of a few blocks, chunks of one to three ``A``), a pool, a free
    order, a retention and a group free order. ``None`` when no family of block sizes is
    supported."""
    kinds = [k for k in ("full", "sliding", "chunked", "mamba") if k in caps.groups]
    families = [f for f in HYBRID_SIZE_FAMILIES if all(caps.supports_geometry(b, caps.min_blocks) for b in f)]
    if not kinds or not families:
        return None
    family = draw.pick(families)
    specs = _targeted_shape(draw, kinds, families) if draw.chance(1, 3) else None
    targeted = specs is not None
    if specs is None:
        specs = [(draw.pick(kinds), draw.pick(family)) for _ in range(draw.between(1, 3))]
    align = math.lcm(*(b for _, b in specs))
    num_chunked = sum(kind == "chunked" for kind, _ in specs) if targeted else 0
    multiples = draw.pick(CHUNK_MULTIPLES[num_chunked]) if num_chunked in CHUNK_MULTIPLES else ()
    groups: list[spec.KVCacheGroup] = []
    for kind, b in specs:
        if kind == "sliding":
            groups.append(spec.sliding(draw.between(1, 3 * b + 2), b))
        elif kind == "chunked":
            chunk = multiples[sum(g.kind == "chunked" for g in groups)] if multiples else draw.between(1, 3)
            groups.append(spec.chunked(align * chunk, align))
        else:
            groups.append(spec.KVCacheGroup(kind, b))
    pools = [n for n in HYBRID_POOL_SIZES if all(caps.supports_geometry(g.block_size, n) for g in groups)]
    if targeted:  # room for 8 to 32 prompts: the sibling shapes need them admitted before any reuse
        prompt = sum(-(-(3 * align + 1) // g.block_size) for g in groups)  # a 3A+1-token prompt's blocks
        sized = [k * prompt for k in TARGETED_POOL_PROMPTS]
        pools = [n for n in sized if all(caps.supports_geometry(g.block_size, n) for g in groups)] or pools
    free_order, _ = draw.pick(POLICIES[:2])
    return spec.CacheConfig(
        block_size=spec.hash_granularity(groups),
        num_blocks=draw.pick(pools or [caps.min_blocks + 7]),
        free_order=free_order,
        groups=tuple(groups),
        # a targeted shape keeps replay retention two times in three: its junction exists only there
        retention=draw.pick(("replay", "replay", "dense") if targeted else spec.RETENTIONS),
        group_free_order=draw.pick(spec.GROUP_FREE_ORDERS),
    )


def draw_config(draw: Draw, caps: Capabilities) -> spec.CacheConfig:
    """A small config the engine declares it supports: a block size (the smallest four it
    supports), a pool size, a spec policy, and one time in four (for an engine honouring both) a
    weak hash with ``verify_tokens``, so that colliding keys happen and must be checked. For an
    engine that declares hybrid groups, one example in two is hybrid (:func:`draw_hybrid_config`;
    an engine without groups draws exactly what it drew before groups existed)."""
    if caps.groups and draw.chance(1, 2):
        hybrid = draw_hybrid_config(draw, caps)
        if hybrid is not None:
            return hybrid
    sizes = caps.block_sizes[:4] if caps.block_sizes else BLOCK_SIZES
    pools = [n for n in POOL_SIZES if caps.supports_geometry(sizes[0], n)]
    if not pools:
        low = caps.min_blocks
        pools = [n for n in (low, low + 1, low + 3, low + 7, low + 15) if caps.supports_geometry(sizes[0], n)]
    free_order, dedup = draw.pick(POLICIES)
    weak = caps.weak_hash and caps.verify_tokens and draw.chance(1, 4)
    return spec.CacheConfig(
        block_size=draw.pick(sizes),
        num_blocks=draw.pick(pools),
        hash_algo="weak8" if weak else "sha256",
        free_order=free_order,
        dedup_on_full=dedup,
        verify_tokens=weak,
    )


def available_families(
    caps: Capabilities, extra_kinds: frozenset[str], hybrid: bool = False
) -> list[FamilyInfo]:
    """The families an engine with ``caps`` can be sent (``hybrid``: the example's config has
    hybrid groups, which adds the families that aim at them)."""
    have = {
        "extras": bool(extra_kinds),
        "fork": caps.fork,
        "input_errors": caps.input_errors,
        "groups": hybrid,
    }
    return [f for f in FAMILIES if f.needs is None or have[f.needs]]


def swarm(draw: Draw, families: list[FamilyInfo]) -> list[FamilyInfo]:
    """A random subset (each family two times in three), always with one that admits requests."""
    on = [f for f in families if draw.chance(2, 3)]
    if not any(f.name in ADMITTING for f in on):
        on.append(next(f for f in families if f.name == "admit_shared"))
    return on


# ----- one example ------------------------------------------------------------------------------


@dataclass
class RunSetup:
    """What every example of one run shares."""

    factory: AdapterFactory
    profile: str
    caps: Capabilities
    steps: int
    extra_kinds: frozenset[str]


class _Stop(BaseException):
    """Ends a chunk at the first failing example."""


@dataclass
class _Recorder:
    found: Found | None = None
    hung: EngineLost | None = None
    examples: int = 0
    rejected: int = 0
    hybrid_examples: int = 0
    orphans_max: int = 0


def run_example(data: st.DataObject, setup: RunSetup, disabled: frozenset[str], rec: _Recorder) -> None:
    """One example: draw a config and a swarm, build the engine, send ``setup.steps`` steps.
    Records a violation or a hang in ``rec``; discards (``reject``) an unsupported config or an
    example that reaches a disabled property. Counts the examples that ran to their end."""
    draw = Draw(data)
    config = draw_config(draw, setup.caps)
    steps: list[Step] = []
    try:
        adapter = _build(setup, config, disabled)
        run: EngineRun | None = None
        try:
            caps = adapter_capabilities(adapter)
            model = SpecModel(model_config_for(config, caps))
            run = EngineRun.start(
                setup.factory, model.config, setup.profile, model.observe(), disabled, adapter
            )
            _send(setup, run, model, draw, steps, rec)
            rec.examples += 1
            rec.hybrid_examples += int(model.hybrid)
        except Violation as v:
            rec.found = Found(v.prop, config, model_config_for(config, setup.caps), steps)
        finally:
            close_adapter(adapter)
    except Lost:
        rec.rejected += 1
        reject()
    except EngineLost as hung:
        rec.hung = hung


def _build(setup: RunSetup, config: spec.CacheConfig, disabled: frozenset[str]) -> Any:
    try:
        return build_adapter(setup.factory, config)
    except UnsupportedConfig:
        raise Lost("engine-errors", "unsupported config") from None
    except spec.PrefixCacheError as exc:
        message = (
            f"the factory raised {type(exc).__name__} for the valid config {config_to_json(config)}: {exc}"
        )
        if "engine-errors" in disabled:
            raise Lost("engine-errors", message) from None
        raise Violation("engine-errors", message) from None
    except Violation as v:
        if v.prop in disabled:
            raise Lost(v.prop, v.message) from None
        raise


def _send(
    setup: RunSetup, run: EngineRun, model: SpecModel, draw: Draw, steps: list[Step], rec: _Recorder
) -> None:
    def do(step: Step) -> Outcome | None:
        _, expect = model.do(step)
        rec.orphans_max = max(rec.orphans_max, int(expect.get("orphans", 0)))
        steps.append(step)
        return run.do(step, expect)

    caps = run.caps
    spell = run.adapter.spell_extras if caps.spells_extras else None  # type: ignore[attr-defined]
    config = run.config
    hybrid = spec.is_hybrid(config.groups, config.block_size)
    ctx = Context(
        # hybrid prompts are measured in the hit alignment A (hits land on its multiples)
        block_size=spec.hit_alignment(config.groups) if hybrid and config.groups else config.block_size,
        num_blocks=run.config.num_blocks,
        caps=caps,
        extra_kinds=setup.extra_kinds & caps.extras,
        may_lookup=run.sends_lookups,
        do=do,
        live_requests=lambda: run.judge.live,  # type: ignore[arg-type, return-value]
        spell=spell,
        chunk=max((g.chunk for g in config.groups or () if g.kind == "chunked"), default=0),
    )
    families = swarm(draw, available_families(caps, ctx.extra_kinds, hybrid))
    weighted = [f for f in families for _ in range(f.weight)]
    opening = [f for name in OPENING for f in families if f.name == name] if hybrid else []
    for family in opening:  # before any pressure: the promises retention makes are judged only then
        family.run(ctx, draw)
    idle = 0
    while len(steps) < setup.steps and idle < 8:
        before = len(steps)
        draw.pick(weighted).run(ctx, draw)
        idle = idle + 1 if len(steps) == before else 0


# ----- the run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_hypothesis() -> Iterator[None]:
    """Make the run depend only on the seed and the engine: no constants harvested from local
    source files (Hypothesis's local-constants feature would read the adapter's own source), and
    Hypothesis's storage directory in a private temporary folder, so nothing is written to the
    working directory. Both are Hypothesis internals (the package pins a Hypothesis range)."""
    from hypothesis import configuration
    from hypothesis.internal.conjecture import providers

    provider = providers.HypothesisProvider
    original = provider.__dict__.get("_maybe_draw_constant")
    with tempfile.TemporaryDirectory(prefix="pagedprefix-hypothesis-") as home:
        configuration.set_hypothesis_home_dir(home)
        if original is not None:
            provider._maybe_draw_constant = lambda self, *a, **k: None  # type: ignore[method-assign]
        try:
            yield
        finally:
            if original is not None:
                provider._maybe_draw_constant = original  # type: ignore[method-assign]
            configuration.set_hypothesis_home_dir(None)


def _settings(user: Settings | None, examples: int) -> Settings:
    base = user if user is not None else Settings()
    return Settings(
        base,
        max_examples=examples,
        database=None,
        deadline=None,
        derandomize=False,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
        phases=(Phase.generate,),
    )


def run_chunk(
    setup: RunSetup, disabled: frozenset[str], settings: Settings, chunk_seed: int, rec: _Recorder
) -> None:
    """Run one chunk of examples; the first recorded failure or hang ends it at once. (It is
    ended by a ``BaseException``, which Hypothesis passes through without replaying the example:
    the minimizer replays it, on its own budget.)"""

    @seed(chunk_seed)
    @settings
    @given(st.data())
    def examples(data: st.DataObject) -> None:
        run_example(data, setup, disabled, rec)
        if rec.found is not None or rec.hung is not None:
            raise _Stop

    try:
        examples()
    except (Unsatisfiable, _Stop):
        pass
    except HypothesisException:
        # A stop that depends on the clock (a hang, the time budget) can end an example earlier
        # than an earlier one with the same choices ran: Hypothesis calls that flaky. The stop is
        # recorded; what Hypothesis makes of it is not a verdict.
        if rec.hung is None:
            raise


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
    if prop.needs == "groups" and not caps.groups:
        return "capability groups not declared (no hybrid configs)"
    if prop.needs == "events" and not caps.events:
        return "capability events not declared"
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
    minimize_replays: int = MINIMIZE_REPLAYS,
    progress: Callable[[int, int], None] | None = None,
    echo: Callable[[str], None] | None = print,
) -> StatefulReport:
    """Run the stateful conformance check of an engine at ``profile``.

    Args:
        adapter_factory: ``config -> adapter``.
        settings: Hypothesis settings to start from; ``max_examples``, the database (none),
            shrinking (off: :mod:`~pagedprefix.conformance.generation.minimize` shrinks) and health checks
            are always set by the runner.
        profile: one of ``single-namespace``, ``core``, ``maximal``, ``lru``, ``exact``.
        seed_value: the seed; the same seed and engine behaviour give the same report.
        max_examples, steps: examples in the run and operations per example.
        time_budget: seconds the whole run may take (with any budget the caller set,
            :func:`~pagedprefix.conformance.protocol.watchdog.run_budget`): when it runs out the
            engine call in flight is cut, a minimization in progress keeps its smallest failure so
            far, and the report is ``incomplete``.
        max_failures: stop after this many failing properties.
        minimize_replays: replays the minimizer may spend on each counterexample.
        progress: ``progress(done, total)`` after each chunk of examples.
        echo: called with each failure's rendering (default: printed; ``None``: silent).

    Raises ``ValueError`` for an unknown profile.
    """
    profile_rank(profile)
    start = time.perf_counter()
    report = StatefulReport(profile, None, planned=max_examples)
    with quiet_hypothesis(), run_budget(time_budget):
        try:
            caps, _ = probe(adapter_factory)
        except UnsupportedConfig as exc:
            report.errors.append(
                f"the engine rejects every probe config (block sizes {PROBE_BLOCK_SIZES}): {exc}"
            )
            return report
        except (Violation, spec.PrefixCacheError) as exc:
            report.errors.append(f"cannot build the engine: {exc}")
            return report
        except BudgetSpent as spent:
            report.stopped = str(spent)
            return report
        except EngineLost as hung:
            report.hung = hung
            report.errors.append(str(hung))
            return report
        report.capabilities = caps
        kinds = frozenset() if profile == "single-namespace" else frozenset(caps.extras)
        setup = RunSetup(adapter_factory, profile, caps, steps, kinds)
        failures = _run_chunks(
            setup,
            report,
            settings,
            seed_value,
            progress,
            max_failures,
            minimize_replays,
            echo,
        )
    _fill_properties(report, caps, failures)
    report.seconds = time.perf_counter() - start
    return report


def _run_chunks(
    setup: RunSetup,
    report: StatefulReport,
    settings: Settings | None,
    seed_value: int,
    progress: Callable[[int, int], None] | None,
    max_failures: int,
    minimize_replays: int,
    echo: Callable[[str], None] | None,
) -> dict[str, Failure]:
    """The chunks of one run (module docstring); returns the failure of each failing property."""
    total = report.planned
    disabled: set[str] = set()
    failures: dict[str, Failure] = {}
    done = chunk = 0
    while done < total:
        left = time_left()
        if left is not None and left <= 0:
            report.stopped = str(BudgetSpent("", budget_seconds())) + " between examples"
            break
        n = min(CHUNK, total - done)
        rec = _Recorder()
        run_chunk(setup, frozenset(disabled), _settings(settings, n), seed_value * 1_000_003 + chunk, rec)
        if isinstance(rec.hung, BudgetSpent):  # the user's budget, not the engine: incomplete
            report.stopped = str(rec.hung)
            report.examples += rec.examples
            break
        if rec.hung is not None:
            report.hung = rec.hung
            failures["engine-errors"] = _hung_failure(rec.hung, setup.profile)
            report.found_order.append("engine-errors")
            report.examples += rec.examples
            break
        report.hybrid_examples += rec.hybrid_examples
        report.orphans_max = max(report.orphans_max, rec.orphans_max)
        if rec.found is None:
            report.examples += rec.examples
            done += n
            chunk += 1
            if progress is not None:
                progress(done, total)
            continue
        failure = _minimized(setup, rec.found, frozenset(disabled), minimize_replays, report)
        if failure is None:
            break
        failures[failure.prop] = failure
        report.found_order.append(failure.prop)
        if echo is not None:
            echo(failure.render())
        disabled.add(failure.prop)
        if len(failures) >= max_failures:
            break
    return failures


def _minimized(
    setup: RunSetup, found: Found, disabled: frozenset[str], replays: int, report: StatefulReport
) -> Failure | None:
    if found.prop in disabled:  # cannot happen: every violation goes through the judge
        report.errors.append(f"internal: {found.prop} failed while disabled")
        return None
    try:
        best = minimize(setup.factory, found, setup.profile, disabled, setup.caps, replays)
    except BudgetSpent as spent:  # it failed, but no replay of it finished in time
        report.stopped = str(spent)
        why = f"an example violated it; {spent} before the example could be replayed and shown"
        return Failure(found.prop, why, "  (not replayed: the time budget ran out)", {})
    except EngineLost as hung:
        report.hung = hung
        return _hung_failure(hung, setup.profile)
    if best is not None and best.cut_short:
        report.stopped = best.cut_short
        failure = render_failure(best, setup.profile)
        note = f"(not fully minimized: {best.cut_short})"
        return replace(failure, detail=f"{failure.detail}\n\n{note}".strip())
    if best is None:
        report.errors.append(
            f"a failure of {found.prop} did not reproduce on replay (non-deterministic engine?)"
        )
        return None
    return render_failure(best, setup.profile)


def _hung_failure(hung: EngineLost, profile: str) -> Failure:
    return Failure(
        "engine-errors", str(hung), "  (the run ended here: the engine's state is unknown)", {}, hung.detail
    )


def _fill_properties(report: StatefulReport, caps: Capabilities, failures: dict[str, Failure]) -> None:
    disabled = sorted(failures)
    for prop in PROPERTIES:
        reason = property_skip_reason(prop.name, report.profile, caps)
        if prop.name in failures:
            f = failures[prop.name]
            report.properties.append(PropertyResult(prop.name, "fail", f.message, f))
        elif reason is not None:
            report.properties.append(PropertyResult(prop.name, "skip", reason))
        elif at_least(report.profile, prop.profile):
            note = f"{report.examples} examples"
            if report.incomplete:
                note += f" of {report.planned} planned (time budget reached)"
            if disabled:
                note += f" (examples violating {', '.join(disabled)} first were discarded)"
            status = "pass" if report.hung is None and report.examples > 0 else "skip"
            if report.hung is not None:
                note = f"not checked to the end: {report.hung}"
            elif report.examples == 0:
                note = "not judged: no example ran to its end"
            report.properties.append(PropertyResult(prop.name, status, note))
