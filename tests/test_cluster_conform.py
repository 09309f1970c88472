"""indexer-conform: every deliberately broken indexer is caught, in process and over JSON lines;
the reference passes; hangs are stopped; the command's exit codes and outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import broken_indexers
import pytest
from pagedprefix.cluster import builtin_scenarios, judge, judge_scenario
from pagedprefix.cluster.load import open_indexer
from pagedprefix.cluster.scenarios import HAND_WRITTEN

TESTS = str(Path(__file__).parent)
SCENARIOS = builtin_scenarios(6)

# The hand-written scenario that stands for each broken rule (it must fail there).
CAUGHT_BY = {
    "clear_only_logged": "all-blocks-cleared",
    "drops_unknown_parent": "unknown-parent-mamba",
    "ignores_gaps": "lost-batch",
    "ignores_restarts": "restart",
    "applies_duplicates": "duplicate-batch",
    "no_copy_count": "duplicate-copies",
    "full_group_only": "sliding-window-sparse",
    "answers_while_stale": "lost-batch",
}


def failed(verdicts) -> set[str]:  # type: ignore[no-untyped-def]
    return {v.scenario.name for v in verdicts if not v.passed}


def test_every_broken_rule_has_a_scenario() -> None:
    assert set(CAUGHT_BY) == set(broken_indexers.BROKEN)
    assert set(CAUGHT_BY.values()) <= {make().name for make in HAND_WRITTEN}


@pytest.mark.parametrize("name", sorted(CAUGHT_BY))
def test_a_broken_indexer_is_caught_in_process(name: str) -> None:
    verdicts = judge(getattr(broken_indexers, name), SCENARIOS)
    assert CAUGHT_BY[name] in failed(verdicts)
    # The generated scenarios catch it too, without the hand-written one.
    assert failed(verdicts) - {make().name for make in HAND_WRITTEN}


def test_findings_say_what_was_expected() -> None:
    by_name = {s.name: s for s in SCENARIOS}
    v = judge_scenario(broken_indexers.clear_only_logged, by_name["all-blocks-cleared"])
    assert str(v.finding) == ("all-blocks-cleared step 4 r0: answered 48 tokens; the reference answers 0 "
                              "(the replica really holds 0)")
    v = judge_scenario(broken_indexers.answers_while_stale, by_name["lost-batch"])
    assert v.finding is not None and v.finding.source == "r0"
    assert "out of sync (expected None until resynced, or the replica's real 32)" in v.finding.message
    v = judge_scenario(broken_indexers.no_copy_count, by_name["duplicate-copies"])
    assert v.finding is not None and "answered 16 tokens; the reference answers 48" in v.finding.message


def worker_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))


def test_every_broken_indexer_is_caught_over_json_lines() -> None:
    loaded = open_indexer("jsonl:" + " ".join([sys.executable, "-m", "pagedprefix.cluster.jsonl_server"]))
    try:
        assert not failed(judge(loaded.factory, SCENARIOS))  # the reference over the wire passes
    finally:
        loaded.close()
    for name, scenario in CAUGHT_BY.items():
        loaded = open_indexer(f"broken_indexers:{name}", paths=[Path(TESTS)])
        try:
            verdicts = judge(loaded.factory, SCENARIOS)
        finally:
            loaded.close()
        assert scenario in failed(verdicts), name
        assert failed(verdicts) == failed(judge(getattr(broken_indexers, name), SCENARIOS)), name


def test_a_hanging_indexer_is_stopped_and_reported() -> None:
    loaded = open_indexer("broken_indexers:hangs_on_query", paths=[Path(TESTS)], call_timeout=1.0)
    t0 = time.monotonic()
    try:
        v = judge_scenario(loaded.factory, SCENARIOS[0])
        proc = loaded.factory.proc  # type: ignore[attr-defined]
    finally:
        loaded.close()
    assert time.monotonic() - t0 < 30
    assert v.finding is not None
    assert "query raised EngineHung: query did not return within 1 s" in v.finding.message
    assert proc is None or proc.proc.poll() is not None  # its process group was killed


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pagedprefix", "indexer-conform", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=worker_env(), cwd=cwd)


def test_cli_passes_the_reference_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = run_cli("--generated", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "12 passed, 0 failed" in proc.stdout
    report = json.loads(out.read_text())
    assert report["passed"] is True and len(report["scenarios"]) == 12


def test_cli_fails_a_broken_indexer_through_the_worker(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = run_cli("--indexer", "broken_indexers:clear_only_logged", "--path", TESTS, "--generated", "0",
                   "--json", str(out))
    assert proc.returncode == 1, proc.stderr
    report = json.loads(out.read_text())
    bad = [s for s in report["scenarios"] if not s["passed"]]
    assert [s["name"] for s in bad] == ["all-blocks-cleared"]
    message = "answered 48 tokens; the reference answers 0 (the replica really holds 0)"
    assert bad[0]["finding"] == {"step": 4, "source": "r0", "message": message}


@pytest.mark.parametrize("args, phrase", [
    (["--indexer", "no_such_module_xyz:f"], "cannot import 'no_such_module_xyz'"),
    (["--indexer", "jsonl:"], "jsonl: needs a command"),
    (["--indexer", f"jsonl:{sys.executable} -c print(1)"], "does not speak pagedprefix-indexer-jsonl"),
    (["--scenario", "nope"], "unknown scenario 'nope'"),
    (["--json", "/no/such/dir/x.json"], "does not exist"),
    (["--call-timeout", "0"], "--call-timeout must be"),
    (["--generated", "-1"], "--generated"),
])
def test_cli_user_errors_are_one_line(args: list[str], phrase: str) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagedprefix indexer-conform: error:"), proc.stderr
    assert phrase in lines[0]
    assert "Traceback" not in proc.stderr


def test_cli_lists_the_scenarios() -> None:
    proc = run_cli("--list", "--generated", "1")
    assert proc.returncode == 0
    names = [line.split(":")[0] for line in proc.stdout.splitlines()]
    assert names == [make().name for make in HAND_WRITTEN] + ["random-full-0"]
