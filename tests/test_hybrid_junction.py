"""SEMANTICS.md section 8's corrected rules: the junction (the own hit of the group vLLM 0.33.0
looks up first), release batches of checkpoints, and the fork of a Mamba copy source — in the
spec, the impl, the vectors and the hybrid judge. (vLLM itself: ``tests/test_engines_vllm.py``.)"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from pagedprefix.conformance.generation._hybrid_scenarios import (
    T,
    fork_copy_source,
    no_full_junction,
    two_full_sizes,
)
from pagedprefix.conformance.protocol import AdapterFactory, PrefixCacheAdapter
from pagedprefix.conformance.protocol.adapters import SpecShapedAdapter, impl, spec, spec_capabilities
from pagedprefix.conformance.protocol.codec import config_from_json
from pagedprefix.conformance.running.vectors import run_case
from pagedprefix.impl.hybrid import HybridBlockManager
from pagedprefix.spec import (
    CacheConfig,
    ForkResult,
    HybridAllocation,
    HybridSpecCache,
    KVCacheGroup,
    RequestId,
    chunked,
    full,
    hash_granularity,
    mamba,
    sliding,
)
from pagedprefix.spec.groups import first_lookup_class


def _config(groups: tuple[KVCacheGroup, ...], num_blocks: int) -> CacheConfig:
    return CacheConfig(hash_granularity(groups), num_blocks, groups=groups)


def _case(cases: list[dict[str, object]], name: str) -> dict[str, object]:
    [case] = [c for c in cases if c["id"] == f"hybrid/{name}"]
    return case


@pytest.mark.parametrize(
    ("groups", "want"),
    [
        ((full(4), sliding(8, 4)), [0]),
        ((sliding(8, 4), full(8), full(4)), [1]),  # the first full group, not the first group
        ((sliding(8, 4), mamba(4)), [0]),  # no full group: group 0
        ((mamba(4), sliding(8, 4), full(4), full(4)), [2, 3]),  # equal specs are one lookup class
        ((sliding(8, 4), sliding(4, 4), sliding(8, 4)), [0, 2]),
        ((chunked(8, 4), sliding(8, 4)), [0]),
    ],
)
def test_first_lookup_class(groups: tuple[KVCacheGroup, ...], want: list[int]) -> None:
    assert first_lookup_class(groups) == want


@pytest.mark.parametrize("cls", [HybridSpecCache, HybridBlockManager], ids=["spec", "impl"])
def test_no_full_junction_is_the_chunk_start(cls: type[HybridSpecCache] | type[HybridBlockManager]) -> None:
    """chunked(8,4)+sliding(8,4): nothing is cached, yet the chunked group (looked up first) hits 16
    on a fresh 22-token prompt, so L = 0 and the junction is 16: the SWA group keys its tails at 16
    and at the replay boundary 20 (entries 2, 3, 4), and a sibling sharing 17 tokens hits 16. The
    old full-only rule recorded no junction: tails {3, 4} only, and the sibling hit 0."""
    cache = cls.create(_config((chunked(8, 4), sliding(8, 4)), 40))
    first = cache.allocate("a", T[:22])
    assert isinstance(first, HybridAllocation) and first.num_computed_tokens == 0
    sibling = T[:17] + [9] * 5
    assert cache.lookup(sibling) == 16
    second = cache.allocate("b", sibling)
    assert isinstance(second, HybridAllocation)
    assert second.num_computed_tokens == 16
    assert second.block_tables[0][:4] == (None, None, None, None)  # chunked: nothing before the chunk
    assert second.block_tables[1][2:4] == first.block_tables[1][2:4]  # the junction's tail, shared


def test_no_full_junction_keys_the_window_there() -> None:
    """The tails keyed after the fresh 22-token admission above, read from the spec's index: the
    junction's (16: entries 2, 3) and the replay boundary's (20: entries 3, 4)."""
    cache = HybridSpecCache.create(_config((chunked(8, 4), sliding(8, 4)), 40))
    cache.allocate("a", T[:22])
    keys = cache.group_keys(T[:22])[1]
    assert [j for j, k in enumerate(keys) if k in cache.cached] == [2, 3, 4]


@pytest.mark.parametrize("cls", [HybridSpecCache, HybridBlockManager], ids=["spec", "impl"])
def test_no_full_junction_retains_the_mamba_state(
    cls: type[HybridSpecCache] | type[HybridBlockManager],
) -> None:
    """sliding(8,4)+mamba(4): with A's state at 20 evicted, sibling B (29 tokens) gets L = 0, but the
    sliding group's own hit is 20: B's junction keeps its state there (checkpoints at 20 and at its
    replay boundary 28, released as one batch, newest first, to the tail), and after new_step C
    sharing 20 tokens hits 20. Under the old rule B kept only 28 and C hit 0."""
    [_, case] = no_full_junction()
    steps = case["steps"]
    assert isinstance(steps, list)
    [b_step] = [s for s in steps if s.get("request_id") == "B" and s["op"] == "allocate"]
    cache = cls.create(config_from_json(case["config"]))
    assert cache.groups == (sliding(8, 4), mamba(4))
    for step in steps:  # drive the case's steps; the checks are on B and C
        op = step["op"]
        if op == "allocate":
            result = cache.allocate(step["request_id"], step["tokens"])
        elif op == "free":
            cache.free(step["request_id"])
        elif op == "new_step":
            cache.new_step()
        elif op == "lookup":
            continue
        if step is b_step:
            assert isinstance(result, HybridAllocation) and result.num_computed_tokens == 0
            assert [cp[:2] for cp in result.checkpoints] == [(1, 20), (1, 28)]
            newest_first = [cp[2] for cp in sorted(result.checkpoints, key=lambda cp: -cp[1])]
            assert list(cache.free_blocks()[-2:]) == newest_first
    assert isinstance(result, HybridAllocation) and result.num_computed_tokens == 20  # C


@pytest.mark.parametrize("cls", [HybridSpecCache, HybridBlockManager], ids=["spec", "impl"])
def test_two_full_groups_junction_is_the_first_alone(
    cls: type[HybridSpecCache] | type[HybridBlockManager],
) -> None:
    """full(4)+full(8)+sliding(8,4) with full(8)'s entry 2 evicted: a 49-token resend hits L = 16
    (full(8) and the live 17-token request's SWA tail), every full table truncated to 16; its
    junction is full(4)'s own hit 40 — not the joint 16 of the full groups, which is no junction —
    so a request sharing 41 tokens hits 40 (the joint rule: 16)."""
    [case] = two_full_sizes()
    config = config_from_json(case["config"])
    assert config.groups == (full(4), full(8), sliding(8, 4)) and config.group_free_order == "reversed_concat"
    cache = cls.create(config)
    steps = case["steps"]
    assert isinstance(steps, list)
    tables = {}
    for step in steps:
        if step["op"] == "allocate":
            result = cache.allocate(step["request_id"], step["tokens"])
            assert isinstance(result, HybridAllocation)
            tables[step["request_id"]] = result.block_tables
            if step["request_id"] == "b":
                assert result.num_computed_tokens == 16
                full4, full8, _ = result.block_tables
                assert full4[:4] == tables["s"][0][:4] and full8[:2] == tables["s"][1][:2]  # the hit
                # truncated: full(4)'s cached entries 4-9 (a's blocks, still keyed) are not reused
                assert not set(full4[4:]) & set(tables["a"][0][4:10])
        elif step["op"] == "free":
            cache.free(step["request_id"])
    assert isinstance(result, HybridAllocation) and result.num_computed_tokens == 40  # c


def test_new_vectors_pass_on_the_correct_engines() -> None:
    cases = [*no_full_junction(), *two_full_sizes(), *fork_copy_source()]
    assert len(cases) == 4
    for factory in (spec, impl):
        for case in cases:
            result = run_case(factory, case, str(case["profile"]), "hybrid")
            assert result.status == "pass", (case["id"], result)


class FullOnlyJunction(HybridSpecCache):
    """The rule before the correction: the junction is the full groups' joint hit, none without a
    full group. Sound; keeps less than replay retention promises on a no-full config."""

    def _junction(self, fine: Sequence[bytes], num_tokens: int, hit: int) -> int | None:
        fulls = [g for g, group in enumerate(self.groups) if group.kind == "full"]
        if self.config.retention != "replay" or not fulls:
            return None
        longest = self._longest_valid(fine, num_tokens, fulls)
        return longest if longest > hit else None


class ForkLeavesCopySource(HybridSpecCache):
    """fork that does not share the parent's Mamba copy source (the child's entry is ``None``):
    sound, and what ``core``/``maximal`` accept; not the spec's ``exact`` choice."""

    def fork(self, parent_id: RequestId, child_id: RequestId) -> ForkResult:
        result = super().fork(parent_id, child_id)
        child = self.requests[child_id]
        for g, group in enumerate(self.groups):
            if group.kind == "mamba":
                table = child.tables[g]
                for j, b in enumerate(table[:-1]):
                    if b is not None:
                        table[j] = None
                        self._release(b)
        return result


def _factory(cls: type[HybridSpecCache]) -> AdapterFactory:
    def factory(config: CacheConfig) -> PrefixCacheAdapter:
        return SpecShapedAdapter(cls.create(config), spec_capabilities(config))  # type: ignore[arg-type]

    return factory


def test_judge_promises_the_no_full_junction() -> None:
    """The hybrid judge's retention-adequacy bound knows the no-full junction (chunked group first,
    no block ever reused): the old rule's sibling hit 0 fails ``maximal`` with that property, before
    any comparison of hits with the spec; ``core`` accepts it (it is sound)."""
    case = _case(no_full_junction(), "junction/no-full/chunk-start")
    factory = _factory(FullOnlyJunction)
    maximal = run_case(factory, case, "maximal", "hybrid")
    assert (maximal.status, maximal.prop) == ("fail", "retention-adequacy"), maximal
    assert "promises 16" in maximal.message
    assert run_case(factory, case, "core", "hybrid").status == "pass"


def test_fork_leaving_the_copy_source_out_is_exact_only() -> None:
    """The fork rule: the spec shares the Mamba copy source (``exact`` compares tables and fails a
    child without it, with policy-sharing); ``core`` and ``maximal`` accept that child."""
    [case] = fork_copy_source()
    factory = _factory(ForkLeavesCopySource)
    exact = run_case(factory, case, "exact", "hybrid")
    assert (exact.status, exact.prop) == ("fail", "policy-sharing"), exact
    for profile in ("core", "maximal"):
        assert run_case(factory, case, profile, "hybrid").status == "pass", profile
