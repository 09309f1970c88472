"""No false positives: engines of other shapes that are correct must pass.

Each engine is the README's minimal adapter (``conformance/README.md``, executed as written)
changed to one shape SEMANTICS.md section 6 allows: it rewrites a live request's table after
``step()`` (SGLang canonicalizes its duplicates), supports only some block and pool sizes,
has no lookup, has a lookup that refreshes LRU order, or publishes prompt blocks at ``step()``
and decoded blocks only when the request is freed. Each passes the default run at the strongest
profile it can claim; a variant that breaks its own claim is caught (so the pass is not vacuous).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pagedprefix.conformance import UnsupportedConfig
from pagedprefix.conformance.running.suite import SuiteOptions, SuiteReport, run_suite
from test_conformance_runner import readme_engine

Tiny: Any = readme_engine()


def failures(report: SuiteReport) -> dict[str, str]:
    return {r.name: f"{r.detail}\n{r.counterexample}" for r in report.rows if r.status == "fail"}


def passes(engine: Any, profile: str = "maximal", **options: Any) -> SuiteReport:
    report = run_suite(engine, SuiteOptions(profile=profile, **options))
    assert report.ok, failures(report)
    return report


class Rewriting(Tiny):  # type: ignore[misc, valid-type]
    """Keeps a request's duplicate of a cached block privately at admission or decode, and at
    ``step()`` swaps it for the cached block with the same content (freeing its own)."""

    def step(self) -> None:
        for tokens, table in self.reqs.values():
            for i in range(len(tokens) // self.B):
                cached = self.index.get(tuple(tokens[: (i + 1) * self.B]))
                own = table[i]
                if cached is None or cached == own or own in self.key:
                    continue
                if self.refs[cached] == 0:
                    self.lru.remove(cached)
                self.refs[cached] += 1
                table[i] = cached
                self.refs[own] -= 1
                if self.refs[own] == 0:
                    self.lru.insert(0, own)


def test_an_engine_that_rewrites_tables_after_step_passes() -> None:
    report = passes(Rewriting)
    rows = {r.name: r.status for r in report.rows}
    assert rows["accounting"] == rows["held-blocks"] == rows["maximal-hits"] == "pass"


class RewritingWrongly(Rewriting):
    """Swaps in the cached block of the *previous* prefix: other content."""

    def step(self) -> None:
        for tokens, table in self.reqs.values():
            for i in range(1, len(tokens) // self.B):
                cached = self.index.get(tuple(tokens[: i * self.B]))
                if cached is not None and cached not in table and table[i] not in self.key:
                    if self.refs[cached] == 0:
                        self.lru.remove(cached)
                    self.refs[cached] += 1
                    self.refs[table[i]] -= 1
                    if self.refs[table[i]] == 0:
                        self.lru.insert(0, table[i])
                    table[i] = cached


def test_a_rewrite_to_other_content_is_caught() -> None:
    report = run_suite(RewritingWrongly, SuiteOptions(profile="maximal"))
    assert set(failures(report)) & {"held-blocks", "accounting"}


class SixteenOrThirtyTwo(Tiny):  # type: ignore[misc, valid-type]
    """Supports block sizes 16 and 32 only, and pools of at least 4 blocks."""

    capabilities = replace(Tiny.capabilities, block_sizes=(16, 32), min_blocks=4)

    def __init__(self, config: Any) -> None:
        if config.block_size not in (16, 32) or config.num_blocks < 4:
            raise UnsupportedConfig(f"block_size {config.block_size}, num_blocks {config.num_blocks}")
        super().__init__(config)


def test_an_engine_with_restricted_block_and_pool_sizes_passes() -> None:
    report = passes(SixteenOrThirtyTwo)
    assert report.stateful is not None and report.stateful.examples > 0
    assert any("not among the declared sizes" in reason for _, reason in report.never_ran())


class NoLookup(Tiny):  # type: ignore[misc, valid-type]
    """Has no side-effect-free lookup (declared): the suite must never call it."""

    capabilities = replace(Tiny.capabilities, lookup=False)

    def lookup(self, tokens: Any, extras: Any = None) -> int:
        raise AssertionError("lookup must not be called")


def test_an_engine_without_lookup_passes() -> None:
    passes(NoLookup)


class RefreshingLookup(Tiny):  # type: ignore[misc, valid-type]
    """``lookup`` moves the blocks it would hit to the back of the reuse order (LRU refresh)."""

    capabilities = replace(Tiny.capabilities, lookup_is_pure=False)

    def lookup(self, tokens: Any, extras: Any = None) -> int:
        hits = self._hits(tokens)
        for b in hits:
            if b in self.lru:
                self.lru.remove(b)
                self.lru.append(b)
        return len(hits) * self.B


def test_an_engine_with_an_impure_lookup_passes() -> None:
    passes(RefreshingLookup)


class PublishesLate(Tiny):  # type: ignore[misc, valid-type]
    """Publishes a prompt's blocks at ``step()`` (after compute) and decoded blocks only when
    the request is freed (SGLang), as declared."""

    capabilities = replace(Tiny.capabilities, publish="step", publish_decode="free")

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.pending: list[tuple[list[int], list[int]]] = []
        self.prompt_len: dict[Any, int] = {}

    def allocate(self, request_id: Any, tokens: Any, extras: Any = None) -> Any:
        self.prompt_len[request_id] = len(tokens)
        return super().allocate(request_id, tokens, extras)

    def _publish(self, tokens: list[int], table: list[int]) -> None:
        """Called by allocate and append: remember the prompt part for the next step."""
        prompt = [rid for rid, (t, tab) in self.reqs.items() if tab is table]
        n = self.prompt_len.get(prompt[0], len(tokens)) if prompt else len(tokens)
        self.pending.append((list(tokens[:n]), list(table)))

    def step(self) -> None:
        for tokens, table in self.pending:
            Tiny._publish(self, tokens, table)
        self.pending.clear()

    def free(self, request_id: Any) -> None:
        tokens, table = self.reqs[request_id]
        Tiny._publish(self, tokens, table)
        self.prompt_len.pop(request_id, None)
        super().free(request_id)


def test_an_engine_publishing_decode_only_at_free_passes_maximal() -> None:
    report = passes(PublishesLate)
    assert {r.name: r.status for r in report.rows}["maximal-hits"] == "pass"


def test_the_same_engine_claiming_publication_at_append_is_caught() -> None:
    class Overclaiming(PublishesLate):
        capabilities = replace(PublishesLate.capabilities, publish_decode="append")

    report = run_suite(Overclaiming, SuiteOptions(profile="maximal"))
    assert "maximal-hits" in failures(report)


@pytest.mark.parametrize("engine", [Rewriting, SixteenOrThirtyTwo, NoLookup, RefreshingLookup, PublishesLate])
def test_shapes_pass_core_under_another_seed(engine: Any) -> None:
    passes(engine, "core", seed=3, max_examples=200, builtin_vectors=False)
