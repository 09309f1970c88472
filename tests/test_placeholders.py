"""The placeholder form of multimodal prompts (conformance/protocol/placeholders.py): the stated
input precondition of an engine that keys an item by its identifier alone (vLLM), and the suite
sending such an engine only prompts of that form -- generator, minimizer and vectors."""

from __future__ import annotations

import pickle
from dataclasses import replace
from typing import Any

import pytest
from pagedprefix import spec
from pagedprefix.conformance.judging.properties import Violation
from pagedprefix.conformance.protocol import Capabilities
from pagedprefix.conformance.protocol.placeholders import (
    MAX_EMBED_BYTES,
    MM_FORM,
    OTHER_TOKEN,
    PLACEHOLDER_TOKEN,
    Form,
    form_of,
    form_violation,
    item_length,
    placeholder_form,
    step_form_violation,
)
from pagedprefix.conformance.running.vectors import unmet_requirements
from pagedprefix.spec import Extras, MultiModalItem
from pagedprefix.spec.extras import canonical_mm_items

P = PLACEHOLDER_TOKEN


def _item(identifier: str, start: int) -> MultiModalItem:
    return MultiModalItem(identifier, start, item_length(identifier))


def test_item_length_is_one_per_identifier() -> None:
    assert {item_length("img-1")} == {item_length("img-1") for _ in range(3)}
    assert all(2 <= item_length(f"i{k}") <= 4 for k in range(50))


def test_form_violations_name_what_is_wrong() -> None:
    img = _item("img-1", 1)
    tokens = [5] + [P] * img.length + [6]
    assert form_violation(tokens, Extras(mm_items=(img,))) is None
    assert form_violation([5, 6], Extras()) is None
    wrong_length = MultiModalItem("img-1", 1, img.length + 1)
    assert "its identifier's length" in str(form_violation(tokens + [P], Extras(mm_items=(wrong_length,))))
    # an item position holding text, and a placeholder outside every item
    assert "inside an item holds token 9" in str(form_violation([5, 9] + [P] * (img.length - 1) + [6],
                                                                Extras(mm_items=(img,))))
    assert "outside every item holds token 0" in str(form_violation([P, 5], Extras()))


def test_placeholder_form_makes_any_prompt_valid_and_in_form() -> None:
    items = (MultiModalItem("img-1", 0, 1), MultiModalItem("img-2", 1, 1), MultiModalItem("img-1", 9, 1))
    tokens = [P, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    formed, extras = placeholder_form(tokens, Extras(mm_items=items))
    spec.check_extras(extras, len(formed))
    assert form_violation(formed, extras) is None
    first = extras.mm_items[0]
    assert first == _item("img-1", 0)
    # img-2 at 1 overlaps img-1 once it has its length; img-1 at 9 would reach past the prompt
    assert len(extras.mm_items) == 1
    assert formed[first.length] != P and formed[first.length:] == [OTHER_TOKEN if t == P else t
                                                                     for t in tokens[first.length:]]


def test_step_form_violation_reads_vector_steps() -> None:
    img = _item("img-2", 0)
    good = {"op": "allocate", "request_id": "a", "tokens": [P] * img.length,
            "extras": {"mm_items": [{"identifier": "img-2", "start": 0, "length": img.length}]}}
    assert step_form_violation(good) is None
    assert step_form_violation({**good, "tokens": [1] * img.length}) is not None
    assert step_form_violation({"op": "free", "request_id": "a"}) is None
    assert step_form_violation({"op": "lookup", "tokens": "bad"}) is None  # malformed: judged elsewhere
    assert step_form_violation({**good, "tokens": []}) is None


def _mm_case(tokens: list[int]) -> dict[str, Any]:
    length = item_length("img-1")
    return {
        "id": "x", "config": {"block_size": 2, "num_blocks": 8},
        "steps": [{"op": "allocate", "request_id": "a", "tokens": tokens, "expect": {},
                   "extras": {"mm_items": [{"identifier": "img-1", "start": 0, "length": length}]}}],
    }


def test_vector_cases_outside_the_form_are_skipped_for_a_placeholder_engine() -> None:
    caps = Capabilities(mm_placeholders=True)
    outside = _mm_case([3] * item_length("img-1") + [5])
    why = unmet_requirements(outside, caps, "exact")
    assert len(why) == 1
    assert why[0].startswith("multimodal keys by offset and length: not in the placeholder form (step 0:")
    assert unmet_requirements(outside, replace(caps, mm_placeholders=False), "exact") == []
    inside = _mm_case([P] * item_length("img-1") + [5])
    assert unmet_requirements(inside, caps, "exact") == []


def test_the_stateful_runner_sends_a_placeholder_engine_only_prompts_in_form() -> None:
    """The spec's own engine declaring ``mm_placeholders``: every allocate and lookup the runner
    sends is in the form, and multimodal prompts are sent (the channel is reached)."""
    from pagedprefix.conformance.protocol.adapters import SpecAdapter, spec_capabilities
    from pagedprefix.conformance.running.suite import SuiteOptions, run_suite

    sent: list[tuple[list[int], Extras]] = []

    class Recording(SpecAdapter):  # type: ignore[misc]
        def allocate(self, request_id: Any, tokens: Any, extras: Extras = spec.NO_EXTRAS) -> Any:
            sent.append((list(tokens), extras))
            return super().allocate(request_id, tokens, extras)

        def lookup(self, tokens: Any, extras: Extras = spec.NO_EXTRAS) -> int:
            sent.append((list(tokens), extras))
            return int(super().lookup(tokens, extras))

    def factory(config: spec.CacheConfig) -> Recording:
        adapter = Recording(config)
        adapter.capabilities = replace(spec_capabilities(config), mm_placeholders=True)
        return adapter

    options = SuiteOptions(max_examples=40, builtin_vectors=False)
    report = run_suite(factory, options, "placeholders", extra_groups=[])
    assert report.ok, [r for r in report.rows if r.status == "fail"]
    assert report.reached.get("mm", 0) > 0
    valid = [(t, e) for t, e in sent if _valid(t, e)]  # invalid inputs are the error probes
    assert len(valid) > len(sent) // 2
    assert all(form_violation(t, e) is None for t, e in valid)


def _valid(tokens: list[int], extras: Extras) -> bool:
    try:
        spec.check_tokens(tokens)
        spec.check_extras(extras, len(tokens))
    except spec.PrefixCacheError:
        return False
    return True


def test_a_violation_survives_pickling() -> None:
    """A violation raised in a matrix or history worker crosses the process boundary whole."""
    v = Violation("hit-content", "a message", "a detail")
    back = pickle.loads(pickle.dumps(v))
    assert (back.prop, back.message, back.detail, str(back)) == ("hit-content", "a message", "a detail",
                                                                  "[hit-content] a message")



def _coarse(extras: Extras, block_size: int) -> Extras:
    """Items keyed by identifier alone (as vLLM up to 0.32 keys them): the identifiers of the items
    that start in one block, as one item of one token at that block's start -- where an item lies
    inside its block and how long it is no longer count (later blocks inherit it through the parent)."""
    starts: dict[int, list[str]] = {}
    for m in canonical_mm_items(extras.mm_items):
        starts.setdefault(m.start - m.start % block_size, []).append(m.identifier)
    items = tuple(MultiModalItem("+".join(ids), start, 1) for start, ids in starts.items())
    return replace(extras, mm_items=items)


def _identifier_only(ignore_identifier: bool, declare: bool) -> Any:
    from pagedprefix.conformance.protocol.adapters import SpecAdapter, spec_capabilities

    class IdentifierOnly(SpecAdapter):  # type: ignore[misc]
        def _key_of(self, tokens: Any, extras: Extras) -> Extras:
            if not isinstance(extras, Extras) or not extras.mm_items or not _valid(list(tokens), extras):
                return extras
            if ignore_identifier:
                same = tuple(replace(m, identifier="img") for m in extras.mm_items)
                extras = replace(extras, mm_items=same)
            return _coarse(extras, self.block_size)

        def allocate(self, request_id: Any, tokens: Any, extras: Extras = spec.NO_EXTRAS) -> Any:
            return super().allocate(request_id, tokens, self._key_of(tokens, extras))

        def lookup(self, tokens: Any, extras: Extras = spec.NO_EXTRAS) -> int:
            return int(super().lookup(tokens, self._key_of(tokens, extras)))

    def factory(config: spec.CacheConfig) -> Any:
        adapter = IdentifierOnly(config)
        adapter.block_size = config.block_size
        caps = spec_capabilities(config, groups=False)
        adapter.capabilities = replace(caps, mm_placeholders=declare, input_errors=False, keys=False)
        return adapter

    return factory


@pytest.mark.parametrize(
    "ignore_identifier, declare, passes",
    [(False, True, True), (False, False, False), (True, True, False)],
    ids=["identifier-keys-declared", "identifier-keys-undeclared", "identifier-ignored-declared"],
)
def test_the_precondition_excuses_exactly_identifier_keying(
    ignore_identifier: bool, declare: bool, passes: bool
) -> None:
    """An engine keying an item by its identifier alone (offset and length left to the tokens)
    passes when it declares the placeholder form and FAILs a safety property when it does not; an
    engine that ignores the identifier FAILs even when it declares it (the precondition excuses the
    offset and the length, never the image)."""
    from pagedprefix.conformance.running.suite import SuiteOptions, run_suite

    factory = _identifier_only(ignore_identifier, declare)
    report = run_suite(factory, SuiteOptions(max_examples=150), "identifier-only", extra_groups=[])
    failing = {r.name for r in report.rows if r.status == "fail"}
    assert report.ok == passes, failing
    if not passes:
        assert failing & {"hit-content", "vectors: extras"}, failing


# ----- prompt embeddings in the placeholder form (Capabilities.embeds_placeholders) ----------------

EMBEDS = Form(mm=False, embeds=True)


def _embeds(*positions: int, data: bytes = b"\x01\x02") -> Extras:
    return Extras(prompt_embeds=spec.PromptEmbeds(positions, tuple(data for _ in positions)))


def test_embedded_positions_hold_the_placeholder_token() -> None:
    assert form_violation([5, P, 7], _embeds(1), EMBEDS) is None
    assert form_violation([5, 6, 7], _embeds(1), EMBEDS) == "position 1 is embedded but holds token 6"
    assert form_violation([P, 6, 7], _embeds(1), EMBEDS) == "position 1 is embedded but holds token 6"
    assert form_violation([P, P, 7], _embeds(1), EMBEDS) is None  # a real token 0 elsewhere: allowed
    assert form_violation([5, 6, 7], _embeds(1), MM_FORM) is None  # the mm form says nothing of embeds
    long = _embeds(1, data=b"x" * (MAX_EMBED_BYTES + 1))
    assert "at most 1022 in the form" in str(form_violation([5, P, 7], long, EMBEDS))
    tokens, extras = placeholder_form([5, 6, 0, 8], long, EMBEDS)
    assert tokens == [5, P, 0, 8] and extras.prompt_embeds is not None
    assert form_violation(tokens, extras, EMBEDS) is None
    assert len(extras.prompt_embeds.data[0]) == MAX_EMBED_BYTES
    both = Form(mm=True, embeds=True)
    assert form_violation([P, P, 7], _embeds(1), both) == "position 0 outside every item holds token 0"
    assert form_violation([OTHER_TOKEN, P, 7], _embeds(1), both) is None
    assert form_of(Capabilities()) is None and form_of(Capabilities(embeds_placeholders=True)) == EMBEDS


def test_vector_cases_outside_the_embeds_form_are_skipped_with_the_reason() -> None:
    case = {"config": {"block_size": 2, "num_blocks": 4}, "steps": [
        {"op": "allocate", "request_id": "a", "tokens": [5, 6, 7],
         "extras": {"prompt_embeds": {"positions": [1], "data": ["0102"]}}}]}
    caps = Capabilities(embeds_placeholders=True)
    assert unmet_requirements(case, caps, "exact") == [
        "token ids at embedded positions: not in the placeholder form (step 0: position 1 is embedded "
        "but holds token 6)"]
    assert unmet_requirements(case, Capabilities(), "exact") == []


def _embeds_engine(blind: bool, whole: bool = False, seen: list[Extras] | None = None) -> Any:
    """The spec declaring ``embeds_placeholders`` (and ``embeds_whole`` with ``whole``); ``blind``
    drops the embeddings from the key (an engine that reads neither the token id nor the embedding
    at an embedded position); ``seen`` collects the extras of every request with embeddings."""
    from pagedprefix.conformance.protocol.adapters import SpecAdapter, spec_capabilities

    class Embeds(SpecAdapter):  # type: ignore[misc]
        def _key_of(self, tokens: Any, extras: Extras) -> Extras:
            if blind and isinstance(extras, Extras) and _valid(list(tokens), extras):
                return replace(extras, prompt_embeds=None)
            return extras

        def allocate(self, request_id: Any, tokens: Any, extras: Extras = spec.NO_EXTRAS) -> Any:
            if seen is not None and isinstance(extras, Extras) and extras.prompt_embeds is not None:
                seen.append(replace(extras, lora=None, cache_salt=f"{len(tokens)}"))
            return super().allocate(request_id, tokens, self._key_of(tokens, extras))

        def lookup(self, tokens: Any, extras: Extras = spec.NO_EXTRAS) -> int:
            return int(super().lookup(tokens, self._key_of(tokens, extras)))

    def factory(config: spec.CacheConfig) -> Any:
        adapter = Embeds(config)
        caps = spec_capabilities(config, groups=False)
        adapter.capabilities = replace(
            caps, embeds_placeholders=True, embeds_whole=whole, input_errors=False, keys=False
        )
        return adapter

    return factory


@pytest.mark.parametrize("blind", [False, True], ids=["keys-embeddings", "ignores-embeddings"])
def test_the_embeds_precondition_excuses_the_token_ids_never_the_embedding(blind: bool) -> None:
    """vLLM's mixed prompts hold a sentinel at each embedded position: an engine declaring it is
    sent embedded positions holding token 0 (so keying the token there is moot), and still FAILs
    when it does not key the embedding itself."""
    from pagedprefix.conformance.running.suite import SuiteOptions, run_suite

    report = run_suite(_embeds_engine(blind), SuiteOptions(max_examples=150), "embeds", extra_groups=[])
    failing = {r.name for r in report.rows if r.status == "fail"}
    assert report.reached.get("prompt_embeds", 0) > 0
    assert report.ok != blind, failing
    if blind:  # a lookup hits past the embedding (policy-hits), the shipped vectors hit its block
        assert "vectors: extras" in failing and failing & {"hit-content", "policy-hits"}, failing


def test_the_embeds_form_drops_embeddings_past_the_prompt() -> None:
    """A prompt shorter than an earlier one keeps only the embeddings inside it (an engine without
    ``input_errors`` is never sent an invalid one: vLLM's ``prompt_embeds`` has no row there)."""
    tokens, extras = placeholder_form([1], _embeds(0, 5), EMBEDS)
    assert (tokens, extras.prompt_embeds) == ([P], spec.PromptEmbeds((0,), (b"\x01\x02",)))
    tokens, extras = placeholder_form([1], _embeds(5), EMBEDS)
    assert (tokens, extras.prompt_embeds) == ([1], None)


WHOLE = Form(mm=False, embeds=True, whole=True)


def test_the_whole_form_embeds_every_position_or_none() -> None:
    """vLLM 0.11.1 to 0.20.2 take embeddings for a whole prompt only: a prompt with embeddings is
    embedded at every position (a position that held a token gets that token's bytes, so prompts
    that differed in a token still differ), with no multimodal item; one without stays as it is."""
    tokens, extras = placeholder_form([5, 6, 7], _embeds(1), WHOLE)
    assert tokens == [P, P, P]
    assert extras.prompt_embeds == spec.PromptEmbeds((0, 1, 2), (b"t5", b"\x01\x02", b"t7"))
    assert form_violation(tokens, extras, WHOLE) is None
    partial = form_violation([P, P, 7], _embeds(1), WHOLE)
    assert partial == "embeddings at 1 of 3 positions (the whole prompt or none)"
    with_item = Extras(mm_items=(_item("img-1", 0),), prompt_embeds=extras.prompt_embeds)
    assert form_violation(tokens, with_item, WHOLE) == "multimodal items with prompt embeddings"
    assert placeholder_form(tokens, with_item, WHOLE)[1].mm_items == ()
    assert placeholder_form([5, 6], Extras(), WHOLE) == ([5, 6], Extras())
    assert form_of(Capabilities(embeds_placeholders=True, embeds_whole=True)) == Form(False, True, True)
    assert form_of(Capabilities(embeds_whole=True)) is None  # whole is a kind of the embeds form
    assert WHOLE.requirement() == "token ids at embedded positions, prompt embeddings for part of a prompt"


@pytest.mark.parametrize("blind", [False, True], ids=["keys-embeddings", "ignores-embeddings"])
def test_a_whole_prompt_engine_is_sent_only_whole_prompts(blind: bool) -> None:
    """An engine declaring ``embeds_whole`` is sent embeddings only for whole prompts (the generator
    and the minimizer keep to the form, the partial vector cases are skipped), and still FAILs when
    it does not key them."""
    from pagedprefix.conformance.running.suite import SuiteOptions, run_suite

    seen: list[Extras] = []
    options = SuiteOptions(max_examples=150)
    report = run_suite(_embeds_engine(blind, True, seen), options, "whole", extra_groups=[])
    assert report.reached.get("prompt_embeds", 0) > 0 and seen
    for extras in seen:
        assert extras.prompt_embeds is not None and not extras.mm_items
        assert extras.prompt_embeds.positions == tuple(range(int(extras.cache_salt)))
    failing = {r.name for r in report.rows if r.status == "fail"}
    assert report.ok != blind, failing
    skipped = " ".join(r.detail for r in report.rows if r.name == "vectors: extras")
    assert "prompt embeddings for part of a prompt" in skipped
