"""SGLang 0.5.23's own RadixCache / UnifiedRadixCache through pagedprefix.conformance.engines.sglang.

Skipped, with the reason, unless Python >= 3.11 and the SGLang wheel (installed ``--no-deps``) and
the few modules it needs on a CPU are there (``conformance/engines/README.md``). Otherwise a short
suite runs and the verdict rows are asserted, known suite false positives included (see below).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import types
from array import array
from typing import Any

import pytest
from engine_support import check_loaded, engine_adapters, skip_unless_available
from pagedprefix.conformance.engines.sglang import unavailable_reason
from pagedprefix.conformance.protocol.channels import channels_of, unreached
from pagedprefix.conformance.running.suite import SuiteOptions, run_suite
from pagedprefix.spec import CacheConfig, Extras, LoRA, OutOfBlocks

pytestmark = skip_unless_available(unavailable_reason())


def _sglang() -> types.ModuleType:
    return engine_adapters("sglang")


def test_loads_sglang_own_modules() -> None:
    check_loaded("sglang", "0.5.23", "sglang.srt.mem_cache.radix_cache", "mem_cache/radix_cache.py")


def test_req_concatenates_extra_key_and_lora_id() -> None:
    """SGLang's own Req.__init__ runs: the radix key's extra_key is the LoRA id string itself."""
    engine = _sglang()
    adapter = engine.sglang(CacheConfig(block_size=2, num_blocks=4))
    req = adapter._req("r", [1, 2, 3], Extras(lora=LoRA("x", 7)))
    spelled = adapter.spell_extras(Extras(lora=LoRA("x", 7)))["lora"]
    assert len(spelled) == 32 and req.extra_key == spelled == req.lora_id


def test_unified_extra_key_variant_drives_the_unified_tree_with_the_salt_as_extra_key() -> None:
    adapter = _sglang().sglang_unified_extra_key(CacheConfig(block_size=2, num_blocks=4))
    assert (adapter.tree_kind, adapter.salt_as) == ("unified", "extra_key")
    assert type(adapter.tree).__name__ == "UnifiedRadixCache"


@pytest.mark.parametrize("factory", ["sglang", "sglang_unified"])
def test_operations_map_onto_sglang(factory: str) -> None:
    adapter = getattr(_sglang(), factory)(CacheConfig(block_size=2, num_blocks=4))
    first = adapter.allocate("a", [1, 2, 3, 4, 5])
    assert first.num_computed_tokens == 0 and first.block_table == (0, 1, 2)  # page 0 mapped away
    adapter.step()  # publication (checkpoint_kv_cache)
    second = adapter.allocate(1, [1, 2, 3, 4, 6])
    adapter.step()
    assert second.num_computed_tokens == 4 and second.block_table[:2] == (0, 1)
    assert adapter.num_free_blocks() == 0
    assert adapter.lookup([1, 2, 3, 4, 9]) == 4
    assert adapter.lookup([1, 2, 3, 4, 9], Extras(cache_salt="t")) == 0
    with pytest.raises(OutOfBlocks):
        adapter.append(1, [7, 8])
    assert adapter.block_table(1) == second.block_table
    adapter.free("a")
    adapter.free(1)
    assert adapter.num_free_blocks() == 4
    assert adapter.reset_prefix_cache() is True and adapter.lookup([1, 2, 3, 4, 9]) == 0


@pytest.mark.parametrize("factory", ["sglang", "sglang_unified"])
def test_suite_verdicts(factory: str) -> None:
    """SGLang's own tree passes maximal: its table rewrites at publication (step()) and its
    decode KV published at finish are accepted as SEMANTICS.md section 6 allows."""
    engine = _sglang()
    options = SuiteOptions(profile="maximal", max_examples=60)
    report = run_suite(getattr(engine, factory), options, engine_name=factory, extra_groups=[])
    assert report.errors == [] and report.exit_code == 0, [r for r in report.rows if r.status == "fail"]
    # every channel the adapter declares driven was reached by this run's requests (issue 22)
    assert unreached(channels_of(getattr(engine, factory)), report.reached) == [], report.reached
    properties = {r.name: r.status for r in report.rows if r.kind == "property"}
    for name in (
        "held-blocks",
        "hit-content",
        "accounting",
        "atomic-failure",
        "hit-cap",
        "progress",
        "maximal-hits",
    ):
        assert properties[name] == "pass", (name, properties)
    assert report.vectors is not None and report.vectors.by_status("fail") == []
    rows = {r.name: r for r in report.rows}
    assert rows["vectors: eviction"].status == "pass"
    assert rows["vectors: extras"].status == "pass"


def _root_keys(adapter: object) -> set[object]:
    return set(adapter.tree.root_node.children)  # type: ignore[attr-defined]


def test_extra_key_variant_reaches_its_driven_channels() -> None:
    """The ``sglang-extra-key`` rows send salts through ``extra_key`` and LoRAs through ``lora_id``:
    a short run reaches both (its verdict is in docs/MATRIX.md), and ``cache_salt`` is declared
    not driven there."""
    engine = _sglang()
    report = run_suite(engine.sglang_extra_key, SuiteOptions(profile="core", max_examples=30),
                       engine_name="sglang-extra-key", extra_groups=[])
    declared = {c.name: c for c in channels_of(engine.sglang_extra_key)}
    assert declared["extra_key"].driven and declared["extra_key"].spec_extra_kind == "cache_salt"
    assert not declared["cache_salt"].driven
    assert report.reached.get("cache_salt", 0) > 0 and report.reached.get("lora", 0) > 0
    assert unreached(tuple(declared.values()), report.reached) == [], report.reached


def test_extra_key_variant_sends_the_salt_as_sglang_extra_key() -> None:
    """``sglang-extra-key`` puts the salt into ``Req.extra_key`` (not ``cache_salt``), and SGLang's
    own ``RadixKey.child_key`` namespaces the tree edge by it: ``("s", tokens)``. The shipped
    ``sglang`` adapter's edge for the same request is ``((None, "s"), tokens)`` (a cache_salt)."""
    engine = _sglang()
    config = CacheConfig(block_size=2, num_blocks=4)
    variant, plain = engine.sglang_extra_key(config), engine.sglang(config)
    req = variant._req("r", [1, 2, 3], Extras(cache_salt="s"))
    assert (req.extra_key, req.cache_salt) == ("s", None)
    with_lora = variant._req("r", [1, 2, 3], Extras(lora=LoRA("x", 7), cache_salt="s"))
    spelled = variant.spell_extras(Extras(lora=LoRA("x", 7), cache_salt="s"))
    assert spelled == {"lora": engine.lora_id_string("x", 7), "cache_salt": "s"}
    assert with_lora.extra_key == "s" + spelled["lora"]  # Req.__init__: (extra_key or "") + lora_id
    unsalted = variant._req("r", [1, 2, 3], Extras(cache_salt=""))
    assert unsalted.extra_key is None  # the spec's "" is no salt (SGLang would key "" apart from None)
    for adapter in (variant, plain):
        adapter.allocate("a", [1, 2, 3], Extras(cache_salt="s"))
        adapter.step()
    assert _root_keys(variant) == {("s", (1, 2))}
    assert _root_keys(plain) == {((None, "s"), (1, 2))}
    with pytest.raises(ValueError, match="salt_as"):
        engine.SglangAdapter(config, salt_as="lora_id")


@pytest.mark.parametrize("tree", ["radix", "unified"])
@pytest.mark.parametrize(
    ("first", "second"),
    [
        # a salt spelled as the LoRA's lora_id, against that LoRA with no salt
        (Extras(lora=LoRA("x", 0)), "lora"),
        # salt "s" + LoRA, against the salt "s" + lora_id with no LoRA
        (Extras(lora=LoRA("x", 0), cache_salt="s"), "s+lora"),
    ],
)
def test_extra_key_variant_aliases_a_salt_with_a_lora(first: Extras, second: str, tree: str) -> None:
    """The cause of the ``sglang-extra-key`` and ``sglang-unified-extra-key`` FAILs (hit-content,
    accounting): SGLang concatenates ``extra_key`` and ``lora_id`` untyped, so a salt spelled like
    the concatenation reuses the LoRA request's KV, in RadixCache and in UnifiedRadixCache alike.
    The salt as ``cache_salt`` (``sglang``, ``sglang-unified``) keeps them apart."""
    engine = _sglang()
    spelled = engine.lora_id_string("x", 0)
    salt = spelled if second == "lora" else "s" + spelled
    hits = {}
    for name, salt_as in (("sglang_extra_key", "extra_key"), ("sglang", "cache_salt")):
        adapter = engine.SglangAdapter(CacheConfig(block_size=2, num_blocks=8), tree=tree, salt_as=salt_as)
        adapter.allocate("a", [1, 2, 3, 4, 5], first)
        adapter.step()
        other = adapter.allocate("b", [1, 2, 3, 4, 6], Extras(cache_salt=salt))
        adapter.step()
        unrelated = adapter.lookup([1, 2, 3, 4, 6], Extras(cache_salt=salt + "y"))
        hits[name] = (other.num_computed_tokens, unrelated)
    assert hits == {"sglang_extra_key": (4, 0), "sglang": (0, 0)}


# ----- hybrid caches: SGLang's SWA tree is built and driven, and why neither it nor Mamba is judged -----


def _swa_admit(cache: Any, rid: str, tokens: list[int]) -> Any:
    """One admission into ``swa_cache``'s tree as SGLang's scheduler makes it, with SGLang's own
    functions: ``Req.init_next_round_input`` (``match_kv_cache``), ``tree.lock``, the allocator's
    ``evict_to_free_tokens`` and ``alloc_extend``, the row written as ``alloc_for_extend`` leaves it.
    ``None`` (the lock undone) when SGLang's allocator refuses."""
    import torch

    engine = _sglang()
    mods = engine.loaded().modules
    tree, allocator, rows = cache.tree, cache.allocator, cache.rows
    sampling = mods["sglang.srt.sampling.sampling_params"].SamplingParams(max_new_tokens=64)
    req = mods["sglang.srt.managers.schedule_batch"].Req(rid, "", array("q", tokens), sampling)
    req.init_next_round_input(tree)
    prefix, n = int(req.prefix_len), len(tokens)
    req.lock = tree.lock(req.last_node)
    indices = tree.prefix_device_indices(req)
    last = indices[-1:].to(torch.int64) if prefix else torch.tensor([-1], dtype=torch.int64)
    allocator.evict_to_free_tokens(tree, n - prefix)
    as_tensor = [torch.tensor([v], dtype=torch.int64) for v in (prefix, prefix, n, n)]
    slots = allocator.alloc_extend(*as_tensor, last, n - prefix)
    if slots is None:
        tree.unlock(req.lock)
        return None
    rows.alloc([req])
    idx = req.kv.req_pool_idx
    rows.write((idx, slice(0, prefix)), indices)
    rows.write((idx, slice(prefix, n)), slots.to(torch.int32))
    req.kv.kv_allocated_len = req.kv.kv_committed_len = req.extend_end = n
    return req


def _swa_finish(cache: Any, req: Any) -> None:
    """The prefill step's end and the request's finish, as the ``sglang`` adapter does them."""
    mods = _sglang().loaded().modules
    common = mods["sglang.srt.mem_cache.common"]
    common.checkpoint_kv_cache(req, cache.tree)
    req.finished_reason = mods["sglang.srt.managers.schedule_batch"].FINISH_ABORT()
    common.release_kv_cache(req, cache.tree, checkpoint=True)


def test_swa_cache_is_driven_on_a_cpu() -> None:
    """SGLang's hybrid-SWA tree (FULL + SWA components) runs here: a 10-token prompt over 4-token
    pages takes 3 pages of each pool, its release keeps the 2 full pages in both the full and the
    SWA part of the tree and frees the rest, and a resend hits those 8 tokens through it."""
    engine = _sglang()
    cache = engine.swa_cache(4, full_pages=16, swa_pages=8, window=8)
    tree, allocator = cache.tree, cache.allocator
    assert set(tree.components) == {tree.tree_components[0], tree.tree_components[1]}
    assert [c.name for c in tree.tree_components] == ["FULL", "SWA"]
    first = _swa_admit(cache, "a", list(range(10)))
    assert first is not None and first.prefix_len == 0
    assert (allocator.full_available_size(), allocator.swa_available_size()) == (52, 20)
    _swa_finish(cache, first)
    assert (allocator.full_available_size(), allocator.swa_available_size()) == (56, 24)
    assert (tree.evictable_size(), tree.swa_evictable_size()) == (8, 8)
    again = _swa_admit(cache, "b", list(range(10)))
    assert again is not None and again.prefix_len == 8
    other = _swa_admit(cache, "c", [9] + list(range(1, 10)))
    assert other is not None and other.prefix_len == 0
    with pytest.raises(ValueError, match="block_size >= 2"):
        engine.swa_cache(1, full_pages=4, swa_pages=4, window=8)


def test_swa_tree_keeps_the_window_and_the_junction() -> None:
    """SGLang's own SWA logic runs (not a tree that ignores the component): a finished 13-token
    prompt leaves 12 tokens of full KV but only the trailing window (8 tokens, two pages) of SWA KV
    in the tree; a sibling sharing the first 8 tokens then misses (its window below 8 is gone) and
    records the junction ``swa_branching_seqlen = 8``, and its insertion keeps the window there, so
    the next sibling hits 8: the spec's ``replay`` retention with its junction (SEMANTICS.md
    section 8), at SGLang's page granularity."""
    engine = _sglang()
    cache = engine.swa_cache(4, full_pages=16, swa_pages=8, window=8)
    shared = list(range(8))
    first = _swa_admit(cache, "a", shared + [50, 51, 52, 53, 54])
    _swa_finish(cache, first)
    assert (cache.tree.evictable_size(), cache.tree.swa_evictable_size()) == (12, 8)
    assert (cache.allocator.full_available_size(), cache.allocator.swa_available_size()) == (52, 24)
    sibling = _swa_admit(cache, "b", shared + [60, 61, 62, 63, 64])
    assert sibling.prefix_len == 0 and sibling.swa_branching_seqlen == 8
    _swa_finish(cache, sibling)
    assert cache.tree.swa_evictable_size() == 16  # the window at the junction was kept too
    assert _swa_admit(cache, "c", shared + [80, 81, 82, 83, 84]).prefix_len == 8
    assert _swa_admit(cache, "d", shared + [50, 51, 52, 53, 70]).prefix_len == 12  # the resend


def test_swa_pools_are_separate() -> None:
    """Why no adapter declares ``sliding`` groups for SGLang (notes.NOT_DRIVEN["sglang-swa"]):
    its full and SWA KV live in two pools, and an admission needs room in both. With 16 full pages
    and 4 SWA pages SGLang refuses a 5-page prompt although 16 full pages are free, while the
    spec's one pool of N = 20 blocks admits it into full(4) + sliding(8, 4); any split of N into the
    two pools decides such verdicts, so they would judge the adapter's split."""
    from pagedprefix.spec import create_cache, full, sliding

    engine = _sglang()
    cache = engine.swa_cache(4, full_pages=16, swa_pages=4, window=8)
    assert _swa_admit(cache, "a", list(range(20))) is None
    assert (cache.allocator.full_available_size(), cache.allocator.swa_available_size()) == (64, 16)
    assert cache.allocator.available_size() == 16  # min of the two pools
    spec = create_cache(CacheConfig(block_size=4, num_blocks=20, groups=(full(4), sliding(8, 4))))
    admitted = spec.allocate("a", list(range(20)))
    assert admitted.num_computed_tokens == 0
    assert sorted(b for t in admitted.block_tables for b in t if b is not None) == list(range(10))
    assert _swa_admit(cache, "b", list(range(16))) is not None  # 4 pages fit both pools


def test_mamba_caches_only_what_the_scheduler_tracked() -> None:
    """Why no adapter declares ``mamba`` groups for SGLang (notes.NOT_DRIVEN["sglang-mamba"]): with
    the extra buffer, ``MambaComponent.prepare_for_caching_req`` caches the state at
    ``req.kv.mamba_last_track_seqlen``, which SGLang's ScheduleBatch and result processor set; a
    request they never saw donates 0 tokens of state. (The component is made without its
    ``__init__``, which needs a HybridReqToTokenPool shaped by a model's cache_params; on this path
    the method reads only ``cache.enable_mamba_extra_buffer`` and the pool's int8 checkpoint pool,
    which a pool without one lacks.)"""
    engine = _sglang()
    mods = engine.loaded().modules
    mamba = importlib.import_module("sglang.srt.mem_cache.unified_cache.components.mamba")
    component = mamba.MambaComponent.__new__(mamba.MambaComponent)
    component.cache = types.SimpleNamespace(enable_mamba_extra_buffer=True, req_to_token_pool=None)
    sampling = mods["sglang.srt.sampling.sampling_params"].SamplingParams(max_new_tokens=8)
    req = mods["sglang.srt.managers.schedule_batch"].Req("m", "", array("q", range(32)), sampling)
    assert req.kv.mamba_last_track_seqlen is None
    assert component.prepare_for_caching_req(req, None, token_ids_len=32, is_finished=False) == 0


def test_extra_key_accounting_counterexample_shows_the_rewrite_at_step() -> None:
    """The ``sglang-extra-key`` accounting counterexample (docs/MATRIX.md): the operation returns
    what the spec returns; SGLang's ``checkpoint_kv_cache`` then rewrites the row at ``step()``
    onto the LoRA request's page. The counterexample shows that rewrite and why it is refused."""
    from pagedprefix.conformance.generation.minimize import render_failure, replay

    engine = _sglang()
    salt = engine.lora_id_string("a", 1)
    steps = [
        {"op": "allocate", "request_id": "1", "tokens": [2], "extras": {"lora": {"id": 1, "name": "a"}}},
        {"op": "allocate", "request_id": 1, "tokens": [2], "extras": {"cache_salt": salt}},
    ]
    result = replay(engine.sglang_extra_key, CacheConfig(1, 2), steps, "core", frozenset(), trace=True)
    failure = render_failure(result, "core")
    assert failure.prop == "accounting"
    assert failure.message.endswith(
        "block 0 (entry 0, position 0) differs: the tokens are equal, only the extras differ: "
        f'{{"lora": {{"id": 1, "name": "a"}}}} in block 0, {{"cache_salt": "{salt}"}} in this request'
    )
    assert (
        '      engine: {"block_table": [1], "num_computed_tokens": 0}   <-- violates accounting\n'
        "      step(): block_table(1) [1] -> [0]; num_free_blocks 0 -> 1\n"
    ) in failure.sequence
