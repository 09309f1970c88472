"""Same seed, same engine behaviour -> the same report, whatever the working directory and the
adapter's source text; and nothing is written to the working directory unless asked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

TESTS = Path(__file__).parent
TIMING = {"seconds"}


def without_timing(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_timing(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [without_timing(v) for v in value]
    return value


def run(cwd: Path, engine_dir: Path, *extra: str) -> dict[str, Any]:
    out = cwd / "report.json"
    argv = [sys.executable, "-m", "pagedprefix", "conform", "--engine", "adapter_under_test:skips_cow",
            "--path", str(engine_dir), "--profile", "core", "--seed", "11", "--max-examples", "150",
            "--no-trace", "--json", str(out), *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def adapter_copy(directory: Path, extra_source: str) -> Path:
    """``broken_engines`` as ``adapter_under_test``, with extra (behaviour-neutral) source text."""
    directory.mkdir()
    text = (TESTS / "broken_engines.py").read_text()
    (directory / "adapter_under_test.py").write_text(text + extra_source)
    return directory


def test_same_seed_same_report_from_other_directories_and_source(tmp_path: Path) -> None:
    plain = adapter_copy(tmp_path / "a", "")
    # Literals a Hypothesis local-constants harvest would pick up, if it read this file.
    noisy = adapter_copy(
        tmp_path / "b", "\nMAGIC = [0, 1, 2, 3, 4, 5, 17, 2**31, 'a', 'x', 'img-1']\n# a comment\n"
    )
    (tmp_path / "cwd1").mkdir()
    (tmp_path / "cwd2").mkdir()
    for mode in ((), ("--in-process",)):
        first = run(tmp_path / "cwd1", plain, *mode)
        second = run(tmp_path / "cwd2", noisy, *mode)
        assert without_timing(first) == without_timing(second)
        assert first["stateful"]["counterexamples"], (
            "the run must find the fault for the check to mean anything"
        )
    for cwd in (tmp_path / "cwd1", tmp_path / "cwd2"):
        assert sorted(p.name for p in cwd.iterdir()) == ["report.json"]


def test_database_is_written_only_where_asked_and_replayed_first(tmp_path: Path) -> None:
    engine = adapter_copy(tmp_path / "e", "")
    (tmp_path / "cwd").mkdir()
    first = run(tmp_path / "cwd", engine, "--database", str(tmp_path / "db"))
    saved = sorted(p.name for p in (tmp_path / "db").iterdir())
    props = {f["property"] for f in first["stateful"]["counterexamples"]}
    assert "cow-isolation" in props
    assert [name.split("-")[1:-1] for name in saved] == [p.split("-") for p in sorted(props)]
    assert sorted(p.name for p in (tmp_path / "cwd").iterdir()) == ["report.json"]
    second = run(tmp_path / "cwd", engine, "--database", str(tmp_path / "db"))
    replayed = [f for f in second["vectors"]["failed"] if f["id"] == "counterexample/cow-isolation"]
    assert replayed and replayed[0]["property"] == "cow-isolation"
    assert first["stateful"]["counterexamples"] == second["stateful"]["counterexamples"]
