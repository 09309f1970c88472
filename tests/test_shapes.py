"""The shape of a counterexample (conformance/running/shapes.py): the departing operation, the
outcome named by the judge's message, and the extra-key fields that differ from an earlier request
with the same first block."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pagedprefix.conformance.running.shapes import Shape, outcome_of, shape_from_json, shape_of
from pagedprefix.conformance.running.suite import CheckResult, failing_case

VECTORS = Path(__file__).parent.parent / "conformance" / "vectors"


def _case(case_id: str) -> dict[str, Any]:
    group = case_id.split("/")[0]
    cases = json.loads((VECTORS / f"{group}.json").read_text(encoding="utf-8"))["cases"]
    found: dict[str, Any] = next(c for c in cases if c["id"] == case_id)
    return found


@pytest.mark.parametrize(
    "message, outcome",
    [
        ("allocate(0, [1, 2, 1]) raised OutOfBlocks but changed ref_cnt: [1] -> [2]", "refused-but-changed"),
        ('allocate("a", [3]) hit 1 tokens, but position 0 holds KV of other content', "hit-other-content"),
        ("lookup([3, 1]) hit 1 tokens; the spec hits 0", "hit-more"),
        ("lookup([1, 2, 1, 1, 1]) hit 0 tokens; the spec hits 4", "hit-less"),
        ("allocate(0, [2]): engine OutOfBlocks (refused), spec succeeds", "refused-spec-succeeds"),
        ("something new", "other"),
    ],
)
def test_outcome_is_read_from_the_judges_words(message: str, outcome: str) -> None:
    assert outcome_of(message) == outcome


def test_shape_of_a_vector_case_names_the_step_and_the_differing_extras() -> None:
    case = _case("extras/lora-id-matters/b2")
    message = 'step 2: allocate("b", [10]) hit 6 tokens, but position 0 in block 0 holds KV of other content'
    assert shape_of(case, message) == Shape("allocate", "hit-other-content", ("lora.id",))
    # Step 1 is the lookup: the same earlier request, another operation.
    assert shape_of(case, "step 1: lookup([10]) hit 6 tokens; the spec hits 0") == Shape(
        "lookup", "hit-more", ("lora.id",)
    )
    salt = _case("extras/lora-x-vs-salt-x/b2")
    step = next(i for i, s in enumerate(salt["steps"]) if i and s.get("tokens"))
    got = shape_of(salt, f"step {step}: x hit 2 tokens; the spec hits 0")
    assert got.extras_differ == ("lora.name", "lora.id", "cache_salt")


def _lora(lora_id: int) -> dict[str, Any]:
    return {"name": "a", "id": lora_id}


def test_shape_of_a_saved_counterexample_is_that_of_its_case() -> None:
    """A minimal stateful counterexample is a vector file of one case ending at its violation."""
    case = {
        "config": {"block_size": 1},
        "steps": [
            {"op": "allocate", "request_id": "b", "tokens": [3], "extras": {"lora": _lora(1)}},
            {"op": "allocate", "request_id": "a", "tokens": [3, 2], "extras": {"lora": _lora(2)}},
        ],
    }
    message = 'allocate("a", [3, 2]) hit 1 tokens, but position 0 in block 0 holds KV of other content'
    want = Shape("allocate", "hit-other-content", ("lora.id",))
    assert shape_of({"cases": [case]}, message) == want
    # Another first block: that request could not have been hit, so its extras do not count.
    case["steps"][0]["tokens"] = [4]
    assert shape_of(case, message) == Shape("allocate", "hit-other-content")


def test_shape_without_steps_and_round_trip() -> None:
    assert shape_of(None, "hit 1 tokens; the spec hits 0") == Shape("", "hit-more")
    assert shape_of({"config_error": "x"}, "the spec raises InvalidConfig") == Shape("", "error-kind")
    shape = Shape("lookup", "hit-more", ("cache_salt",))
    assert shape_from_json(json.loads(json.dumps(shape.to_json()))) == shape
    assert shape.describe() == "lookup, hit-more, extras differ in cache_salt"
    with pytest.raises(ValueError):
        shape_from_json({"op": 1})


def test_a_shape_names_the_hybrid_groups_and_what_a_crash_raised() -> None:
    """Two bugs that both crash a fill differ in what they raise and in the config's groups: a
    shape keeps both, so a note for one never explains the other."""
    groups = [{"kind": "full", "block_size": 4}, {"kind": "sliding", "block_size": 4, "window": 6}]
    case = {
        "config": {"block_size": 4, "groups": groups},
        "steps": [{"op": "allocate", "request_id": "a", "tokens": [1, 2, 3, 4, 5]}],
    }
    message = "step 0: allocate(\"a\", [1, 2, 3, 4, 5]) crashed: AssertionError: "
    shape = shape_of(case, message)
    assert shape == Shape("allocate", "crashed", (), ("full(4)", "sliding(6,4)"), "AssertionError")
    assert shape.describe() == "allocate, crashed, groups full(4) + sliding(6,4), raised AssertionError"
    assert shape_from_json(json.loads(json.dumps(shape.to_json()))) == shape
    single = {"config": {"block_size": 4, "groups": groups[:1]}, "steps": case["steps"]}
    lora = shape_of(single, "step 0: allocate(...) crashed: AttributeError: no attribute 'id'")
    assert (lora.groups, lora.raised) == ((), "AttributeError")
    assert "groups" not in lora.to_json() and lora.to_json()["raised"] == "AttributeError"
    assert shape_of(case, "step 0: allocate hit 1 tokens; the spec hits 0").raised == ""


def test_a_vector_row_keeps_every_failing_case() -> None:
    """The report keeps every failing case of a row with its shape, not only the first."""
    case = _case("extras/lora-id-matters/b2")
    msg = "step 2: x hit 6 tokens, but position 0 in block 0 holds KV of other content"
    row = CheckResult("vectors: extras", "vectors", "fail", cases=[
        failing_case("extras/lora-id-matters/b2", "hit-content", msg, case),
        failing_case("extras/lora-id-matters/b4", "hit-content", msg, _case("extras/lora-id-matters/b4")),
    ])
    ids = [c["id"] for c in row.to_json()["cases"]]
    assert ids == ["extras/lora-id-matters/b2", "extras/lora-id-matters/b4"]
    want = {"op": "allocate", "outcome": "hit-other-content", "extras_differ": ["lora.id"]}
    assert row.cases[1]["shape"] == want


def test_a_suite_run_lists_every_failing_case_with_its_shape() -> None:
    """End to end: an engine that ignores the salt fails several extras vectors; the row keeps all
    of them (the count in its detail), and every case's shape says the salt is what differs."""
    from broken_engines import ignores_salt
    from pagedprefix.conformance.running.suite import SuiteOptions, run_suite

    report = run_suite(ignores_salt, SuiteOptions(stateful=False), "ignores-salt", extra_groups=[])
    [row] = [r for r in report.rows if r.name == "vectors: extras"]
    assert row.status == "fail"
    assert report.vectors is not None
    failed = sum(1 for r in report.vectors.results if r.group == "extras" and r.status == "fail")
    assert failed >= 2 and len(row.cases) == failed
    assert all("cache_salt" in c["shape"]["extras_differ"] for c in row.cases), row.cases
    assert {c["shape"]["op"] for c in row.cases} <= {"allocate", "lookup"}
