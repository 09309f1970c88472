"""Unit tests of the comparison rules: renaming, precedence, levels, capabilities, the checker."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from pagedprefix.conformance.judging.judge import Judge, Renaming, first_error
from pagedprefix.conformance.judging.model import EngineRun, SpecModel, effective_level
from pagedprefix.conformance.judging.properties import Violation
from pagedprefix.conformance.protocol import Capabilities
from pagedprefix.conformance.protocol.codec import extras_from_json, extras_to_json, make_error
from pagedprefix.spec import CacheConfig, Extras, LoRA, MultiModalItem, OutOfBlocks, PromptEmbeds

sys.path.insert(0, str(Path(__file__).parent))
import broken_engines


def test_renaming_is_one_bijection_for_the_whole_run() -> None:
    r = Renaming()
    assert r.pair(0, 5) and r.pair(1, 6) and r.pair(0, 5)
    assert not r.pair(0, 6)  # spec 0 is engine 5
    assert not r.pair(2, 5)  # engine 5 is spec 0
    assert r.s2e == {0: 5, 1: 6} and r.e2s == {5: 0, 6: 1}


@pytest.mark.parametrize(
    ("step", "want"),
    [
        ({"op": "allocate", "request_id": None, "tokens": []}, "InvalidRequestId"),
        ({"op": "allocate", "request_id": "a", "tokens": [-1]}, "DuplicateRequest"),
        ({"op": "allocate", "request_id": "b", "tokens": [], "extras": {"cache_salt": 1}}, "InvalidTokens"),
        ({"op": "allocate", "request_id": "b", "tokens": [1], "extras": {"cache_salt": 1}}, "InvalidExtras"),
        ({"op": "allocate", "request_id": True, "tokens": [1]}, "InvalidRequestId"),
        ({"op": "fork", "parent_id": "ghost", "child_id": "a"}, "UnknownRequest"),
        ({"op": "fork", "parent_id": "a", "child_id": "a"}, "DuplicateRequest"),
        ({"op": "append", "request_id": "1", "tokens": [1]}, "UnknownRequest"),
        ({"op": "append", "request_id": "a", "tokens": "ab"}, "InvalidTokens"),
        ({"op": "lookup", "tokens": [2**32]}, "InvalidTokens"),
        ({"op": "free", "request_id": 1.5}, "InvalidRequestId"),
        ({"op": "allocate", "request_id": "b", "tokens": [1, 2]}, None),
        ({"op": "reset"}, None),
    ],
)
def test_first_error_follows_the_spec_precedence(step: dict[str, Any], want: str | None) -> None:
    from pagedprefix.conformance.judging.judge import Req

    live = {"a": Req([1], Extras(), [[0]])}
    assert first_error(step, live) == want


def test_effective_level_lowers_for_undeclared_claims() -> None:
    cfg = CacheConfig(4, 8)
    full = Capabilities(exact_ids=True)
    assert effective_level("exact", full, cfg) == "exact"
    assert effective_level("exact", Capabilities(), cfg) == "lru"
    assert effective_level("lru", Capabilities(free_order="append_all"), cfg) == "maximal"
    assert effective_level("exact", Capabilities(free_order="other", dedup_on_full=None), cfg) == "maximal"
    assert effective_level("single-namespace", full, cfg) == "core"


def test_capabilities_json_round_trip_and_typo_rejection() -> None:
    caps = Capabilities(
        fork=False, extras=frozenset({"mm"}), free_order="other", dedup_on_full=None, publish="step"
    )
    assert Capabilities.from_json(caps.to_json()) == caps
    assert Capabilities.from_json({}) == Capabilities()
    with pytest.raises(ValueError, match="unknown capability"):
        Capabilities.from_json({"forks": True})
    with pytest.raises(ValueError):
        Capabilities.from_json({"free_order": "fifo"})


def test_extras_codec_round_trip_and_malformed_passthrough() -> None:
    extras = Extras(
        lora=LoRA("a", 3),
        cache_salt="s",
        mm_items=(MultiModalItem("i", 1, 2),),
        prompt_embeds=PromptEmbeds((0,), (b"\x01\x02",)),
    )
    assert extras_from_json(extras_to_json(extras)) == extras
    assert extras_to_json(Extras()) == {}
    bad = extras_from_json({"cache_salt": 5, "lora": {"name": "", "id": -1}})
    assert bad.cache_salt == 5 and bad.lora == LoRA("", -1)
    assert extras_from_json("salt") == "salt"
    err = make_error("OutOfBlocks", "full", {"needed": 2, "available": 1, "never_fits": False})
    assert isinstance(err, OutOfBlocks) and err.needed == 2 and str(err) == "full"


def test_core_checker_catches_a_hit_on_other_content() -> None:
    """Feed the judge an outcome claiming a hit on a block holding other tokens."""
    config = CacheConfig(2, 8)
    judge = Judge(config, "core")
    obs0 = {"num_free_blocks": 8, "tables": []}
    judge.start(obs0, None)
    from pagedprefix.conformance.judging.driver import Outcome

    step = {"op": "allocate", "request_id": "a", "tokens": [1, 2, 3]}
    judge.check(
        step,
        Outcome(result={"num_computed_tokens": 0, "block_table": [0, 1]}),
        {"num_free_blocks": 6, "tables": [["a", [0, 1]]]},
        None,
    )
    step = {"op": "allocate", "request_id": "b", "tokens": [1, 9, 3]}
    with pytest.raises(Violation) as info:
        judge.check(
            step,
            Outcome(result={"num_computed_tokens": 2, "block_table": [0, 2]}),
            {"num_free_blocks": 5, "tables": [["a", [0, 1]], ["b", [0, 2]]]},
            None,
        )
    assert info.value.prop == "hit-content"


def test_accounting_and_progress_checks() -> None:
    from pagedprefix.conformance.judging.driver import Outcome

    judge = Judge(CacheConfig(2, 4), "core")
    with pytest.raises(Violation) as info:
        judge.start({"num_free_blocks": 3, "tables": []}, None)
    assert info.value.prop == "accounting"

    judge = Judge(CacheConfig(2, 4), "core")
    judge.start({"num_free_blocks": 4, "tables": []}, None)
    with pytest.raises(Violation) as info:
        judge.check(
            {"op": "allocate", "request_id": "a", "tokens": [1, 2, 3]},
            Outcome(error="OutOfBlocks"),
            {"num_free_blocks": 4, "tables": []},
            None,
        )
    assert info.value.prop == "progress"


def test_lru_compares_up_to_renaming_and_exact_requires_identity() -> None:
    config = CacheConfig(2, 4)
    model = SpecModel(config)
    from pagedprefix.conformance.judging.driver import Outcome

    for level, table, prop in (
        ("lru", [3, 2], None),
        ("exact", [3, 2], "exact-ids"),
        ("exact", [0, 1], None),
    ):
        model = SpecModel(config)
        judge = Judge(config, level)
        judge.start({"num_free_blocks": 4, "tables": []}, model.observe())
        step = {"op": "allocate", "request_id": "a", "tokens": [1, 2, 3]}
        _, expect = model.do(step)
        obs = {"num_free_blocks": 2, "tables": [["a", table]]}
        outcome = Outcome(result={"num_computed_tokens": 0, "block_table": table})
        if prop is None:
            judge.check(step, outcome, obs, expect)
        else:
            with pytest.raises(Violation) as info:
                judge.check(step, outcome, obs, expect)
            assert info.value.prop == prop


def _drive(factory: Any, config: CacheConfig, level: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    model = SpecModel(config)
    run = EngineRun.start(factory, config, level, model.observe())
    expect: dict[str, Any] = {}
    for step in steps:
        _, expect = model.do(step)
        run.do(step, expect)
    return expect


def test_maximal_compares_hits_only_without_pressure() -> None:
    """``pops`` counts blocks taken for new content; past num_blocks a shorter hit is allowed."""
    forgets = broken_engines.forgets_on_free
    a = [{"op": "allocate", "request_id": "a", "tokens": [1, 2, 3]}, {"op": "free", "request_id": "a"}]
    with pytest.raises(Violation) as info:
        _drive(forgets, CacheConfig(2, 8), "maximal", [*a, {"op": "lookup", "tokens": [1, 2, 3]}])
    assert info.value.prop == "maximal-hits"
    _drive(forgets, CacheConfig(2, 8), "core", [*a, {"op": "lookup", "tokens": [1, 2, 3]}])
    churn = [
        {"op": "allocate", "request_id": "x", "tokens": [7]},
        {"op": "free", "request_id": "x"},
        {"op": "allocate", "request_id": "y", "tokens": [8]},
    ]
    expect = _drive(
        forgets, CacheConfig(2, 3), "maximal", [*a, *churn, {"op": "lookup", "tokens": [1, 2, 3]}]
    )
    assert expect["pops"] == 4 and expect["evictions"] == 0
    assert expect["result"] == {"num_computed_tokens": 2}
