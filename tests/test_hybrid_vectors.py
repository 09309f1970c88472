"""The committed hybrid vectors carry HYBRID.md's worked examples with their numbers.

The generator asserts each number on the spec when it records a case
(``conformance/generation/_hybrid_scenarios.py``); this test reads the committed file, independently of the
generator, so a regenerated file that lost a number fails here too. It also checks the hybrid
file's schema and what a single-group engine does with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pagedprefix.conformance.generation.vector_format import HYBRID_SCHEMA_VERSION
from pagedprefix.conformance.protocol.adapters import spec
from pagedprefix.conformance.running import vectors as V

HYBRID = V.VECTOR_DIR / "hybrid.json"

# case id -> the hits of its lookups, in order (HYBRID.md section 2.3)
LOOKUPS: dict[str, list[int]] = {
    "hybrid/e1/cached-0123": [16],
    "hybrid/e1/cached-012": [12],
    "hybrid/e1/cached-023": [16],
    "hybrid/e1/cached-3": [0],
    "hybrid/e1/cached-0": [4],
    "hybrid/e1/cached-013": [8],
    "hybrid/e2/full-and-swa": [8],
    "hybrid/e3/different-block-sizes": [24],
    "hybrid/e4/sibling-below-the-tail/replay": [0, 24],
    "hybrid/e4/sibling-below-the-tail/dense": [24, 24],
    "hybrid/e5/mamba-three-sightings/replay": [24, 24, 0, 16],
    "hybrid/e5/mamba-three-sightings/dense": [24, 24, 16, 16],
    "hybrid/e5/abort-before-new-step": [0, 24],
    "hybrid/e6/chunked-local": [20, 16],
    "hybrid/e6/chunked-alone-needs-nothing": [16],
    "hybrid/e7/three-kinds": [8],
    "hybrid/e8/empty-intersection": [0],
    "hybrid/e9/dsv4-dense-segments": [512],
    "hybrid/e9/dsv4-replay-collapse": [1280, 0, 0],
    "hybrid/e10/block-aligned-cap": [16, 16],
    "hybrid/lookup/equal-spec-groups-hit-jointly": [16, 12],
    "hybrid/free/group_major-then-pressure": [0],
    "hybrid/free/reversed_concat-then-pressure": [0],
}


def cases() -> dict[str, dict]:  # type: ignore[type-arg]
    return {c["id"]: c for c in json.loads(HYBRID.read_text())["cases"]}


def test_every_worked_example_keeps_its_numbers() -> None:
    found = cases()
    assert set(LOOKUPS) <= set(found)
    for case_id, hits in LOOKUPS.items():
        got = [
            s["expect"]["result"]["num_computed_tokens"]
            for s in found[case_id]["steps"]
            if s["op"] == "lookup"
        ]
        assert got == hits, case_id


def test_e5_defers_a_same_step_state_and_e9_e10_count_orphans() -> None:
    found = cases()
    e5 = found["hybrid/e5/mamba-three-sightings/replay"]["steps"]
    assert [s["expect"]["error"] for s in e5[:4]] == [None, "Deferred", None, None]
    assert [s["op"] for s in e5[:4]] == ["allocate", "allocate", "lookup", "new_step"]
    e10 = found["hybrid/e10/block-aligned-cap"]["steps"]
    assert [s["expect"]["orphans"] for s in e10] == [1, 1, 1, 0]  # B's junction (32) keeps the tail at 32
    assert found["hybrid/e9/dsv4-replay-collapse"]["steps"][-1]["expect"]["orphans"] == 26
    for order in ("group_major", "reversed_concat"):
        assert found[f"hybrid/free/{order}-then-pressure"]["steps"][-1]["expect"]["orphans"] == 4


def test_e3_and_e9_list_the_retained_blocks() -> None:
    """E3: dense keys SWA blocks 1, 3, 5 (its keys observation: the other entries have none)."""
    e3 = cases()["hybrid/e3/different-block-sizes"]
    keys = e3["steps"][0]["expect"]["keys"][0][1]
    assert [j for j, k in enumerate(keys[1]) if k is not None] == [1, 3, 5]
    assert [j for j, k in enumerate(keys[0]) if k is not None] == [0, 1, 2]


def test_the_hybrid_file_is_schema_2_and_the_others_stay_1() -> None:
    versions = {p.stem: json.loads(p.read_text())["schema_version"] for p in V.VECTOR_DIR.glob("*.json")}
    assert versions.pop("hybrid") == HYBRID_SCHEMA_VERSION == 2
    assert set(versions.values()) == {1}


def test_an_unknown_schema_is_refused(tmp_path: Path) -> None:
    doc = json.loads(HYBRID.read_text())
    doc["schema_version"] = 3
    (tmp_path / "h.json").write_text(json.dumps(doc))
    with pytest.raises(V.VectorFormatError, match="schema_version"):
        V.load_file(tmp_path / "h.json")


def test_the_spec_passes_the_hybrid_file_at_every_profile() -> None:
    for profile in ("core", "maximal", "exact"):
        report = V.run_vectors(spec, profile, directories=[], builtin=True)
        hybrid = [r for r in report.results if r.group == "hybrid"]
        assert hybrid and all(r.status == "pass" for r in hybrid), profile
