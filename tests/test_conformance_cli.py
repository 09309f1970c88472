"""``pagedprefix conform`` through a tiny typer app (the project's app calls the same register)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer
from pagedprefix.conformance.cli import register
from pagedprefix.conformance.protocol.adapters import impl_available
from pagedprefix.conformance.running import vectors as V
from typer.testing import CliRunner
from vector_support import user_case

sys.path.insert(0, str(Path(__file__).parent))

runner = CliRunner()


def make_app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.callback()
    def main() -> None:
        """Stand-in for the project's app."""

    return app


def conform(*args: str) -> tuple[int, str]:
    result = runner.invoke(make_app(), ["conform", *args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


def test_spec_passes_and_writes_a_json_report(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    code, text = conform("--engine", "spec", "--max-examples", "20", "--json", str(out))
    assert code == 0, text
    assert "PASS" in text and "vectors: cow" in text and "held-blocks" in text
    report = json.loads(out.read_text())
    assert report["ok"] is True and report["profile"] == "exact" and report["engine"] == "spec"
    rows = {r["name"]: r["status"] for r in report["rows"]}
    assert rows["hit-content"] == "pass" and rows["vectors: keys"] == "pass"
    assert report["vectors"]["failed"] == [] and report["vectors"]["never_ran"] == []
    assert report["capabilities"]["exact_ids"] is True


def test_a_broken_engine_fails_with_the_property_and_counterexample(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    code, text = conform(
        "--engine",
        "broken_engines:skips_cow",
        "--path",
        str(Path(__file__).parent),
        "--profile",
        "core",
        "--json",
        str(out),
    )
    assert code == 1
    assert "FAIL" in text and "cow-isolation" in text
    report = json.loads(out.read_text())
    failed = {r["name"] for r in report["rows"] if r["status"] == "fail"}
    assert "cow-isolation" in failed and "vectors: cow" in failed
    [cex] = report["stateful"]["counterexamples"]
    assert cex["property"] == "cow-isolation" and cex["vector"]["schema_version"] == V.SCHEMA_VERSION


def test_vectors_dir_runs_user_vectors(tmp_path: Path) -> None:
    builder = user_case("mine/hit")
    builder.lookup([1, 2, 5])
    (tmp_path / "mine.json").write_text(V.dumps(V.vector_file("mine", "user vectors", [builder.build()])))
    code, text = conform("--engine", "spec", "--no-stateful", "--vectors", str(tmp_path))
    assert code == 0, text
    assert "vectors: mine" in text and "1 passed" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--engine", "nosuchmodule:factory"), "cannot import"),
        (("--engine", "spec", "--profile", "strict"), "unknown profile"),
        (("--engine", "spec", "--vectors", "/nonexistent/dir"), "not a directory"),
    ],
)
def test_usage_errors_exit_2(args: tuple[str, ...], message: str) -> None:
    code, text = conform(*args)
    assert code == 2 and message in text


@pytest.mark.skipif(not impl_available(), reason="pagedprefix.impl.BlockManager is not built yet")
def test_default_engine_is_impl() -> None:
    code, text = conform("--max-examples", "20")
    assert code == 0, text
    assert "impl at profile exact" in text


def test_missing_impl_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import pagedprefix.impl

    monkeypatch.delattr(pagedprefix.impl, "BlockManager", raising=False)
    code, text = conform("--engine", "impl")
    assert code == 2 and "BlockManager is not available" in text
