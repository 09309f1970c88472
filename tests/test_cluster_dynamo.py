"""NVIDIA Dynamo's RadixTree as an indexer (pagedprefix.cluster.dynamo) and the indexer section of
docs/MATRIX.md (pagedprefix.cluster.indexer_matrix).

The section's machinery runs everywhere; the tests that drive the tree itself need
``ai-dynamo-runtime==1.6.1`` (``nox -s engines`` installs it and sets PAGEDPREFIX_REQUIRE_ENGINES,
so there they cannot be skipped)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest
import typer
from pagedprefix.cluster import GroupSpec, IndexerConfig, builtin_scenarios
from pagedprefix.cluster import indexer_matrix as im
from pagedprefix.cluster.streams import removed, stored, toy_keys
from pagedprefix.conformance.protocol import EngineUnavailable
from pagedprefix.spec.events import AllBlocksCleared, BlockStored, EventBatch

try:
    importlib.import_module("dynamo.llm")
    REASON: str | None = None
except Exception as exc:  # any failure to load the wheel is a reason to skip
    REASON = f"dynamo.llm does not import ({type(exc).__name__})"
if REASON is not None and os.environ.get("PAGEDPREFIX_REQUIRE_ENGINES"):
    raise RuntimeError(f"PAGEDPREFIX_REQUIRE_ENGINES is set but {REASON}")
needs_dynamo = pytest.mark.skipif(REASON is not None, reason=REASON or "")

ABC = [1, 2, 3]
AB = [1, 2]


# ----- the matrix section (no Dynamo needed) -------------------------------------------------------


def test_a_missing_distribution_is_a_not_installed_row() -> None:
    row = im.run_indexer(im.MatrixIndexer("dynamo", "no-such-distribution-xyz"))
    assert (row.version, row.verdict, row.verdicts) == ("-", "not installed", [])
    text = im.render_section([row])
    assert "| dynamo | - | `-` | not installed | - |" in text
    assert "Not judged here: pip install no-such-distribution-xyz." in text


def test_a_failure_without_a_note_is_marked_unexplained() -> None:
    # A broken indexer (tests/broken_indexers.py) has no notes: its failures must say so.
    row = im.run_indexer(im.MatrixIndexer("broken_indexers:ignores_gaps", "pagedprefix"))
    assert row.verdict == "FAIL"
    text = im.render_section([row])
    assert "- FAIL `lost-batch`: lost-batch step 4 r0: answered 48" in text
    assert "*unexplained*" in text
    assert "- PASS `duplicate-copies`" in text


def test_the_reference_passes_every_scenario_in_the_section() -> None:
    row = im.run_indexer(im.MatrixIndexer("reference", "pagedprefix"))
    assert row.verdict == "PASS" and len(row.verdicts) == len(builtin_scenarios())
    assert "| reference | " in im.render_section([row]) and "| PASS | - |" in im.render_section([row])


def test_matrix_appends_the_registered_sections(tmp_path: Path) -> None:
    from pagedprefix.conformance import cli as ccli

    out = tmp_path / "MATRIX.md"
    section = "\n# Indexers\n\nsection text\n"
    ccli._MATRIX_SECTIONS.append(lambda streams: section)
    try:
        ccli._matrix_run([], out, None, False, 0)
        text = out.read_text(encoding="utf-8")
        assert text.startswith("# Conformance matrix") and text.endswith(section)
        # --check compares the sections too: a changed section is a difference (exit 1).
        out.write_text(text.replace("section text", "stale"), encoding="utf-8")
        with pytest.raises(typer.Exit) as info:
            ccli._matrix_run([], out, None, True, 0)
        assert info.value.exit_code == 1
    finally:
        ccli._MATRIX_SECTIONS.pop()


def test_the_app_registers_the_indexer_section() -> None:
    from pagedprefix import cli
    from pagedprefix.conformance import cli as ccli

    cli._register()
    assert cli._indexer_matrix_section in ccli._MATRIX_SECTIONS


def test_without_dynamo_the_indexer_is_unavailable_with_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pagedprefix.cluster import dynamo

    def fail(name: str) -> object:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(dynamo.importlib, "import_module", fail)
    with pytest.raises(EngineUnavailable, match=r"pip install --no-deps ai-dynamo-runtime==1\.6\.1"):
        dynamo.DynamoIndexer(IndexerConfig(sources=("r0",)))


def test_hybrid_groups_are_refused_before_dynamo_is_loaded() -> None:
    from pagedprefix.cluster.dynamo import DynamoIndexer

    for groups in ((GroupSpec("full", 16), GroupSpec("mamba", 16)), (GroupSpec("sliding", 16, window=33),)):
        with pytest.raises(NotImplementedError, match="no KV-cache groups"):
            DynamoIndexer(IndexerConfig(groups=groups, sources=("r0",)))


# ----- the tree itself -----------------------------------------------------------------------------


def _indexer(*sources: str):  # type: ignore[no-untyped-def]
    from pagedprefix.cluster.dynamo import DynamoIndexer

    return DynamoIndexer(IndexerConfig(sources=sources or ("r0",)))


def _q(ix, path: list[int], num_tokens: int | None = None):  # type: ignore[no-untyped-def]
    return ix.query([toy_keys(path, 0)], num_tokens or 16 * len(path) + 1)


@needs_dynamo
def test_stores_removals_and_clears_reach_the_tree_per_source() -> None:
    ix = _indexer("r0", "r1")
    assert ix.events("r0", EventBatch(0, (stored(ABC, 0, 3),))) is False
    assert ix.events("r1", EventBatch(0, (stored(AB, 0, 1),))) is False
    assert _q(ix, ABC) == {"r0": 48, "r1": 16}
    assert _q(ix, ABC, num_tokens=48) == {"r0": 32, "r1": 16}  # the last prompt token is recomputed
    ix.events("r0", EventBatch(1, (removed(ABC, [2]),)))
    assert _q(ix, ABC) == {"r0": 32, "r1": 16}
    ix.events("r0", EventBatch(2, (AllBlocksCleared(),)))
    assert _q(ix, ABC) == {"r0": 0, "r1": 16}
    # The tree's own dump names the stored block by our key's digest and Dynamo's content hash.
    from pagedprefix.cluster.dynamo import external_hash

    (dumped,) = ix.dump()
    block = dumped["event"]["data"]["stored"]["blocks"][0]
    assert block["block_hash"] == external_hash(toy_keys(AB, 0)[0])
    assert block["tokens_hash"] == ix.local[toy_keys(AB, 0)[0]]


@needs_dynamo
def test_the_tree_matches_content_hashes_along_the_path() -> None:
    ix = _indexer()
    ix.events("r0", EventBatch(0, (stored(ABC, 0, 3),)))
    # Same tokens as ABC's first block but a different key (another request's chain, e.g. salted):
    # never stored, so the walk stops there and nothing is credited.
    other = b"\x01" * 16
    assert ix.query([(other, *toy_keys(ABC, 0)[1:])], 49) == {"r0": 0}


@needs_dynamo
def test_documented_dynamo_behaviour_duplicate_copy_lost_and_seq_ignored() -> None:
    ix = _indexer()
    ix.events("r0", EventBatch(0, (stored(ABC, 0, 3),)))
    ix.events("r0", EventBatch(1, (stored(ABC, 0, 2),)))  # a second copy of AB
    ix.events("r0", EventBatch(2, (removed(ABC, [1]),)))  # one copy evicted
    assert _q(ix, ABC) == {"r0": 16}  # a set of workers per node: the other copy is lost
    assert ix.events("r0", EventBatch(9, (stored(AB, 1, 2),))) is False  # a gap: no resync asked
    assert _q(ix, ABC) == {"r0": 32}


@needs_dynamo
def test_a_store_under_an_unheld_parent_is_refused_and_counted() -> None:
    ix = _indexer()
    ix.events("r0", EventBatch(0, (stored(ABC, 1, 3), removed(ABC, [0]))))
    assert ix.rejected == 2 and _q(ix, ABC) == {"r0": 0}


@needs_dynamo
def test_a_bad_event_raises_and_applies_nothing_of_its_batch() -> None:
    ix = _indexer()
    bad = BlockStored((toy_keys(AB, 0)[1],), toy_keys(AB, 0)[0], (2,) * 8, 8, ((),))
    with pytest.raises(ValueError, match="block_size 8"):
        ix.events("r0", EventBatch(0, (stored(AB, 0, 1), bad)))
    assert _q(ix, AB) == {"r0": 0}
    with pytest.raises(ValueError, match="key lists for 1 group"):
        ix.query([], 17)


@needs_dynamo
def test_resync_rebuilds_the_known_chains_of_the_snapshot() -> None:
    ix = _indexer()
    ix.events("r0", EventBatch(0, (stored(ABC, 0, 3),)))
    keys = toy_keys(ABC, 0)
    ix.resync("r0", 0, {(0, keys[0]): 1, (0, keys[1]): 2})
    assert _q(ix, ABC) == {"r0": 32}
    ix.resync("r0", 0, {(0, keys[1]): 1})  # its parent is not held: the tree cannot place it
    assert _q(ix, ABC) == {"r0": 0}
    with pytest.raises(ValueError, match="seq"):
        ix.resync("r0", -2, {})


@needs_dynamo
def test_the_matrix_verdicts_of_dynamo_are_all_explained() -> None:
    row = im.run_indexer(im.MATRIX_INDEXERS[0])
    by_name = {v.scenario.name: v for v in row.verdicts}
    assert row.version == "1.6.1" and row.verdict == "FAIL"
    assert by_name["all-blocks-cleared"].passed
    # the tree keeps a set of workers: judged on last_copy streams, it keeps the surviving copy
    assert by_name["duplicate-copies"].passed and row.removal == "last_copy"
    assert "NotImplementedError" in str(by_name["unknown-parent-mamba"].finding)
    failing = {n for n, v in by_name.items() if not v.passed}
    assert failing <= set(im.NOTES["dynamo"]), failing - set(im.NOTES["dynamo"])
    text = im.render_section([row], {"vllm-events": "per_copy"})
    assert "*unexplained*" not in text
    assert "- `vllm-events` (`per_copy`) with `dynamo` (`last_copy`): **mismatch**." in text


def test_pairs_of_removal_models_are_reported() -> None:
    """An engine stream and an indexer that assume different removal models are a mismatch of
    the pair (SEMANTICS.md section 9), explained; agreeing ones say so."""
    rows = [im.run_indexer(im.MatrixIndexer(name, "pagedprefix")) for name in (
        "reference", "pagedprefix.cluster.indexer:last_copy_reference")]
    assert [r.removal for r in rows] == ["per_copy", "last_copy"] and all(r.verdict == "PASS" for r in rows)
    text = im.render_section(rows, {"impl": "per_copy", "quiet": "last_copy"})
    assert "- `impl` (`per_copy`) with `reference` (`per_copy`): the models agree." in text
    assert ("- `quiet` (`last_copy`) with `reference` (`per_copy`): **mismatch**. The engine removes a key "
            "once") in text
    assert "- `impl` (`per_copy`) with `pagedprefix.cluster.indexer:last_copy_reference` (`last_copy`): " \
           "**mismatch**. The engine removes each evicted copy" in text
    assert "Removal models" not in im.render_section(rows)  # no engine stream judged: no pairs


# ----- vLLM's own event stream into Dynamo's tree ------------------------------------------------


def _vllm_events():  # type: ignore[no-untyped-def]
    try:
        import importlib.metadata

        assert importlib.metadata.version("vllm") == "0.33.0"
        from pagedprefix.conformance.engines import vllm as engine

        engine.loaded()
    except Exception as exc:  # vLLM absent or not importable here
        if os.environ.get("PAGEDPREFIX_REQUIRE_ENGINES"):
            raise
        pytest.skip(f"vLLM does not import ({type(exc).__name__})")
    return engine


@needs_dynamo
def test_vllm_event_stream_end_to_end_and_the_salt_dynamo_does_not_see() -> None:
    """Two vLLM 0.33 caches (``--engine vllm-events``) publish their own KV events; Dynamo's tree
    and the reference take the same batches. Where the keys tell blocks apart only by an extra
    (here ``cache_salt``), Dynamo's content hash does not: it credits the unsalted replica."""
    from pagedprefix.cluster import ReferenceIndexer
    from pagedprefix.cluster.dynamo import DynamoIndexer
    from pagedprefix.spec import CacheConfig, Extras

    engine = _vllm_events()
    caches = {s: engine.vllm_with_events(CacheConfig(block_size=16, num_blocks=8)) for s in ("r0", "r1")}
    config = IndexerConfig(sources=("r0", "r1"))
    dyn, ref = DynamoIndexer(config), ReferenceIndexer(config)
    prompt = [t for b in range(4) for t in [b + 1] * 16] + [99]  # four full blocks and one token

    def publish(source: str) -> list[BlockStored]:
        out = []
        for batch in caches[source].take_events():
            assert dyn.events(source, batch) is False and ref.events(source, batch) is False
            out += [e for e in batch.events if isinstance(e, BlockStored)]
        return out

    caches["r0"].allocate("a", prompt)
    [plain] = publish("r0")
    caches["r1"].allocate("b", prompt[:33])  # two full blocks, same tokens, no salt
    publish("r1")
    keys = [plain.block_hashes]
    assert dyn.query(keys, len(prompt)) == ref.query(keys, len(prompt)) == {"r0": 64, "r1": 32}
    caches["r0"].free("a")
    caches["r0"].allocate("c", [7] * 16 * 7 + [1])  # evicts a's blocks: removals of vLLM's keys
    publish("r0")
    assert dyn.query(keys, len(prompt)) == ref.query(keys, len(prompt)) == {"r0": 0, "r1": 32}
    assert dyn.rejected == 0
    caches["r1"].allocate("s", prompt, Extras(cache_salt="tenant-2"))
    salted = publish("r1")
    salted_keys = [tuple(k for e in salted for k in e.block_hashes)]
    assert salted_keys[0][0] != plain.block_hashes[0]  # vLLM keys the salt
    assert ref.query(salted_keys, len(prompt))["r1"] == 64
    # Dynamo: the salted blocks' content hashes equal the unsalted ones, so r1's unsalted blocks
    # (the tree's path for its first two blocks) answer the salted request's walk too.
    assert dyn.query(salted_keys, len(prompt)) == {"r0": 0, "r1": 64}
    caches["r0"].free("c")
    caches["r0"].allocate("d", prompt[:17])  # r0 holds the unsalted first block again
    publish("r0")
    assert ref.query(salted_keys, len(prompt))["r0"] == 0
    assert dyn.query(salted_keys, len(prompt))["r0"] == 16  # false credit: the salt is not in its hash


# ----- bench_indexer -----------------------------------------------------------------------------


def test_bench_rows_on_one_stream_and_agreement() -> None:
    from pagedprefix.cluster.bench_indexer import bench, make_stream, markdown

    stream = make_stream(seed=1, replicas=2, paths=20, batches=60, queries=30)
    assert stream.events > 60 and stream.blocks > stream.events
    rows = bench("reference", stream, repeat=1)
    assert [r.name for r in rows] == ["reference", "reference"] and rows[1].agree == 1.0
    rows = bench("broken_indexers:no_copy_count", stream, repeat=1)
    assert rows[1].agree is not None and rows[1].agree < 1.0  # a set, not a count: answers differ
    table = markdown(rows, stream)
    assert table.count("\n| ") == 3 and "| 1.00x | 1.00x | 100.0% |" in table


@needs_dynamo
def test_bench_dynamo_has_the_tree_only_row() -> None:
    from pagedprefix.cluster.bench_indexer import bench, make_stream

    rows = bench("dynamo", make_stream(seed=1, replicas=2, paths=20, batches=60, queries=30), repeat=1)
    assert [r.name for r in rows] == ["reference", "dynamo", "dynamo (tree calls only)"]
    assert all(r.events_s > 0 and r.queries_s > 0 for r in rows)


def test_bench_cli_unknown_indexer_is_one_line_exit_2() -> None:
    from pagedprefix.cluster import bench_indexer
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command()(bench_indexer.main)
    result = CliRunner().invoke(app, ["--indexer", "no_such_module_xyz:make", "--batches", "5",
                                      "--queries", "2", "--repeat", "1"])
    assert result.exit_code == 2 and "bench_indexer:" in result.output


@needs_dynamo
def test_a_rejected_batch_teaches_the_adapter_nothing() -> None:
    ix = _indexer()
    ok = stored(AB, 0, 2)
    bad = BlockStored((b"\x02" * 16,), None, (5,) * 15, 16, ((),))  # 15 token ids for one block
    with pytest.raises(ValueError, match="15 token ids"):
        ix.events("r0", EventBatch(0, (ok, bad)))
    assert ix.local == {} and ix.parent == {} and _q(ix, AB) == {"r0": 0}


# ----- the cluster replay with an engine that hands batches (the vLLM adapter does) ---------------


class _BatchingEngine:
    """impl's BlockManager whose ``take_events`` hands numbered batches, one per call, as
    ``VllmAdapter.take_events`` does (``--engine ...vllm:vllm_with_events``)."""

    def __init__(self, config: object) -> None:
        from pagedprefix.impl import BlockManager

        self._inner = BlockManager.create(config, events=True)  # type: ignore[arg-type]
        self._seq = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    def take_events(self) -> list[EventBatch]:
        events = tuple(self._inner.take_events())
        if not events:
            return []
        self._seq += 1
        return [EventBatch(self._seq - 1, events)]


def test_the_cluster_replay_takes_an_engine_that_hands_batches() -> None:
    from pagedprefix.cluster.replay import ClusterOptions, run_cluster
    from pagedprefix.replay import ReplayConfig, load_factory, load_trace

    reqs = load_trace("conversation", limit=80).requests
    config = ReplayConfig(num_blocks=None, max_running=16, step_ms=200.0, max_output=64)
    options = ClusterOptions(2, "prefix_aware")
    batching = run_cluster(reqs, config, options, _BatchingEngine)  # raised AttributeError before
    plain = run_cluster(reqs, config, options, load_factory("impl"))
    assert batching.routes == plain.routes and batching.hits == plain.hits and sum(plain.hits) > 0
    assert batching.batches_published == plain.batches_published > 0


def test_the_router_hashes_as_vllm_replicas_do() -> None:
    """With vLLM's own caches as replicas the router asks the index with vLLM's keys (the adapter's
    ``request_keys``, vLLM's ``Request`` hasher): before, it hashed with impl's chain, no query key
    was ever one a replica published, and ``prefix_aware`` did no better than round robin
    (docs/CLUSTER.md measured 0.0770 against 0.0785)."""
    from pagedprefix.cluster.replay import ClusterOptions, KeyHasher, run_cluster
    from pagedprefix.replay import ReplayConfig, load_factory, load_trace
    from pagedprefix.spec import CacheConfig

    engine = _vllm_events()
    cache_config = CacheConfig(block_size=16, num_blocks=64)
    replica = engine.vllm_with_events(cache_config)
    tokens = list(range(1, 50))
    replica.allocate("a", tokens)
    replica.step()
    published = {key for (_group, key) in replica.cached_keys()}
    keys = KeyHasher(cache_config, engine.vllm_with_events).keys(tokens)
    assert len(keys) == 3 and set(keys) == published
    assert KeyHasher(cache_config).keys(tokens)[0] not in published  # impl's chain: never published

    reqs = load_trace("conversation", limit=300).requests
    config = ReplayConfig(num_blocks=None, max_running=16, step_ms=200.0, max_output=64)
    routed = {r: run_cluster(reqs, config, ClusterOptions(4, r), engine.vllm_with_events)
              for r in ("prefix_aware", "round_robin")}
    on_impl = run_cluster(reqs, config, ClusterOptions(4, "prefix_aware"), load_factory("impl"))
    # Unbounded pools: the same routes and hits as over impl replicas (0.0807 against round robin's
    # 0.0582 on this slice; before, prefix_aware over vLLM got round robin's rate or less).
    assert routed["prefix_aware"].routes == on_impl.routes
    assert routed["prefix_aware"].token_hit_rate == on_impl.token_hit_rate
    assert routed["prefix_aware"].token_hit_rate > 1.3 * routed["round_robin"].token_hit_rate
