"""The conformance vectors: generated from the spec, complete, and passed by the spec and impl."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pagedprefix.conformance.judging.properties import PROFILES
from pagedprefix.conformance.protocol import Capabilities, PrefixCacheAdapter
from pagedprefix.conformance.protocol.adapters import impl, impl_available, spec, spec_capabilities
from pagedprefix.conformance.protocol.codec import ERROR_KINDS, config_from_json
from pagedprefix.conformance.running import vectors as V
from pagedprefix.spec import CacheConfig
from vector_support import user_case

needs_impl = pytest.mark.skipif(not impl_available(), reason="pagedprefix.impl.BlockManager is not built yet")


def all_cases() -> list[dict[str, Any]]:
    return [case for vf in V.load_dir(V.VECTOR_DIR) for case in vf.cases]


def test_committed_vectors_equal_a_regeneration(capsys: pytest.CaptureFixture[str]) -> None:
    assert V.main(["--check"]) == 0
    assert "identical to a regeneration" in capsys.readouterr().out


def test_check_fails_on_drift_and_on_stray_files(tmp_path: Path) -> None:
    assert V.main(["--out", str(tmp_path)]) == 0
    assert V.main(["--check", "--out", str(tmp_path)]) == 0
    cow = tmp_path / "cow.json"
    cow.write_text(cow.read_text().replace('"num_computed_tokens": 0', '"num_computed_tokens": 1', 1))
    assert V.main(["--check", "--out", str(tmp_path)]) == 1
    assert V.main(["--out", str(tmp_path)]) == 0
    (tmp_path / "stray.json").write_text("{}")
    assert V.main(["--check", "--out", str(tmp_path)]) == 1


def test_generation_is_deterministic() -> None:
    assert V.generate_all() == V.generate_all()


def test_files_carry_versions_and_cases_are_well_formed() -> None:
    files = V.load_dir(V.VECTOR_DIR)
    assert {vf.group for vf in files} == {
        "operations",
        "policies",
        "extras",
        "cow",
        "eviction",
        "errors",
        "keys",
        "random",
        "hybrid",
    }
    for path in sorted(V.VECTOR_DIR.glob("*.json")):
        doc = json.loads(path.read_text())
        # single-group files stay at schema 1; the hybrid file needs schema 2's optional fields
        assert doc["schema_version"] == (2 if path.stem == "hybrid" else V.SCHEMA_VERSION)
        assert doc["spec_version"] == V.spec_version()
    ids = [c["id"] for c in all_cases()]
    assert len(ids) == len(set(ids))
    for case in all_cases():
        assert case["profile"] in PROFILES
        assert case["section"] and case["description"]
        config_from_json(case["config"])
        if "config_error" not in case:
            assert case["steps"], case["id"]
            for step in case["steps"]:
                assert {"op", "expect"} <= set(step)
                tables = "group_tables" if "groups" in case["requires"] else "tables"
                assert {"error", "result", "num_free_blocks", tables, "pops"} <= set(step["expect"])


def test_coverage_of_the_vectors() -> None:
    cases = all_cases()
    assert len(cases) >= 150
    ops = Counter(s["op"] for c in cases for s in c.get("steps", []))
    assert set(ops) == {"allocate", "append", "fork", "free", "lookup", "reset", "new_step"}
    policies = {(c["config"]["free_order"], c["config"]["dedup_on_full"]) for c in cases}
    assert {
        ("unhashed_to_head", False),
        ("append_all", False),
        ("unhashed_to_head", True),
        ("append_all", True),
    } <= policies
    needs = {r for c in cases for r in c["requires"]}
    assert {"extra:lora", "extra:cache_salt", "extra:mm", "extra:prompt_embeds", "fork", "keys"} <= needs
    errors = {s["expect"]["error"] for c in cases for s in c.get("steps", [])} | {
        c.get("config_error") for c in cases
    }
    assert set(ERROR_KINDS) <= errors
    copies = [
        s
        for c in cases
        for s in c.get("steps", [])
        if s["op"] == "append" and s["expect"]["result"] and s["expect"]["result"]["copies"]
    ]
    assert len(copies) >= 20
    assert max(s["expect"]["evictions"] for c in cases for s in c.get("steps", [])) >= 3
    hits = [
        s
        for c in cases
        for s in c.get("steps", [])
        if s["expect"]["result"] and s["expect"]["result"].get("num_computed_tokens")
    ]
    assert len(hits) >= 100
    keyed = [c for c in cases if c["config"]["hash_algo"] == "xxh3_128"]
    assert keyed and all(c["config"]["hash_seed"] is not None for c in keyed)
    key_obs = [s["expect"]["keys"] for c in cases if "keys" in c["requires"] for s in c["steps"]]
    assert any(k for obs in key_obs for _, ks in obs for k in ks)


@pytest.mark.parametrize("profile", PROFILES)
def test_spec_passes_every_vector_at_every_profile(profile: str) -> None:
    report = V.run_vectors(spec, profile)
    statuses = Counter(r.status for r in report.results)
    assert report.errors == [] and statuses["fail"] == 0
    if profile == "single-namespace":
        skipped = report.by_status("skip")
        assert skipped and all("single-namespace" in r.message for r in skipped)
    else:
        assert statuses == {"pass": len(all_cases())}


@needs_impl
def test_impl_passes_every_vector_exactly() -> None:
    report = V.run_vectors(impl, "exact")
    failed = [(r.case_id, r.prop, r.message) for r in report.by_status("fail")]
    assert failed == []
    assert len(report.by_status("pass")) == len(all_cases())


class NoForkNoKeys:
    """The spec without fork, keys or LoRA: its cases needing them are skipped, not failed."""

    def __init__(self, config: CacheConfig) -> None:
        self.inner = spec(config)
        caps = spec_capabilities(config)
        self.capabilities = Capabilities(
            **{
                **caps.__dict__,
                "fork": False,
                "keys": False,
                "extras": frozenset({"cache_salt", "mm", "prompt_embeds"}),
            }
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_undeclared_capabilities_skip_cases_and_every_case_is_accounted_for() -> None:
    def factory(config: CacheConfig) -> PrefixCacheAdapter:
        adapter: PrefixCacheAdapter = NoForkNoKeys(config)  # type: ignore[assignment]
        return adapter

    report = V.run_vectors(factory, "exact")
    assert len(report.results) == len(all_cases())
    assert report.by_status("fail") == []
    skipped = {r.case_id: r.message for r in report.by_status("skip")}
    assert skipped["cow/fork-then-append-copies/dup/b2"] == "needs fork"
    assert skipped["keys/00"] == "needs keys"
    assert skipped["extras/lora-separates/b2"] == "needs extra:lora"
    assert "extras/salt-separates/b2" not in skipped


def test_extra_directories_run_user_vectors_and_report_bad_files(tmp_path: Path) -> None:
    builder = user_case("user/hit")
    builder.allocate("b", [1, 2, 4])
    doc = V.vector_file("user", "mine", [builder.build()])
    (tmp_path / "user.json").write_text(V.dumps(doc))
    report = V.run_vectors(spec, "exact", [tmp_path], builtin=False)
    assert [(r.case_id, r.status) for r in report.results] == [("user/hit", "pass")]
    assert doc["cases"][0]["steps"][1]["expect"]["result"] == {
        "block_table": [0, 2],
        "num_computed_tokens": 2,
    }

    old = dict(doc, spec_version="0.9")
    (tmp_path / "user.json").write_text(V.dumps(old))
    report = V.run_vectors(spec, "exact", [tmp_path], builtin=False)
    assert report.notes and "0.9" in report.notes[0]

    (tmp_path / "bad.json").write_text(json.dumps({"schema_version": 99, "cases": []}))
    report = V.run_vectors(spec, "exact", [tmp_path], builtin=False)
    assert report.errors and "schema_version" in report.errors[0] and not report.ok


def test_invalid_config_cases_need_the_factory_to_refuse() -> None:
    cases = [c for c in all_cases() if "config_error" in c]
    assert len(cases) >= 4
    for case in cases:
        assert V.run_case(spec, case, "core").status == "pass"

    def lax(config: CacheConfig) -> PrefixCacheAdapter:
        return spec(CacheConfig(4, 4))

    result = V.run_case(lax, cases[0], "core")
    assert (result.status, result.prop) == ("fail", "error-kinds")
