"""The ``replay`` command through a tiny typer app: sweeps and their files, strict/lenient traces,
engine names, and --check-spec with a saved reproduction."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest
import typer
from pagedprefix.replay.bound import prefix_hit_bound
from pagedprefix.replay.cli import register
from pagedprefix.replay.cli_common import parse_capacities
from pagedprefix.replay.lockstep import rerun_repro
from pagedprefix.replay.trace import load_trace
from pagedprefix.spec import CacheConfig, SpecCache
from typer.testing import CliRunner


def broken_factory(config: CacheConfig) -> SpecCache:
    """For ``--engine test_replay_cli:broken_factory``: frees every block to the tail."""
    return SpecCache.create(replace(config, free_order="append_all"))


def replay_app() -> typer.Typer:
    """A stand-in for the project's app with the replay commands (``replay``, ``compare-engines``)."""
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """A stand-in for the project's app."""

    register(app)
    return app


@pytest.fixture(scope="module")
def app() -> typer.Typer:
    return replay_app()


def invoke(app: typer.Typer, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["replay", *args])
    return result.exit_code, result.output


def test_help_lists_the_options(app: typer.Typer) -> None:
    code, out = invoke(app, "--help")
    assert code == 0
    for option in ("--trace", "--num-blocks", "--block-size", "--max-running", "--engine", "--check-spec",
                   "--strict", "--limit", "--csv", "--json", "--plot", "--samples", "--step-ms"):
        assert option in out


def test_parse_capacities() -> None:
    assert parse_capacities("1000, 4_000,unbounded,inf") == [1000, 4000, None, None]
    for bad in ("", "x", "0", "-5"):
        with pytest.raises(typer.BadParameter):
            parse_capacities(bad)


def test_sweep_writes_csv_json_and_plot(app: typer.Typer, tmp_path: Path) -> None:
    out_csv, out_json, out_png = tmp_path / "s.csv", tmp_path / "s.json", tmp_path / "s.png"
    code, out = invoke(app, "--engine", "impl", "--limit", "40", "--max-running", "1", "--max-output", "32",
                       "--decode-chunk", "32", "--num-blocks", "unbounded,3000,1000", "--csv", str(out_csv),
                       "--json", str(out_json), "--plot", str(out_png), "--no-progress")
    assert code == 0, out
    doc = json.loads(out_json.read_text())
    runs = doc["runs"]
    assert [r["num_blocks"] for r in runs[1:]] == [3000, 1000] and runs[0]["unbounded"]
    bound = prefix_hit_bound(load_trace("conversation", limit=40).requests, 16)
    assert runs[0]["token_hit_rate"] == bound.token_hit_rate == runs[0]["bound_token_hit_rate"]
    assert runs[0]["evictions"] == 0 and runs[2]["evictions"] > 0
    assert runs[2]["token_hit_rate"] <= runs[1]["token_hit_rate"] <= runs[0]["token_hit_rate"]
    assert doc["monotonicity_violations"] == [] and doc["divergences"] == []
    rows = list(csv.DictReader(out_csv.open()))
    assert [int(r["num_blocks"]) for r in rows] == [r["num_blocks"] for r in runs]
    assert float(rows[0]["token_hit_rate"]) == pytest.approx(bound.token_hit_rate)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_check_spec_passes_on_a_small_slice(app: typer.Typer, tmp_path: Path) -> None:
    code, out = invoke(app, "--engine", "impl", "--limit", "30", "--num-blocks", "1500", "--max-output", "32",
                       "--samples", "2", "--check-spec", "--repro", str(tmp_path / "r.json"))
    assert code == 0, out
    assert "operations agree with the spec" in out
    assert not (tmp_path / "r.json").exists()


def test_check_spec_stops_at_a_divergence_and_saves_it(app: typer.Typer, tmp_path: Path) -> None:
    repro = tmp_path / "div.json"
    code, out = invoke(app, "--engine", "test_replay_cli:broken_factory", "--limit", "30", "--num-blocks",
                       "1500", "--max-output", "32", "--check-spec", "--repro", str(repro))
    assert code == 1
    squeezed = "".join(out.split())  # rich wraps a long temporary path at the terminal's width
    assert "divergenceatoperation" in squeezed and str(repro.name) in squeezed
    div = rerun_repro(repro, broken_factory)
    saved = json.loads(repro.read_text())
    assert div is not None and div.op_index == saved["divergence"]["op_index"] == len(saved["ops"]) - 1


BAD_TRACE = "\n".join([
    '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}',
    '{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [0]}',
    '{"timestamp": 2, "input_length": 700, "output_length": 5, "hash_ids": [0, 2]}',
]) + "\n"


def test_lenient_mode_reports_bad_lines_and_strict_mode_fails(app: typer.Typer, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(BAD_TRACE)
    code, out = invoke(app, "--trace", str(path), "--engine", "spec", "--num-blocks", "200", "--lenient")
    assert code == 0, out
    assert "skipped 1 bad line(s)" in out and "line 2: len(hash_ids) is 1" in out
    code, out = invoke(app, "--trace", str(path), "--engine", "spec", "--strict")
    assert code == 2
    assert "line 2: len(hash_ids) is 1 but input_length 600 needs" in out


def test_bad_inputs_exit_with_status_2(app: typer.Typer, tmp_path: Path) -> None:
    code, out = invoke(app, "--engine", "no_such_module_xyz:make", "--limit", "1")
    assert code == 2 and "cannot import" in out
    code, out = invoke(app, "--trace", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "no trace file" in out
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    code, out = invoke(app, "--trace", str(empty), "--engine", "spec")
    assert code == 2 and "no valid requests" in out
    code, out = invoke(app, "--engine", "spec", "--limit", "2", "--hash-algo", "md5")
    assert code == 2 and "unknown hash_algo" in out


def test_default_engine_is_impl(app: typer.Typer, tmp_path: Path) -> None:
    out_json = tmp_path / "r.json"
    code, out = invoke(app, "--limit", "25", "--num-blocks", "800", "--json", str(out_json), "--progress")
    assert code == 0, out
    (run,) = json.loads(out_json.read_text())["runs"]
    assert run["engine"] == "impl" and run["requests"] == 25 and run["evictions"] > 0
