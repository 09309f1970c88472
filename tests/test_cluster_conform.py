"""indexer-conform: every deliberately broken indexer is caught, in process and over JSON lines;
the reference passes; hangs are stopped; the command's exit codes and outputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import broken_indexers
import pytest
from pagedprefix.cluster import Verdict, builtin_scenarios, judge, judge_scenario, reference_indexer
from pagedprefix.cluster.conform import all_passed
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
    "counts_but_declares_last_copy": "duplicate-copies",
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
    assert "13 passed, 0 failed" in proc.stdout  # 11 hand-written (spec-hybrid-stream too), 2 generated
    report = json.loads(out.read_text())
    assert report["passed"] is True and len(report["scenarios"]) == 13


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
    assert_one_line_error(run_cli(*args), "indexer-conform", phrase)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], command: str, phrase: str) -> None:
    """A user error of ``pagedprefix COMMAND``: exit status 2 and one line on stderr naming
    ``phrase``, no traceback."""
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pagedprefix {command}: error:"), proc.stderr
    assert phrase in lines[0]
    assert "Traceback" not in proc.stderr


def test_cli_lists_the_scenarios() -> None:
    proc = run_cli("--list", "--generated", "1")
    assert proc.returncode == 0
    names = [line.split(":")[0] for line in proc.stdout.splitlines()]
    assert names == [make().name for make in HAND_WRITTEN] + ["random-full-0"]


# ----- no PASS without judging (issue 18, rules 1 and 4) ------------------------------------------

HAND = builtin_scenarios(0)


@pytest.mark.parametrize("name, call, exc", [
    ("exits_on_events", "events", "SystemExit: 0"),
    ("interrupts_on_query", "query", "KeyboardInterrupt"),
    ("generator_exit_on_resync", "resync", "GeneratorExit"),
    ("exits_in_its_answer", "reading the query's answer", "SystemExit: 3"),
])
def test_a_candidate_that_raises_a_base_exception_fails_in_process(name: str, call: str, exc: str) -> None:
    verdicts = judge(getattr(broken_indexers, name), HAND)
    messages = {v.finding.message for v in verdicts if v.finding is not None}
    assert f"{call} raised {exc}" in messages
    assert not all(v.passed for v in verdicts)
    assert all(v.ran for v in verdicts)  # the harness is fine: every scenario is still judged


def test_a_candidate_that_exits_while_built_fails() -> None:
    v = judge_scenario(broken_indexers.exits_on_create, HAND[0])
    assert v.finding is not None and v.finding.message == "building the indexer raised SystemExit: 0"


def test_zero_scenarios_judged_is_never_a_pass() -> None:
    assert all_passed([]) is False
    assert judge(reference_indexer, []) == []
    not_run = Verdict(HAND[0], ran=False, not_run="x")
    assert not not_run.passed and not_run.status == "NOT RUN" and all_passed([not_run]) is False
    assert all_passed(judge(reference_indexer, HAND[:2])) is True


@pytest.mark.parametrize("name, phrase", [
    ("dies_on_events", "exited with status 7 during events"),
    ("killed_on_query", "was killed by SIGKILL during query"),
])
def test_a_worker_that_dies_mid_run_fails_with_its_exit_status(name: str, phrase: str) -> None:
    loaded = open_indexer(f"broken_indexers:{name}", paths=[Path(TESTS)])
    try:
        verdicts = judge(loaded.factory, HAND)
    finally:
        loaded.close()
    first = verdicts[0]
    assert first.status == "FAIL" and first.finding is not None and first.finding.fatal
    assert phrase in first.finding.message
    # The candidate is gone: the other scenarios are not run (and not passed).
    assert [v.status for v in verdicts[1:]] == ["NOT RUN"] * (len(HAND) - 1)
    assert verdicts[1].not_run == f"the indexer hung or died in {HAND[0].name}"
    assert not all_passed(verdicts)


def test_cli_in_process_system_exit_0_is_a_fail_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = run_cli("--indexer", "broken_indexers:exits_on_events", "--in-process", "--path", TESTS,
                   "--generated", "0", "--json", str(out))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    report = json.loads(out.read_text())
    assert report["passed"] is False
    messages = {s["finding"]["message"] for s in report["scenarios"] if s["finding"]}
    assert messages == {"events raised SystemExit: 0"}
    assert "0 passed" in proc.stdout


def test_cli_in_process_module_that_exits_at_import_is_a_fail(tmp_path: Path) -> None:
    (tmp_path / "exits_at_import.py").write_text("raise SystemExit(0)\n")
    proc = run_cli("--indexer", "exits_at_import:f", "--in-process", "--path", str(tmp_path))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stderr.strip().splitlines() == [
        "pagedprefix indexer-conform: error: FAIL: loading the indexer 'exits_at_import:f' raised "
        "SystemExit: 0"]


def test_cli_an_indexer_that_never_answers_create_costs_one_start_timeout() -> None:
    t0 = time.monotonic()
    proc = run_cli("--indexer", "broken_indexers:hangs_on_create", "--path", TESTS, "--generated", "0",
                   "--start-timeout", "2")
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert f"0 passed, 1 failed, {len(HAND) - 1} not run" in proc.stdout
    assert "building the indexer raised EngineHung: create did not return within 2 s" in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "FAIL: the indexer is lost" in lines[0]
    assert f"{len(HAND) - 1} scenario(s) not run" in lines[0]
    assert elapsed < 15  # one time limit (2 s) plus start-up, not one per scenario (20 s and more)


@pytest.mark.parametrize("name", ["sleeps_in_query", "swallows_interrupts"])
def test_cli_a_real_ctrl_c_stops_the_run_with_130(tmp_path: Path, name: str) -> None:
    mark = tmp_path / "entered"
    argv = [sys.executable, "-m", "pagedprefix", "indexer-conform",
            "--indexer", f"broken_indexers:{name}",
            "--in-process", "--path", TESTS, "--generated", "0", "--call-timeout", "100"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(worker_env(), BROKEN_INDEXER_MARK=str(mark)))
    try:
        deadline = time.monotonic() + 60
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mark.exists()
        proc.send_signal(signal.SIGINT)  # the user's Ctrl-C, delivered while the candidate runs
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [
        "pagedprefix indexer-conform: error: interrupted (SIGINT): no verdict"]


def test_cli_a_candidate_raising_keyboard_interrupt_is_a_fail_not_an_interrupt() -> None:
    proc = run_cli("--indexer", "broken_indexers:interrupts_on_query", "--in-process", "--path", TESTS,
                   "--generated", "0")
    assert proc.returncode == 1, proc.stderr
    assert "query raised KeyboardInterrupt" in proc.stdout


def test_cli_zero_scenarios_judged_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer
    from pagedprefix.cluster import cli as cluster_cli
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command()(cluster_cli.indexer_conform_command)
    monkeypatch.setattr(cluster_cli, "builtin_scenarios", lambda n: [])
    result = CliRunner().invoke(app, [])
    assert result.exit_code == 1
    assert "FAIL: no scenario was judged, which is not a pass" in result.output


# ----- a stream the hybrid spec itself publishes (issue 21, section 3) -----------------------------


def test_the_spec_hybrid_stream_answers_what_the_replicas_look_up() -> None:
    """The per-group streams of two ``HybridSpecCache`` replicas, counted (the replicas' truth),
    answer every query exactly as the replica's own ``lookup`` does: the indexer's prefix rule
    (cluster/prefix.py) and the spec's section-8 lookup agree on a real hybrid stream, so the
    scenario judges indexers by the spec, not by a toy. The reference indexer passes it."""
    from pagedprefix.cluster.scenarios import SPEC_GROUPS, spec_hybrid_run
    from pagedprefix.cluster.streams import Publish, Query, Truth

    scenario, answers = spec_hybrid_run()
    truths = {s: Truth() for s in scenario.config.sources}
    got = []
    for step in scenario.steps:
        if isinstance(step, Publish):
            truths[step.source].publish(step.batch)
        elif isinstance(step, Query):
            source = answers[len(got)][0]
            got.append(truths[source].answer(SPEC_GROUPS, step))
    assert got == [hit for _, _, hit in answers]
    assert got == [16, 20, 0, 0, 0, 16, 16, 12]  # hits, a miss after eviction, sparse-window misses
    groups = {e.group for s in scenario.steps if isinstance(s, Publish) for e in s.batch.events}
    assert groups == {0, 1, 2}
    assert judge_scenario(reference_indexer, scenario).passed


@pytest.mark.parametrize("name", ["full_group_only", "drops_unknown_parent", "ignores_gaps"])
def test_the_spec_hybrid_stream_catches_a_broken_indexer(name: str) -> None:
    from pagedprefix.cluster.scenarios import spec_hybrid_stream

    assert not judge_scenario(getattr(broken_indexers, name), spec_hybrid_stream()).passed


def test_each_indexer_is_judged_on_streams_of_the_model_it_assumes() -> None:
    """SEMANTICS.md section 9: a set-keeping reference passes every scenario played as a
    ``last_copy`` engine publishes it; the counting reference passes them as written (``per_copy``)."""
    from pagedprefix.cluster.indexer import last_copy_reference

    last = judge(last_copy_reference, SCENARIOS)
    assert all_passed(last) and {v.removal for v in last} == {"last_copy"}
    assert {v.removal for v in judge(reference_indexer, SCENARIOS[:2])} == {"per_copy"}


def test_a_per_copy_stream_in_last_copy_form() -> None:
    from pagedprefix.cluster.streams import Publish, in_removal_model
    from pagedprefix.spec.events import BlockRemoved

    [hand] = [s for s in SCENARIOS if s.name == "duplicate-copies"]
    removals = [
        [e.block_hashes for e in step.batch.events if isinstance(e, BlockRemoved)]
        for step in in_removal_model(hand, "last_copy").steps if isinstance(step, Publish)
    ]
    # stores of blocks 0..2, then 0..1 again; block 1's first removal leaves a copy: not published
    assert [len(r) for r in removals] == [0, 0, 0, 1]
    assert in_removal_model(hand, "per_copy") is hand
    with pytest.raises(ValueError, match="removal model must be one of"):
        in_removal_model(hand, "some_copies")


def test_an_unknown_removal_model_is_a_finding() -> None:
    def odd(config):  # type: ignore[no-untyped-def]
        indexer = reference_indexer(config)
        indexer.removal_model = "every_other_copy"
        return indexer

    v = judge_scenario(odd, SCENARIOS[0])
    assert v.finding is not None and "removal_model is 'every_other_copy'" in v.finding.message


def test_the_removal_model_travels_over_json_lines() -> None:
    loaded = open_indexer("pagedprefix.cluster.indexer:last_copy_reference")
    try:
        loaded.start()
        verdicts = judge(loaded.factory, SCENARIOS[:3])
    finally:
        loaded.close()
    assert all_passed(verdicts) and {v.removal for v in verdicts} == {"last_copy"}
