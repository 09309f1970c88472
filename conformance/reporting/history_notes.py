"""Explanations of the verdicts in ``docs/HISTORY.md`` (``pagedprefix history vllm``).

Each :class:`Note` says why failures of one shape occur on the releases it covers
(:mod:`pagedprefix.conformance.running.shapes`: the departing operation, the outcome, the extras
that differ): the file and line in *that* release's own code (found in the release's extracted
tree by a pattern, so the line is the release's, not a guess) and the public issue or pull
request where one exists. A failing case whose shape no note matches is printed as
``*unexplained*`` (never hidden).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..running.shapes import Shape
from .history_fetch import version_key


@dataclass(frozen=True)
class Pattern:
    """A set of counterexample shapes (:class:`~pagedprefix.conformance.running.shapes.Shape`):
    the departing operation among ``ops``, the outcome among ``outcomes``, -- unless
    ``extras_differ`` is ``None`` -- exactly these extra-key fields differing, for each regular
    expression in ``groups`` a config group (as written: ``sliding(1,2)``) it matches, -- unless
    ``hybrid`` is ``None`` -- a config with (``True``) or without (``False``) hybrid groups, and
    -- unless ``raised`` is ``None`` -- a crash raising that type."""

    ops: frozenset[str]
    outcomes: frozenset[str]
    extras_differ: tuple[str, ...] | None = None
    groups: tuple[str, ...] = ()
    raised: str | None = None
    hybrid: bool | None = None

    def matches(self, shape: Shape) -> bool:
        if shape.op not in self.ops or shape.outcome not in self.outcomes:
            return False
        if self.hybrid is not None and bool(shape.groups) != self.hybrid:
            return False
        if not all(any(re.search(p, g) for g in shape.groups) for p in self.groups):
            return False
        if self.raised is not None and shape.raised != self.raised:
            return False
        return self.extras_differ is None or shape.extras_differ == self.extras_differ


@dataclass(frozen=True)
class Note:
    """An explanation of the failures whose shape one of ``patterns`` matches, on releases
    ``first`` .. ``last`` (inclusive): matched by what the counterexample is, not by the property
    it fails, so two bugs failing one property get their own notes.

    ``text`` may hold ``{where}``: replaced by ``file`` line N, the first line of ``file`` in the
    release's tree that matches the regular expression ``pattern``.
    """

    name: str
    patterns: tuple[Pattern, ...]
    first: str
    last: str
    text: str
    file: str = ""
    pattern: str = ""
    references: tuple[str, ...] = ()

    def covers(self, version: str, shape: Shape) -> bool:
        key = version_key(version)
        in_range = version_key(self.first) <= key <= version_key(self.last)
        return in_range and any(p.matches(shape) for p in self.patterns)


def where(root: Path | None, file: str, pattern: str) -> str:
    """```file` line N`` of the first line matching ``pattern`` in the release at ``root``."""
    if not file:
        return ""
    path = root / file if root is not None else None
    if path is None or not path.is_file():
        return f"`{file}`"
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if re.search(pattern, line):
            return f"`{file}` line {n}"
    return f"`{file}` (pattern {pattern!r} not found: the note needs a look)"


_LORA_BY_NAME = (
    "A published bug of the release: it keys a LoRA block by the adapter's name alone "
    "(`_gen_lora_extra_hash_keys`, {where}: `[request.lora_request.lora_name]`), so two different "
    'adapters loaded under one name (the spec\'s `LoRA("a", 1)` and `LoRA("a", 2)`: two '
    "`lora_path`s, two `lora_int_id`s) share KV blocks, and a request of one adapter hits blocks "
    "computed with the other's weights. Introduced by vllm-project/vllm#27211 (0.11.1: the name "
    "instead of `lora_int_id`, for hashes stable across instances); reported as "
    'vllm-project/vllm#30931 ("Prefix Cache Corruption with LoRA with the same name but different '
    'id", on 0.11.1) and, for a same-name reload, vllm-project/vllm#42125. 0.31.0 keys '
    '`("lora", name, path)` ("so that re-pointing a LoRA name at a different adapter does not '
    'reuse KV computed with the previous one") and passes; the pull request that made that change '
    "was not found in the public record searched."
)

_TOUCH_BEFORE_CHECK = (
    "A published bug of the release: `allocate_slots` touches the computed (hit) blocks -- ref_cnt "
    "+1, out of the free queue -- before it checks that the new blocks fit ({where}), and returns "
    "`None` without undoing it, so a refused admission leaks a reference on every hit block (they "
    "can never be evicted again). Reported as vllm-project/vllm#11562, fixed by "
    'vllm-project/vllm#11565 ("Move the _touch(computed_blocks) call in the allocate_slots method to '
    'after the check for allocating new blocks").'
)

_UNTAGGED_EXTRA_KEYS = (
    "A published bug of the release: LoRA and `cache_salt` enter one block's extra keys as bare "
    "strings (`_gen_lora_extra_hash_keys` returns `[lora_name]`, and {where}), so a LoRA named \"x\" "
    "and a salt \"x\" give block 0 the same key: a base-model request salted \"x\" hits blocks computed "
    "with the adapter's weights, and the salt isolates nothing from that adapter. Reported as "
    "vllm-project/vllm#44701 (\"V1 prefix-cache extra-key domain collision between LoRA name and "
    "cache_salt\"), a tagging fix proposed in vllm-project/vllm#44706. 0.31.0 tags both "
    "(`(\"lora\", name, path)`, `(\"cache_salt\", salt)`) and passes."
)

_MM_PARENT_UNCHAINED = (
    "A published bug of the release: a block's key chains only its parent's hash value, computed "
    "from the parent's tokens without the parent's extra keys ({where}: `hash((parent_block_hash, "
    "*curr_block_token_ids))`), so two prompts with identical placeholder tokens but different images "
    "in one block give every later block the same key: a request hits the text blocks computed after "
    "the other image. Fixed by vllm-project/vllm#12603 (\"[v1][Bugfix] Add extra_keys to block_hash for "
    "prefix caching\", 0.7.1: \"to generate different hash value for two blocks with the same token "
    "string but different extra_keys in their parent blocks\")."
)

_MM_EMPTY_EXTRA_KEYS = (
    "A lost hit, not a wrong one: for a request with multimodal items, the extra keys of a block that "
    "holds no item are `()` ({where}: `return tuple(extra_keys), curr_mm_idx`), where a text-only "
    "request's are `None`, so the text blocks before an image are never shared with a text-only "
    "request of the same tokens (the spec shares them: an item keys only the blocks it overlaps, "
    "SEMANTICS.md section 2), and an admission that would fit with those hits is refused. Changed in "
    "0.7.3 by vllm-project/vllm#10957 (\"[V1] LoRA Support\": `generate_block_hash_extra_keys` returns "
    "`None` for a block without extra keys); no report of the lost sharing was found in the public "
    "record searched."
)

_EVENTS_LORA_ID_CRASH = (
    "A published bug of the release: with KV-cache events on, `BlockPool.cache_full_blocks` "
    "publishes `BlockStored(lora_id=request.lora_request.id)` ({where}), but `LoRARequest` has no "
    "`id` (its id is `lora_int_id`, or the `adapter_id` property), so the first LoRA request that "
    "fills a block raises `AttributeError` in the middle of the allocation: the engine fails the "
    "request instead of serving it. Fixed by vllm-project/vllm#27728 (\"[BugFix][LoRA] use "
    "adapter_id instead of id field of lora_request\", 0.11.1)."
)

_EVENTS_WITHOUT_EXTRAS = (
    "The release's `BlockStored` ({where}) carries the block's tokens, its parent and at most a LoRA "
    "(`lora_id`, from 0.14 also `lora_name`), but none of the other extra keys its key folds in "
    "(`cache_salt`, multimodal identifiers): two blocks with the same tokens and parent that differ "
    "only in a salt or an image get different keys and identical events, so an indexer fed by them "
    "credits one tenant or image with the other's prefix. Reported by the consumers "
    "(llm-d/llm-d-kv-cache#47: \"the `extra_keys` component is always null\"); vLLM added per-block "
    "`extra_keys` to `BlockStored` in vllm-project/vllm#33304 (0.17.0), from which these events "
    "tell the blocks apart."
)

_EVENTS_LORA_NAME_ONLY = (
    "The release keys a LoRA block by the adapter's name *and path* (`(\"lora\", name, path)`, "
    "`_gen_lora_extra_hash_keys`), but its events carry the name only ({where}; `to_event_extra_keys` "
    "drops the path): two adapters loaded under one name get different keys and identical events, so "
    "an indexer fed by them credits one adapter with the other's prefix. A finding of the event "
    "format, not of the cache (the keys are right); no report of it was found in the public record "
    "searched."
)

_EMBEDS_DECODE = (
    "A lost hit found by this suite, not in the public record searched: the release keys every "
    "block of a request with prompt embeddings by a SHA-256 of the block's rows of `prompt_embeds` "
    "({where}: `request.prompt_embeds[start_token_idx:end_token_idx]`), whether or not a position of "
    "the block is embedded, and a block past the prompt by the hash of an empty slice. So blocks of "
    "token positions only are never shared across that line: a text-only prompt does not hit the text "
    "blocks before an embedding, and a later prompt with the same tokens and embeddings does not hit "
    "the blocks the decode filled (the spec keys no embedding on a block without an embedded "
    "position)."
)

_NONE_HASH_INVERTED = (
    "A published bug of the release: the root of every key is chosen the wrong way round ({where}: "
    "`NONE_HASH = int.from_bytes(os.urandom(32), ...) if os.getenv('PYTHONHASHSEED') is not None "
    "else sha256(os.getenv('PYTHONHASHSEED'))`), against its own comment (\"a random seed if "
    "PYTHONHASHSEED is not set\"): with `PYTHONHASHSEED` set, two processes get different keys, so "
    "the pinned seed reproduces nothing; without it, every process gets `sha256(None)`, the same "
    "predictable root the random seed exists to avoid. Fixed by vllm-project/vllm#17088 (\"use random "
    "for NONE_HASH only when PYTHONHASHSEED not set\", 0.8.5)."
)

_WINDOW_OF_ONE = (
    "A real difference, not a published bug, only for a sliding window of one token (`W = 1`: each "
    "query attends to itself, so a hit needs `cdiv(W - 1, B) = 0` blocks of the group and the spec's "
    "lookup is valid at every boundary, SEMANTICS.md section 8): the release's "
    "`SlidingWindowManager.find_longest_cache_hit` ({where}) stops only on a cached block, so with "
    "none at the boundary it reports no hit (sound, not maximal), and an admission that counts no "
    "hit needs every block of its prompt. No released model has `W = 1`; the 0.33.0 rows of "
    "docs/MATRIX.md state the same difference."
)
_EVENTS_SPARSE_TOKENS = (
    "A published bug of the release's event format with hybrid groups: a sliding-window (or chunked) "
    "group keys only some entries of a prompt (the others are null blocks, skipped by a hit or by "
    "the window, or masked out by sparse retention), and `BlockPool.cache_full_blocks` leaves them "
    "out of `block_hashes` but not out of `token_ids` ({where}), which still spans every block from "
    "the first uncached one: a subscriber cannot tell which tokens each key holds, nor place the run. "
    "Reported as vllm-project/vllm#44451 (\"BlockStored token_ids can span skipped ... blocks while "
    "block_hashes omit them\", for Mamba align mode; the same code path for sliding windows), with a "
    "fix proposed in vllm-project/vllm#44488 (`BlockStored.block_offsets`), open in the public record "
    "searched."
)
_MM_DECODE_BOUNDARY = (
    "A lost hit of the release, published: the block that starts where an item ends counts as "
    "overlapping it when a decode fills it, because the key of a decode-filled block is generated "
    "from the last item on (`curr_mm_idx = -1`) and the overlap test is off by one ({where}: "
    "`start_token_idx > offset + length` where the block has passed the item at `>=`). A prompt "
    "hashes that block from the first item, finds it past the item and gives it no item key, so a "
    "later prompt with the same image and tokens never hits the block a decode filled (vector "
    "`extras/mm-placeholder-decode`). The off-by-one fix was proposed in vllm-project/vllm#36622 "
    "(\"Fix off-by-one in multimodal prefix cache hash boundary check\", closed) and landed with "
    "vllm-project/vllm#36708 (\"disambiguate multimodal prefix cache keys\", `>=` and the item's "
    "offset in the key) in 0.19.0, which passes."
)
_CHUNKED_NULL_PARENT = (
    "A published bug of the release: a chunked-local group's hit holds null blocks before the current "
    "chunk, and `BlockPool.cache_full_blocks` chains a new block's key from the block before it "
    "({where}: `assert prev_block.block_hash is not None`), so an admission that hits past a chunk "
    "boundary crashes. Reported as vllm-project/vllm#21992 (the same traceback, Llama 4's chunked "
    "attention with the hybrid manager); a fix was proposed in vllm-project/vllm#22209 (closed), and "
    "0.10.1 no longer chains from the block (keys come from `request.block_hashes`)."
)
_CHUNKED_KEEPS_LAST = (
    "A choice of the release, stated in its code, that holds one block more than the spec: a "
    "chunked-local group keeps the last cached block of a request even when it lies before the "
    "current chunk ({where}: \"Make sure we don't delete the last cached block\", kept to chain "
    "the next block's key), so a decode that crosses a chunk boundary releases one block fewer and "
    "allocates the next one elsewhere. Memory held, not a wrong hit. Removed by "
    "vllm-project/vllm#25431 (\"Unify `remove_skipped_blocks` by `get_last_useful_token`\", "
    "0.11.1), which passes."
)
_HITS = frozenset({"allocate", "lookup"})
_FILLS = frozenset({"allocate", "append"})
_WRONG_HIT = frozenset({"hit-other-content", "hit-more"})

NOTES: tuple[Note, ...] = (
    Note(
        "mm-decode-boundary",
        (Pattern(_HITS, frozenset({"hit-less"}), (), hybrid=False),),
        "0.6.6",
        "0.18.1",
        _MM_DECODE_BOUNDARY,
        "vllm/v1/core/kv_cache_utils.py",
        r"if start_token_idx > offset \+ length:",
        (
            "https://github.com/vllm-project/vllm/pull/36622",
            "https://github.com/vllm-project/vllm/pull/36708",
        ),
    ),
    Note(
        "chunked-null-parent",
        (Pattern(_FILLS, frozenset({"crashed"}), None, (r"^chunked\(",), "AssertionError"),),
        "0.10.0",
        "0.10.0",
        _CHUNKED_NULL_PARENT,
        "vllm/v1/core/block_pool.py",
        r"assert prev_block\.block_hash is not None",
        (
            "https://github.com/vllm-project/vllm/issues/21992",
            "https://github.com/vllm-project/vllm/pull/22209",
        ),
    ),
    Note(
        "chunked-keeps-last-block",
        (Pattern(frozenset({"append"}), frozenset({"tables"}), None, (r"^chunked\(",)),),
        "0.10.0",
        "0.11.0",
        _CHUNKED_KEEPS_LAST,
        "vllm/v1/core/single_type_kv_cache_manager.py",
        r"Make sure we don't delete the last cached block",
        ("https://github.com/vllm-project/vllm/pull/25431",),
    ),
    Note(
        "sliding-window-of-one",
        (
            Pattern(_HITS, frozenset({"hit-less", "retention-promise"}), None, (r"^sliding\(1,",)),
            Pattern(frozenset({"allocate"}), frozenset({"refused-spec-succeeds"}), None, (r"^sliding\(1,",)),
        ),
        "0.9.1",
        "0.34.0",
        _WINDOW_OF_ONE,
        "vllm/v1/core/single_type_kv_cache_manager.py",
        r"match_found = True",
    ),
    Note(
        "events-sparse-token-ids",
        (Pattern(_FILLS, frozenset({"event-tokens"}), None, (r"^(sliding|chunked)\(",)),),
        "0.20.0",
        "0.34.0",
        _EVENTS_SPARSE_TOKENS,
        "vllm/v1/core/block_pool.py",
        r"# Skip null",
        (
            "https://github.com/vllm-project/vllm/issues/44451",
            "https://github.com/vllm-project/vllm/pull/44488",
        ),
    ),
    Note(
        "none-hash-inverted",
        (Pattern(frozenset({""}), frozenset({"seed-promise"})),),
        "0.8.3",
        "0.8.4",
        _NONE_HASH_INVERTED,
        "vllm/v1/core/kv_cache_utils.py",
        r"^NONE_HASH = ",
        ("https://github.com/vllm-project/vllm/pull/17088",),
    ),
    Note(
        "embeds-decode-empty-slice",
        tuple(
            Pattern(ops, outcomes, differ)
            for differ in ((), ("prompt_embeds",))
            for ops, outcomes in (
                (_HITS, frozenset({"hit-less"})),
                (frozenset({"allocate"}), frozenset({"refused-spec-succeeds"})),
            )
        ),
        "0.21.0",
        "0.34.0",
        _EMBEDS_DECODE,
        "vllm/v1/core/kv_cache_utils.py",
        r"request\.prompt_embeds\[start_token_idx:end_token_idx\]",
    ),
    Note(
        "events-lora-id-crash",
        (Pattern(_FILLS, frozenset({"crashed"}), None, raised="AttributeError"),),
        "0.9.0",
        "0.11.0",
        _EVENTS_LORA_ID_CRASH,
        "vllm/v1/core/block_pool.py",
        r"lora_request\.id\b",
        ("https://github.com/vllm-project/vllm/pull/27728",),
    ),
    Note(
        "events-without-extras",
        tuple(Pattern(_FILLS, frozenset({"event-alike"}), (f,)) for f in ("cache_salt", "mm")),
        "0.9.0",
        "0.16.0",
        _EVENTS_WITHOUT_EXTRAS,
        "vllm/distributed/kv_events.py",
        r"^class BlockStored",
        (
            "https://github.com/llm-d/llm-d-kv-cache/issues/47",
            "https://github.com/vllm-project/vllm/pull/33304",
        ),
    ),
    Note(
        "events-lora-name-only",
        (Pattern(_FILLS, frozenset({"event-alike"}), ("lora.id",)),),
        "0.31.0",
        "0.34.0",
        _EVENTS_LORA_NAME_ONLY,
        "vllm/distributed/kv_events.py",
        r"lora_name:",
    ),
    Note(
        "lora-by-name",
        (Pattern(_HITS, _WRONG_HIT, ("lora.id",)),),
        "0.11.1",
        "0.30.0",
        _LORA_BY_NAME,
        "vllm/v1/core/kv_cache_utils.py",
        r"lora_request\.lora_name",
        (
            "https://github.com/vllm-project/vllm/issues/30931",
            "https://github.com/vllm-project/vllm/pull/27211",
        ),
    ),
    Note(
        "untagged-extra-keys",
        (Pattern(_HITS, _WRONG_HIT, ("lora.name", "lora.id", "cache_salt")),),
        "0.11.1",
        "0.30.0",
        _UNTAGGED_EXTRA_KEYS,
        "vllm/v1/core/kv_cache_utils.py",
        r"\[request\.cache_salt\]",
        (
            "https://github.com/vllm-project/vllm/issues/44701",
            "https://github.com/vllm-project/vllm/pull/44706",
        ),
    ),
    Note(
        "mm-parent-unchained",
        (Pattern(_HITS, _WRONG_HIT, ("mm",)),),
        "0.6.6",
        "0.7.0",
        _MM_PARENT_UNCHAINED,
        "vllm/v1/core/kv_cache_utils.py",
        r"hash\(\(parent_block_hash, \*curr_block_token_ids\)\)",
        ("https://github.com/vllm-project/vllm/pull/12603",),
    ),
    Note(
        "mm-empty-extra-keys",
        (
            Pattern(_HITS, frozenset({"hit-less"}), ("mm",)),
            Pattern(frozenset({"allocate"}), frozenset({"refused-spec-succeeds"}), ("mm",)),
        ),
        "0.6.6",
        "0.7.2",
        _MM_EMPTY_EXTRA_KEYS,
        "vllm/v1/core/kv_cache_utils.py",
        r"return tuple\(extra_keys\), curr_mm_idx",
        ("https://github.com/vllm-project/vllm/pull/10957",),
    ),
    Note(
        "touch-before-check",
        (Pattern(frozenset({"allocate"}), frozenset({"refused-but-changed"})),),
        "0.6.5",
        "0.6.6.post1",
        _TOUCH_BEFORE_CHECK,
        "vllm/v1/core/kv_cache_manager.py",
        r"self\._touch\(computed_blocks\)",
        (
            "https://github.com/vllm-project/vllm/issues/11562",
            "https://github.com/vllm-project/vllm/pull/11565",
        ),
    ),
)

UNEXPLAINED = "*unexplained*"


def note_for(version: str, shape: Shape) -> Note | None:
    """The note whose patterns match ``shape`` on ``version``, or ``None``."""
    return next((n for n in NOTES if n.covers(version, shape)), None)


def explain(version: str, shape: Shape, root: Path | None = None) -> tuple[str, str, list[str]]:
    """``(note name, text, references)`` for a failure of ``shape`` on ``version`` (lines from the
    tree at ``root``); ``("", "*unexplained*", [])`` when no note matches."""
    n = note_for(version, shape)
    if n is None:
        return "", UNEXPLAINED, []
    return n.name, n.text.replace("{where}", where(root, n.file, n.pattern)), list(n.references)
