"""SGLang 0.5.23's own RadixCache / UnifiedRadixCache through pagedprefix.conformance.engines.sglang.

Skipped, with the reason, unless Python >= 3.11 and the SGLang wheel (installed ``--no-deps``) and
the few modules it needs on a CPU are there (``conformance/engines/README.md``). Otherwise a short
suite runs and the verdict rows are asserted, known suite false positives included (see below).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import types

import pytest
from pagedprefix.conformance.suite import SuiteOptions, run_suite
from pagedprefix.spec import CacheConfig, Extras, LoRA, OutOfBlocks

REQUIRED = ("torch", "numpy", "msgspec", "zmq", "pydantic", "psutil")


def _skip_reason() -> str | None:
    if sys.version_info < (3, 11):
        return "SGLang 0.5.23 needs Python >= 3.11"
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "sglang is not installed (pip install --no-deps sglang==0.5.23, conformance/engines/README.md)"
    if version != "0.5.23":
        return f"the adapter is written against sglang 0.5.23, {version} is installed"
    missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    if missing:
        return f"sglang is installed but {', '.join(missing)} is not (conformance/engines/README.md)"
    return None


REASON = _skip_reason()
if REASON is not None and os.environ.get("PAGEDPREFIX_REQUIRE_ENGINES"):
    raise RuntimeError(f"PAGEDPREFIX_REQUIRE_ENGINES is set but {REASON}")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def _sglang() -> types.ModuleType:
    from pagedprefix.conformance.engines import sglang

    return sglang


def test_loads_sglang_own_modules() -> None:
    engine = _sglang()
    loaded = engine.loaded()
    assert loaded.version == "0.5.23"
    import sglang.srt.mem_cache.radix_cache as radix_cache

    assert radix_cache.__file__ is not None and radix_cache.__file__.endswith("mem_cache/radix_cache.py")
    for item in loaded.installed:
        assert item.real_error, item.stand_in.module


def test_req_concatenates_extra_key_and_lora_id() -> None:
    """SGLang's own Req.__init__ runs: the radix key's extra_key is the LoRA id string itself."""
    engine = _sglang()
    adapter = engine.sglang(CacheConfig(block_size=2, num_blocks=4))
    req = adapter._req("r", [1, 2, 3], Extras(lora=LoRA("x", 7)))
    spelled = adapter.spell_extras(Extras(lora=LoRA("x", 7)))["lora"]
    assert len(spelled) == 32 and req.extra_key == spelled == req.lora_id


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


@pytest.mark.parametrize(
    ("first", "second"),
    [
        # a salt spelled as the LoRA's lora_id, against that LoRA with no salt
        (Extras(lora=LoRA("x", 0)), "lora"),
        # salt "s" + LoRA, against the salt "s" + lora_id with no LoRA
        (Extras(lora=LoRA("x", 0), cache_salt="s"), "s+lora"),
    ],
)
def test_extra_key_variant_aliases_a_salt_with_a_lora(first: Extras, second: str) -> None:
    """The cause of the ``sglang-extra-key`` FAIL (hit-content, accounting): SGLang concatenates
    ``extra_key`` and ``lora_id`` untyped, so a salt spelled like the concatenation reuses the LoRA
    request's KV. The shipped ``sglang`` adapter (salt as ``cache_salt``) keeps them apart."""
    engine = _sglang()
    spelled = engine.lora_id_string("x", 0)
    salt = spelled if second == "lora" else "s" + spelled
    hits = {}
    for name in ("sglang_extra_key", "sglang"):
        adapter = getattr(engine, name)(CacheConfig(block_size=2, num_blocks=8))
        adapter.allocate("a", [1, 2, 3, 4, 5], first)
        adapter.step()
        other = adapter.allocate("b", [1, 2, 3, 4, 6], Extras(cache_salt=salt))
        adapter.step()
        unrelated = adapter.lookup([1, 2, 3, 4, 6], Extras(cache_salt=salt + "y"))
        hits[name] = (other.num_computed_tokens, unrelated)
    assert hits == {"sglang_extra_key": (4, 0), "sglang": (0, 0)}


def test_extra_key_accounting_counterexample_shows_the_rewrite_at_step() -> None:
    """The ``sglang-extra-key`` accounting counterexample (docs/MATRIX.md): the operation returns
    what the spec returns; SGLang's ``checkpoint_kv_cache`` then rewrites the row at ``step()``
    onto the LoRA request's page. The counterexample shows that rewrite and why it is refused."""
    from pagedprefix.conformance.minimize import render_failure, replay

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
