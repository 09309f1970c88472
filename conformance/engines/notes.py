"""Plain-words explanations of the conformance matrix's verdicts (``pagedprefix matrix``).

For each shipped engine: what is driven, and why each row it does not pass (a skip by capability,
a failure) is what it is — a real engine behaviour that differs from the spec, quoted from the
engine's code by file and function, or a defect. The matrix generator puts these next to the
verdicts it measures; a row with no note here is printed as *unexplained*, so a new verdict cannot
go unnoticed.
"""

from __future__ import annotations

ABOUT: dict[str, str] = {
    "impl": "pagedprefix's optimized block manager (`pagedprefix.impl.BlockManager`), proven equal to "
    "the spec.",
    "spec": "the executable specification itself (the oracle judging every other row).",
    "radix": "pagedprefix's radix-tree engine (`pagedprefix.impl.radix.RadixCache`): pages as edges, "
    "leaf-first LRU eviction, so it is judged at `maximal`, not by eviction order.",
    "vllm": "vLLM's own `KVCacheManager` -> `UnitaryKVCacheCoordinator` -> `FullAttentionManager` -> "
    "`BlockPool`, fed vLLM's `Request` objects hashed by `get_request_block_hasher` (SHA-256 over "
    "pickle), driven as its scheduler drives it (`pagedprefix.conformance.engines.vllm`). Hybrid "
    "configs (full, sliding-window and chunked-local groups; half the stateful examples and the "
    "hybrid vectors) go to `HybridKVCacheCoordinator` over the one `BlockPool`, with "
    "`FullAttentionManager`, `SlidingWindowManager` and `ChunkedLocalAttentionManager`; `free` is "
    "`KVCacheCoordinator.free` (group-major). Mamba groups are not driven: `MambaManager` builds, but "
    "it materialises a recurrent state only where vLLM's scheduler ends a prefill chunk "
    "(`Scheduler._mamba_block_aligned_split`), so one `allocate_slots` per admission leaves no "
    "checkpoint (a resend of a 30-token prompt over full(8) + mamba(8) hits 0 after a step boundary, "
    "the spec 24) and a verdict would judge the adapter, not vLLM.",
    "vllm-events": "the same vLLM cache with its KV-cache event queue on (`KVCacheManager("
    "enable_kv_cache_events=True)`): vLLM's own `vllm.distributed.kv_events` objects mapped onto "
    "the spec's events and numbered as vLLM's ZMQ publisher numbers its batches, checked by a "
    "counting subscriber against `BlockPool.cached_block_hash_to_block` "
    "(`pagedprefix.conformance.engines.vllm`, `vllm_with_events`). Hybrid configs go to the same "
    "`HybridKVCacheCoordinator` as the `vllm` rows, with the queue on: one stream, each event with its "
    "`group_idx`, judged per group.",
    "sglang": "SGLang's own `RadixCache` with its `Req`, page allocator and the scheduler-side "
    "`match_kv_cache` / `checkpoint_kv_cache` / `release_kv_cache` "
    "(`pagedprefix.conformance.engines.sglang`).",
    "sglang-extra-key": "SGLang's own `RadixCache` driven like `sglang`, but with the spec's salt sent as "
    "SGLang's client-supplied `extra_key` (`Req(extra_key=salt, cache_salt=None)`), the key channel "
    "that SGLang also folds LoRA ids into (`pagedprefix.conformance.engines.sglang`, "
    "`sglang_extra_key`).",
    "sglang-unified": "SGLang's `UnifiedRadixCache` (the 0.5.23 server's default, with its Rust tree "
    "core), driven like `sglang`.",
    "sglang-unified-extra-key": "SGLang's `UnifiedRadixCache` (the server's default tree) driven like "
    "`sglang-extra-key`: the spec's salt sent as SGLang's client-supplied `extra_key` "
    "(`pagedprefix.conformance.engines.sglang`, `sglang_unified_extra_key`).",
    "sglang-swa": "SGLang's hybrid sliding-window cache: `UnifiedRadixCache` with the `FULL` and `SWA` "
    "components over `SWATokenToKVPoolAllocator` (what `registry.create_unified_radix_cache` builds for "
    "a hybrid-SWA model; 0.5.23 has no separate `swa_radix_cache.py`).",
    "sglang-mamba": "SGLang's hybrid Mamba cache: `UnifiedRadixCache` with the `FULL` and `MAMBA` "
    "components over `HybridReqToTokenPool` and its `MambaPool` (what `registry.create_unified_radix_cache` "
    "builds for a hybrid-SSM model; 0.5.23 has no separate `mamba_radix_cache.py`).",
}

NOT_DRIVEN: dict[str, str] = {
    "sglang-swa": "it builds and runs in process on a CPU (`pagedprefix.conformance.engines.sglang."
    "swa_cache`; tests/test_engines_sglang.py drives a request through SGLang's `match_kv_cache`, "
    "`alloc_extend`, `checkpoint_kv_cache` and `release_kv_cache`, and a resend hits through the SWA "
    "component; its own retention shows: a finished prompt leaves full KV but only its trailing window "
    "of SWA KV in the tree, and a sibling that misses at the shared prefix records the junction "
    "(`swa_branching_seqlen`) so the next one hits, the spec's `replay` retention, "
    "`test_swa_tree_keeps_the_window_and_the_junction`), but a verdict would judge the adapter. "
    "SGLang keeps full and SWA KV in two separately "
    "sized allocators (`SWATokenToKVPoolAllocator.full_attn_allocator` and `swa_attn_allocator`, "
    "`sglang/srt/mem_cache/allocator/swa.py`; the server sizes them with `--swa-full-tokens-ratio`, "
    "`model_executor/pool_configurator.py`), and `alloc_extend` refuses unless both have the new "
    "pages (`new_pages_available(n, n)`), while SEMANTICS.md section 8 models one pool of `N` blocks "
    "that every group draws from: `group-accounting` (free + held = `N` over one id space), "
    "`progress` and the admission capacity summed over groups presuppose it. How `N` splits into the "
    "two pools would be the adapter's choice, and those verdicts would follow from it: SGLang admits "
    "`k` new pages only if each pool has `k` free, the spec if its one pool has the `2 k` both groups "
    "need, so they part whenever one pool has fewer free pages than the other (at once with 16 full "
    "and 4 SWA pages: SGLang refuses a 5-page prompt that the spec admits with `N = 20`, "
    "`test_swa_pools_are_separate`). The pools also share one page size, so full and sliding groups "
    "of different block sizes have no SGLang counterpart. Judging it needs a spec model with one pool "
    "per group kind.",
    "sglang-mamba": "what the `MAMBA` component caches is decided by SGLang's scheduler and model kernel, "
    "not by the tree. Without `enable_mamba_extra_buffer`, `MambaComponent` asserts `page_size == 1` "
    "and donates the running state at the request's whole length; with it, `prepare_for_caching_req` "
    "(`sglang/srt/mem_cache/unified_cache/components/mamba.py`) inserts the state at "
    "`req.kv.mamba_last_track_seqlen`, which only "
    "`ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend` "
    "(`managers/schedule_batch.py`: the prefill chunk, the kernel's FLA chunk grid, `_force_track_h`) "
    "and the scheduler's decode result processing (`managers/scheduler_components/"
    "batch_result_processor.py`) set; a request they never saw donates nothing "
    "(`test_mamba_caches_only_what_the_scheduler_tracked`). The component also needs a "
    "`HybridReqToTokenPool` whose `MambaPool` is shaped by the model's `cache_params`. Driving the "
    "tree alone would put that tracking into the adapter, so a verdict would judge the adapter, not "
    "SGLang (vLLM's Mamba groups are left out for the same reason).",
}
"""Components that no adapter drives, with the precise reason (the matrix's ``not driven`` rows)."""

_TREE_POLICY = (
    "its own eviction order (leaf-first LRU over the tree), not a spec policy, so exact hit lengths "
    "and block ids under eviction are not compared (SEMANTICS.md section 5)"
)

_SPEC_POLICY_ROWS = ("policy-hits", "policy-sharing", "policy-free-queue", "exact-ids")


def _follows_tree_policy(engine: str) -> dict[str, str]:
    """The notes of the rows judged only under a spec policy, for an engine following the tree's."""
    return {row: f"{engine} follows {_TREE_POLICY}." for row in _SPEC_POLICY_ROWS}
_SGLANG = {
    "capability: fork": "SGLang has no block-level fork or copy-on-write: for parallel sampling its "
    "tokenizer manager first caches the common prefix, then sends each sample as a request of its own "
    "(`sglang/srt/managers/tokenizer_manager.py`, the `parallel_sample_num` path), so copy-on-write is "
    "not exercised.",
    "capability: input_errors": "the tree does not validate requests; SGLang's tokenizer manager "
    "does, above it (`sglang/srt/managers/tokenizer_manager.py`), so typed errors are not asked of it.",
    "capability: ref_cnt": "SGLang counts locks per tree node (`TreeNode.lock_ref` in "
    "`sglang/srt/mem_cache/radix_cache.py`), not references per page: nothing to report per block.",
    "capability: free_queue": "SGLang keeps no ordered free queue: free pages sit in its allocator, "
    "cached ones in the tree, evicted leaf-first by LRU (`RadixCache.evict`).",
    "capability: keys": "SGLang keys pages by their token ids in the tree (`RadixKey`), not by "
    "chained hashes, so there are no byte-exact keys to compare.",
    "capability: extras": "multimodal items and prompt embeddings need SGLang's multimodal "
    "processor and a model; LoRA and `cache_salt` are driven. SGLang's `Req.__init__` "
    '(`schedule_batch.py`) keys `(extra_key or "") + lora_id` untyped; these rows map the salt to '
    "SGLang's own `cache_salt`, a separate `RadixKey` field, so that alias is not reached here: the "
    "`sglang-extra-key` rows send the salt as `extra_key` and provoke it.",
    **_follows_tree_policy("SGLang"),
    "replay: conversation trace slice": "the slice compares exact hits under eviction, which are "
    "normative only for engines following the spec's policy; SGLang follows " + _TREE_POLICY + ".",
    "capability: events": "SGLang 0.5.23's trees record KV-cache events too (`KVCacheEventRecorder` in "
    "`sglang/srt/mem_cache/events.py`, on with `enable_kv_cache_events`), but the adapter does not map "
    "them yet: only vLLM's stream is judged here (the `vllm-events` rows).",
}

_SGLANG_EXTRA_KEY_ALIAS = (
    "a real SGLang behaviour, reached because these rows send the spec's salt as SGLang's "
    "client-supplied `extra_key` (`GenerateReqInput.extra_key`, also a field of its OpenAI-compatible "
    'completion and chat requests: "extra cache key for caller-defined request classification"). '
    "`Req.__init__` (`sglang/srt/managers/schedule_batch.py`) folds a LoRA into the same string, "
    '`extra_key = (extra_key or "") + lora_id`, with no separator or tag, and the tree namespaces '
    "every edge by that string alone (`RadixKey.child_key_at` in `sglang/srt/mem_cache/radix_cache.py` "
    "returns `(extra_key, tokens)`, or `((extra_key, cache_salt), tokens)` when a `cache_salt` is set). "
    "So a request with no LoRA whose `extra_key` equals a LoRA's `lora_id` (SGLang's registry id, a "
    "uuid4 hex), or `s + lora_id` against `extra_key = s` with that LoRA, gets the LoRA request's "
    "key and reuses KV computed under the adapter's weights: the runner builds those salts from "
    "`spell_extras`. `cache_salt` (the `sglang` rows) is a separate field and is not confused. "
    "tests/test_engines_sglang.py, `test_extra_key_variant_aliases_a_salt_with_a_lora`, pins it. The "
    "same alias holds in `UnifiedRadixCache`, the server's default tree: the string is built by "
    "`Req.__init__` before either tree sees it (the test runs both trees; `--engine "
    "sglang-unified-extra-key` runs the suite on the unified one)."
)

_VLLM = {
    "capability: fork": "vLLM 0.33's `KVCacheManager` has no fork: parallel sampling (n > 1) runs "
    "as separate child requests that share the prompt through the prefix cache "
    "(`vllm/v1/engine/parallel_sampling.py`, `ParentRequest`), so block-level copy-on-write is "
    "not exercised.",
    "capability: input_errors": "vLLM validates requests above the KV-cache manager "
    "(`vllm/v1/engine/input_processor.py`); the manager is not asked for typed errors.",
    "capability: keys": "vLLM hashes blocks with its own encoding (SHA-256 over pickle of "
    "`(parent, tokens, extra_keys)`, `vllm/v1/core/kv_cache_utils.py`, `hash_block_tokens`), not the "
    "spec's byte encoding.",
    "capability: extras": "multimodal keys need vLLM's multimodal processor (`_gen_mm_extra_hash_keys`), "
    "and its prompt embeddings cover the whole prompt (`_gen_prompt_embeds_extra_hash_keys`) where "
    'the spec allows some positions; LoRA (`("lora", name, path)`) and `cache_salt` (block 0 '
    "only) are driven (`kv_cache_utils.py`, `generate_block_hash_extra_keys`).",
}

_VLLM_WINDOW_OF_ONE = (
    "a real difference, only for a sliding window of one token (W = 1: each query attends to itself "
    "only, so `cdiv(W - 1, B) = 0` blocks are needed and the spec's lookup is valid at every "
    "boundary, SEMANTICS.md section 8, Lookup): vLLM's `SlidingWindowManager.find_longest_cache_hit` "
    "(`vllm/v1/core/single_type_kv_cache_manager.py`) sets `match_found` only on a cached block, "
    "so with no cached block at the boundary it reports 0 tokens (sound, not maximal). With the "
    "window excluded the same run passes at `exact` (tests/test_engines_vllm.py, "
    "`test_hybrid_window_of_one_token`); no released model has W = 1."
)

VLLM_EMBEDS_DECODE = (
    "a lost hit found by this suite, not in the public record searched: vLLM keys every block of a "
    "request with prompt embeddings by a SHA-256 of that block's rows of `prompt_embeds` "
    "(`kv_cache_utils._gen_prompt_embeds_extra_hash_keys`: `request.prompt_embeds[start:end]`), "
    "whether or not a position of the block is embedded, and a block past the prompt by the hash of "
    "an empty slice. So the blocks of token positions only are never shared across that line: a "
    "text-only prompt does not hit the text blocks before an embedding (vectors "
    "`extras/embeds-placeholder-vs-token`), and a later prompt with the same tokens and embeddings "
    "does not hit the blocks the decode filled; the spec keys no embedding on a block without an "
    "embedded position"
)
_VLLM_HITS = (
    "one of two findings, the counterexample shows which: " + VLLM_EMBEDS_DECODE + " (a lookup or "
    "admission after a decode of a request with embeddings); or " + _VLLM_WINDOW_OF_ONE
)

_SGLANG_EXTRA_KEY: dict[str, str] = {
    **_SGLANG,
    "capability: extras": "multimodal items and prompt embeddings need SGLang's multimodal "
    "processor and a model; LoRA and the salt (as `extra_key`) are driven.",
    "hit-content": _SGLANG_EXTRA_KEY_ALIAS + " Here the aliased request hits the LoRA request's "
    "page, whose KV the spec holds for other extras.",
    "accounting": _SGLANG_EXTRA_KEY_ALIAS + " Here the aliased request misses (the hit is capped "
    "at `len - 1` tokens), but at publication `checkpoint_kv_cache` finds its page already in the "
    "tree under the same key, frees it and rewrites its row to the LoRA request's page: a rewrite "
    "SEMANTICS.md section 6 allows only onto a block of the same content and extras.",
}

NOTES: dict[str, dict[str, str]] = {
    "impl": {},
    "spec": {},
    "radix": {
        "capability: events": "the radix engine publishes no KV-cache events.",
        "capability: keys": "the radix engine compares page contents, not chained hashes: no "
        "byte-exact keys to compare.",
        **_follows_tree_policy("the radix engine"),
        "replay: conversation trace slice": "exact hits under eviction are normative only for the "
        "spec's policies; the radix engine follows " + _TREE_POLICY + ".",
    },
    "vllm": {
        **_VLLM,
        "capability: events": "these rows drive vLLM with `enable_kv_cache_events=False`, its default; "
        "its event stream is judged in the `vllm-events` rows.",
        "policy-hits": _VLLM_HITS,
        "vectors: extras": "the cases `extras/embeds-placeholder-vs-token`: " + VLLM_EMBEDS_DECODE + ".",
        "policy-sharing": _VLLM_WINDOW_OF_ONE + " Here the second admission counts no hit, so it needs "
        "every block of the prompt and is refused where the spec's admission fits.",
        "retention-adequacy": _VLLM_WINDOW_OF_ONE + " Here the sliding group keeps no block at the "
        "replay boundary (none is needed), so vLLM finds nothing to stop on and the resend hits 0.",
    },
    "vllm-events": {
        **_VLLM,
        "policy-hits": _VLLM_HITS,
        "policy-sharing": _VLLM_WINDOW_OF_ONE + " Here the second admission counts no hit, so it needs "
        "every block of the prompt and is refused where the spec's admission fits.",
        "retention-adequacy": _VLLM_WINDOW_OF_ONE + " Here the sliding group keeps no block at the "
        "replay boundary (none is needed), so vLLM finds nothing to stop on and the resend hits 0.",
        "event-index": "a published bug of vLLM 0.33's event format with hybrid groups "
        "(vllm-project/vllm#44451, reported for Mamba align mode; fix proposed in vllm-project/vllm#44488, "
        "`BlockStored.block_offsets`, open): a sliding-window "
        "(or chunked) group keys only some entries of a prompt (the replay tail; skipped entries are "
        "null blocks), and `BlockPool.cache_full_blocks` (`vllm/v1/core/block_pool.py`) leaves the "
        "skipped blocks out of `block_hashes` and `extra_keys` (\"Skip null/masked-out blocks to match "
        "the length of new_hashes\") but not out of `token_ids`, which still spans `num_cached_blocks * "
        "block_size .. num_full_blocks * block_size`, and names the parent of block "
        "`num_cached_blocks - 1`, not of the first stored one. So a `sliding(4, 2)` prompt of 6 tokens "
        "publishes 2 keys with 6 tokens and `parent_block_hash=None`: a subscriber cannot tell which "
        "tokens each key holds, nor place the run (the keys and `cached_keys()` agree; the single-group "
        "rows, which skip nothing, pass).",
        "vectors: hybrid": "the same finding as `event-index`, reached by the shipped hybrid vectors: "
        "each one whose sliding or chunked group skips an entry gets a run with more tokens than keys. "
        "The cache itself passes them (the `vllm` rows).",
        "event-extras": "vLLM keys a LoRA block by the adapter's name *and path* (`(\"lora\", name, "
        "path)`, `kv_cache_utils._gen_lora_extra_hash_keys`, \"so that re-pointing a LoRA name at a "
        "different adapter does not reuse KV computed with the previous one\"), but its events carry the "
        "name only: `to_event_extra_keys` publishes each extra key untagged and drops the path, and "
        "`BlockStored.lora_name` is the bare name; the other LoRA field, `lora_id`, is deprecated "
        "(\"Retained for backward compatibility\") and the adapter's per-instance integer, which the "
        "key does not use. So two adapters of one name (the spec's `LoRA(\"a\", 1)` and "
        "`LoRA(\"a\", 2)`, mapped to two paths) get different keys and identical events: an indexer fed "
        "by them credits one adapter with the other's prefix. A finding of vLLM 0.33's event format, "
        "not of its cache (no `vllm` row fails on it). The untagged `extra_keys` alone would also confuse "
        "a LoRA `x` with a salt `x` (both `(\"x\",)`); `lora_name` tells those apart.",
        "vectors: extras": "two findings: the same as `event-extras`, reached by the shipped vectors "
        "`extras/lora-id-matters` (one LoRA name with two ids): vLLM's keys tell the two adapters "
        "apart, its events do not; and at `exact`, the cases `extras/embeds-placeholder-vs-token` "
        "(as in the `vllm` rows): " + VLLM_EMBEDS_DECODE + ".",
    },
    "sglang": dict(_SGLANG),
    "sglang-unified": dict(_SGLANG),
    "sglang-swa": {},
    "sglang-mamba": {},
    "sglang-extra-key": _SGLANG_EXTRA_KEY,
    # shipped (--engine sglang-unified-extra-key), not a matrix row: two more suite runs in
    # `nox -s engines` for the alias the sglang-extra-key rows publish (a test pins the unified tree)
    "sglang-unified-extra-key": dict(_SGLANG_EXTRA_KEY),
}

PASS_NOTE = "every property, vector group and check group the engine can be judged on passes."
