"""Counterexamples point at the right step (issue 22): the step where the engine's observable
state first departs from the spec's (when it precedes the violation), what ``step()`` changed
there, and which part of the content or key differs (tokens, parent chain, or only the extras).

The engines are corpus engines (tests/corpus): the clean tree, its ``StepPublishingTree`` variant
and its ``ConcatenatedNamespace`` and ``SkipsCopyOnWrite`` mutants; :class:`StepConcatenated`
combines the last two allowances/bugs the way SGLang's ``extra_key`` mapping does (a salt spelled
like a LoRA's key string shares its namespace; duplicates are swapped at ``step()``)."""

from __future__ import annotations

from dataclasses import replace

from corpus.mutants import ConcatenatedNamespace, SkipsCopyOnWrite
from corpus.variants import StepPublishingTree
from pagedprefix.conformance.generation.minimize import Replay, first_departure, render_failure, replay
from pagedprefix.conformance.judging.driver import Step
from pagedprefix.conformance.judging.judge import Judge, Req
from pagedprefix.conformance.judging.model import step_changes
from pagedprefix.spec import NO_EXTRAS, CacheConfig, Extras, LoRA


class StepConcatenated(StepPublishingTree, ConcatenatedNamespace):
    """Publishes at ``step()`` (swapping a duplicate page for the cached one, as SGLang's
    ``checkpoint_kv_cache`` does) and keys salt and LoRA as one untyped string."""

    capabilities = replace(ConcatenatedNamespace.capabilities, publish="step")


LORA = {"lora": {"id": 1, "name": "a"}}
ALIAS = {"cache_salt": "a#1"}  # the LoRA's key string in these engines (ConcatenatedNamespace)


def _replay(factory: object, config: CacheConfig, steps: list[Step], trace: bool = True) -> Replay:
    result = replay(factory, config, steps, "maximal", frozenset(), trace=trace)  # type: ignore[arg-type]
    assert result.violation is not None
    return result


def test_a_rewrite_at_step_is_shown_with_why_it_was_refused() -> None:
    """SGLang's accounting counterexample: the operation returns what the spec returns, the
    table is rewritten at step() onto a block of another namespace."""
    steps: list[Step] = [
        {"op": "allocate", "request_id": "l", "tokens": [2], "extras": LORA},
        {"op": "allocate", "request_id": 1, "tokens": [2], "extras": ALIAS},
    ]
    result = _replay(StepConcatenated, CacheConfig(block_size=1, num_blocks=2), steps)
    failure = render_failure(result, "maximal")
    assert failure.prop == "accounting"
    assert failure.message == (
        'after allocate(1, [2], {"cache_salt": "a#1"}), block_table(1) = [0], but the operation '
        "returned [1]; a rewrite is allowed only onto a block of the same content and extras, and "
        "block 0 (entry 0, position 0) differs: the tokens are equal, only the extras differ: "
        '{"lora": {"id": 1, "name": "a"}} in block 0, {"cache_salt": "a#1"} in this request'
    )
    lines = failure.sequence.splitlines()
    at = lines.index('   2. allocate(1, [2], {"cache_salt": "a#1"})')
    assert lines[at + 1 : at + 4] == [
        '      engine: {"block_table": [1], "num_computed_tokens": 0}   <-- violates accounting',
        "      step(): block_table(1) [1] -> [0]; num_free_blocks 0 -> 1",
        '      spec:   {"block_table": [1], "num_computed_tokens": 0}',
    ]
    assert "departs" not in failure.sequence  # the departure is the violating step itself
    assert first_departure(result) == (1, "num_free_blocks: engine 1, spec 0")
    # the first step() changed nothing: no line for it
    assert result.step_changes == [[], ["block_table(1) [1] -> [0]", "num_free_blocks 0 -> 1"]]
    # an untraced replay (the minimizer's) records no step() changes and renders none
    untraced = _replay(StepConcatenated, CacheConfig(block_size=1, num_blocks=2), steps, trace=False)
    assert untraced.step_changes == [[], []]
    assert "step():" not in render_failure(untraced, "maximal").sequence


def test_a_canonicalizing_rewrite_at_step_is_shown_and_accepted() -> None:
    """The same rewrite onto a block of the same content and extras is allowed (SEMANTICS
    section 6); it is still shown when a later step fails."""
    steps: list[Step] = [
        {"op": "allocate", "request_id": "l", "tokens": [2], "extras": LORA},
        {"op": "allocate", "request_id": 1, "tokens": [2], "extras": LORA},
        {"op": "allocate", "request_id": 2, "tokens": [2, 5], "extras": ALIAS},
    ]
    result = _replay(StepConcatenated, CacheConfig(block_size=1, num_blocks=3), steps)
    assert result.violation is not None and result.violation.prop == "hit-content"
    assert result.step_changes[1] == ["block_table(1) [1] -> [0]", "num_free_blocks 1 -> 2"]
    sequence = render_failure(result, "maximal").sequence
    assert "      step(): block_table(1) [1] -> [0]; num_free_blocks 1 -> 2\n" in sequence


def test_hit_content_says_the_tokens_are_equal_and_only_the_extras_differ() -> None:
    steps: list[Step] = [
        {"op": "allocate", "request_id": "a", "tokens": [1, 1, 1], "extras": LORA},
        {"op": "allocate", "request_id": "b", "tokens": [1, 1, 1], "extras": ALIAS},
    ]
    result = _replay(ConcatenatedNamespace, CacheConfig(block_size=2, num_blocks=4), steps)
    assert result.violation is not None and result.violation.prop == "hit-content"
    assert result.violation.message == (
        'allocate("b", [1, 1, 1], {"cache_salt": "a#1"}) hit 2 tokens, but position 0 in block 0 '
        "holds KV of other content: the tokens are equal, only the extras differ: "
        '{"lora": {"id": 1, "name": "a"}} in block 0, {"cache_salt": "a#1"} in this request'
    )


def test_the_departure_is_marked_when_it_precedes_the_violation() -> None:
    """Skipping copy-on-write departs at the first append (no copy, the shared block kept); the
    violation is found only when the other request writes."""
    steps: list[Step] = [
        {"op": "allocate", "request_id": "a", "tokens": [1]},
        {"op": "fork", "parent_id": "a", "child_id": "b"},
        {"op": "append", "request_id": "b", "tokens": [2]},
        {"op": "append", "request_id": "a", "tokens": [3]},
    ]
    result = _replay(SkipsCopyOnWrite, CacheConfig(block_size=2, num_blocks=4), steps)
    assert result.violation is not None and result.violation.prop == "cow-isolation"
    lines = render_failure(result, "maximal").sequence.splitlines()
    assert lines[lines.index('   3. append("b", [2])') + 1] == (
        '      engine: {"block_table": [0], "copies": []}   '
        "<-- departs from the spec here (block_table: engine [0], spec [1])"
    )
    assert lines[lines.index('   4. append("a", [3])') + 1] == (
        '      engine: {"block_table": [0], "copies": []}   <-- violates cow-isolation'
    )
    assert result.violation.message.endswith(
        "which request 'b' reads as its position 1: the tokens differ at position 1: 3 in the write, "
        "2 in request 'b'"
    )


def test_a_canonicalizing_rewrite_departs_without_violating() -> None:
    """The clean variant swaps its duplicate page at step() (allowed: the same content), so its
    free count departs from the spec's (``dedup_on_full=False`` keeps the duplicate): a
    departure is what differs, not a verdict."""
    steps: list[Step] = [
        {"op": "allocate", "request_id": "a", "tokens": [1, 2]},
        {"op": "allocate", "request_id": "b", "tokens": [1, 2]},
    ]
    config = CacheConfig(block_size=1, num_blocks=4)
    result = replay(StepPublishingTree, config, steps, "maximal", frozenset(), trace=True)
    assert result.violation is None
    assert first_departure(result) == (1, "num_free_blocks: engine 2, spec 1")
    assert result.step_changes == [[], ["block_table('b') [0, 2] -> [0, 1]", "num_free_blocks 1 -> 2"]]


def test_differs_names_the_token_the_parent_chain_and_the_position() -> None:
    judge = Judge(CacheConfig(block_size=2, num_blocks=4), "core")

    def idents(tokens: list[int], extras: Extras = NO_EXTRAS) -> list[int]:
        req = Req(list(tokens), extras, [])
        judge._extend_idents(req, tokens)
        return req.idents

    a, b = idents([1, 2, 3, 4]), idents([1, 9, 3, 4])
    assert judge.differs(a[3], b[3], first=2) == (
        "the tokens differ at position 1: 2 in the block, 9 in this request "
        "(the parent chain differs: the block's own tokens are equal)"
    )
    c = idents([1, 9, 3, 5])
    assert judge.differs(a[3], c[3], first=2) == (
        "the tokens differ at position 1: 2 in the block, 9 in this request "
        "(the parent chain differs: the block's own tokens differ too)"
    )
    assert judge.differs(a[1], b[1]) == "the tokens differ at position 1: 2 in the block, 9 in this request"
    assert judge.differs(a[2], a[3]) == (
        "the tokens agree, but the block holds the KV of position 2 where this request reads position 3"
    )
    s = idents([1, 2], Extras(cache_salt="s"))
    lora = idents([1, 2], Extras(lora=LoRA("x", 7), cache_salt="s"))
    assert judge.differs(s[1], lora[1]) == (
        'the tokens are equal, only the extras differ: {"cache_salt": "s"} in the block, '
        '{"cache_salt": "s", "lora": {"id": 7, "name": "x"}} in this request'
    )
    assert judge.differs(a[1], s[1]) == (
        'the tokens are equal, only the extras differ: no extras in the block, {"cache_salt": "s"} in '
        "this request"
    )
    assert judge.differs(None, a[0]) == "it was never written"


def test_step_changes_lists_rewritten_tables_and_the_free_count() -> None:
    before = {"num_free_blocks": 0, "tables": [[1, [1]], ["c", [0]]]}
    after = {"num_free_blocks": 1, "tables": [[1, [0]], ["c", [0]]]}
    assert step_changes(before, after) == ["block_table(1) [1] -> [0]", "num_free_blocks 0 -> 1"]
    assert step_changes(after, after) == []
