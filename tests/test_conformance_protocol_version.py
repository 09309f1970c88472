"""The adapter-protocol version: what each version added, and the warning a stale adapter gets."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import sys
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import typer
from pagedprefix.conformance.cli import register
from pagedprefix.conformance.judging.model import adapter_capabilities
from pagedprefix.conformance.judging.properties import Violation
from pagedprefix.conformance.protocol import (
    ADAPTER_PROTOCOL_VERSION,
    CAPABILITY_VERSIONS,
    Capabilities,
    protocol_warning,
)
from pagedprefix.conformance.protocol.adapters import RADIX_CAPABILITIES, spec_capabilities
from pagedprefix.conformance.running.suite import SuiteOptions, render_plain, run_suite
from pagedprefix.spec import CacheConfig
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from test_conformance_runner import readme_engine

CHANGELOG = Path(__file__).parents[1] / "conformance" / "CHANGELOG.md"


def test_every_capability_field_has_the_version_that_added_it() -> None:
    fields = {f.name for f in dataclasses.fields(Capabilities)} - {"protocol_version"}
    assert set(CAPABILITY_VERSIONS) == fields
    assert set(CAPABILITY_VERSIONS.values()) == set(range(1, ADAPTER_PROTOCOL_VERSION + 1))


def test_changelog_names_each_capability_under_its_version() -> None:
    text = CHANGELOG.read_text(encoding="utf-8")
    sections = dict(
        (int(m.group(1)), m.group(2))
        for m in re.finditer(r"^## Version (\d+)\b(.*?)(?=^## Version |\Z)", text, re.M | re.S)
    )
    assert sorted(sections) == list(range(1, ADAPTER_PROTOCOL_VERSION + 1))
    listed: dict[int, set[str]] = {}
    for version, body in sections.items():
        heads = re.findall(r"^- ((?:`\w+`,? ?)+)\(new", body, re.M)
        if version == 1:
            heads = re.findall(r"^- Capabilities: (.*?)\.$", body, re.M | re.S)
        listed[version] = {n for head in heads for n in re.findall(r"`(\w+)`", head)}
    expected = {v: {n for n, nv in CAPABILITY_VERSIONS.items() if nv == v} for v in sections}
    assert listed == expected


def test_current_declaration_is_silent_and_builtin_adapters_declare_it() -> None:
    cfg = CacheConfig(block_size=4, num_blocks=8)
    assert protocol_warning(Capabilities(protocol_version=ADAPTER_PROTOCOL_VERSION)) is None
    assert protocol_warning(spec_capabilities(cfg)) is None
    assert protocol_warning(RADIX_CAPABILITIES) is None
    assert protocol_warning(readme_engine().capabilities) is None
    from pagedprefix.conformance.engines import sglang, vllm

    assert protocol_warning(vllm.CAPABILITIES) is None
    assert protocol_warning(sglang.CAPABILITIES) is None


def test_undeclared_version_is_1_and_names_every_later_default() -> None:
    caps = Capabilities()
    assert caps.protocol_version == 1 and Capabilities.from_json({}).protocol_version == 1
    line = protocol_warning(caps)
    assert line is not None and "\n" not in line
    assert f"protocol_version 1 (this suite: {ADAPTER_PROTOCOL_VERSION})" in line
    for name, version in CAPABILITY_VERSIONS.items():
        assert (f" {name} (v{version})" in line) == (version > 1), name
    assert "conformance/CHANGELOG.md" in line


def test_only_later_capabilities_left_at_default_are_named() -> None:
    caps = Capabilities(publish_decode="free", lookup=False, protocol_version=2, fork=False)
    line = protocol_warning(caps)
    assert line is not None
    named = set(re.findall(r"(\w+) \(v\d\)", line))
    later = {"events", "groups", "retention", "group_free_order", "same_step_state", "mm_placeholders",
             "embeds_placeholders", "event_removal", "engine_keys", "seed_env", "seed_pinned",
             "seed_unpinned", "seed_source", "embeds_whole"}
    assert named == later
    # every later capability declared away from its default: the line names none, still warns
    declared = Capabilities(events=True, groups=frozenset({"full"}), retention="dense",
                            group_free_order="reversed_concat", same_step_state="miss", mm_placeholders=True,
                            embeds_placeholders=True, event_removal="last_copy", engine_keys=True,
                            seed_env="SEED", embeds_whole=True,
                            seed_pinned="equal", seed_unpinned="differ", seed_source="its docs",
                            protocol_version=3)
    line = protocol_warning(declared)
    assert line is not None and "left at their defaults" not in line
    assert "protocol_version 3" in line


def test_newer_version_than_the_suite_knows_is_a_warning() -> None:
    line = protocol_warning(Capabilities(protocol_version=ADAPTER_PROTOCOL_VERSION + 1))
    assert line is not None and "\n" not in line
    assert f"newer than this suite's {ADAPTER_PROTOCOL_VERSION}" in line and "upgrade pagedprefix" in line


@pytest.mark.parametrize("bad", [0, -1, True, "4", 2.0, None])
def test_malformed_version_is_rejected(bad: Any) -> None:
    with pytest.raises(ValueError, match="protocol_version"):
        Capabilities.from_json({"protocol_version": bad})
    caps = Capabilities(protocol_version=bad)
    with pytest.raises(ValueError, match="protocol_version must be an int >= 1"):
        caps.check()
    engine = types.SimpleNamespace(capabilities=caps)
    for m in ("allocate", "append", "fork", "free", "lookup", "reset_prefix_cache", "block_table",
              "num_free_blocks", "ref_cnt", "free_blocks", "block_hash", "step"):
        setattr(engine, m, lambda *a: None)
    with pytest.raises(Violation, match="protocol_version"):
        adapter_capabilities(engine)


def test_json_round_trip_keeps_the_version() -> None:
    caps = Capabilities(protocol_version=3)
    assert caps.to_json()["protocol_version"] == 3
    assert Capabilities.from_json(caps.to_json()) == caps


def decode_at_free_engine(caps_change: dict[str, Any]) -> Any:
    """The README engine, but blocks filled by ``append`` are published only when the request is
    freed (SGLang's ``release_kv_cache``), with ``caps_change`` applied to its capabilities."""
    base = readme_engine()

    class DecodeAtFree(base):  # type: ignore[misc, valid-type]
        capabilities = replace(base.capabilities, **caps_change)
        deferring = False

        def append(self, request_id: Any, tokens: Any) -> Any:
            self.deferring = True
            try:
                return super().append(request_id, tokens)
            finally:
                self.deferring = False

        def _publish(self, tokens: Any, table: Any) -> None:
            if not self.deferring:
                super()._publish(tokens, table)

        def free(self, request_id: Any) -> None:
            tokens, table = self.reqs[request_id]
            super()._publish(tokens, table)
            super().free(request_id)

    return DecodeAtFree


def test_stale_sglang_like_adapter_fails_with_the_warning_and_passes_once_updated() -> None:
    options = SuiteOptions(profile="maximal", max_examples=60)
    stale = run_suite(decode_at_free_engine({"protocol_version": 1}), options, "stale")
    rows = {r.name: r.status for r in stale.rows}
    assert rows["maximal-hits"] == "fail"
    assert len(stale.warnings) == 1 and "publish_decode (v2)" in stale.warnings[0]
    assert stale.to_json()["warnings"] == stale.warnings
    out = io.StringIO()
    render_plain(stale, out)
    assert out.getvalue().count(f"warning: {stale.warnings[0]}\n") == 1

    updated = run_suite(
        decode_at_free_engine({"protocol_version": ADAPTER_PROTOCOL_VERSION, "publish_decode": "free"}),
        options,
        "updated",
    )
    failing = [(r.name, r.detail) for r in updated.rows if r.status == "fail"]
    assert updated.ok and updated.warnings == [], failing


ENGINE_MODULE = '''
from pagedprefix.conformance.protocol.adapters import spec
from dataclasses import replace

def stale(config):
    adapter = spec(config)
    adapter.capabilities = replace(adapter.capabilities, protocol_version=1)
    return adapter
'''


def test_conform_prints_the_warning_once_on_stderr_and_in_the_json(tmp_path: Path) -> None:
    (tmp_path / "stale_engine.py").write_text(ENGINE_MODULE, encoding="utf-8")
    report_path = tmp_path / "report.json"
    app = typer.Typer()
    register(app)

    @app.callback()
    def main() -> None:
        """Stand-in for the project's app."""

    result = CliRunner().invoke(
        app,
        ["conform", "--engine", "stale_engine:stale", "--path", str(tmp_path), "--no-stateful",
         "--no-trace", "--profile", "core", "--json", str(report_path)],
    )
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1
    # through the worker process: the declaration travels in the create reply's capabilities JSON
    assert "protocol_version 1" in warnings[0] and "publish_decode (v2)" in warnings[0]
    report = json.loads(report_path.read_text(encoding="utf-8"))
    assert report["warnings"] == [warnings[0].removeprefix("warning: ")]
    assert report["capabilities"]["protocol_version"] == 1


def test_seed_declarations_are_checked() -> None:
    caps = Capabilities(engine_keys=True, seed_env="PYTHONHASHSEED", seed_pinned="equal",
                        seed_unpinned="differ", seed_source="kv_cache_utils.py", protocol_version=6)
    assert Capabilities.from_json(caps.to_json()) == caps
    for bad, message in (
        ({"seed_env": "1-not-a-name"}, "seed_env must be null or an environment variable name"),
        ({"seed_pinned": "maybe"}, "seed_pinned must be one of"),
        ({"seed_unpinned": True}, "seed_unpinned must be one of"),
        ({"seed_source": 3}, "seed_source must be a string"),
        ({"event_removal": "some_copies"}, "event_removal must be one of"),
    ):
        with pytest.raises(ValueError, match=message):
            Capabilities.from_json(bad)
    with pytest.raises(ValueError, match="seed_pinned must be one of"):
        Capabilities(seed_pinned="sometimes").check()
