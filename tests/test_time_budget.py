"""Every limit a user states is a limit (docs/SECURITY.md "Time budget and signals").

- ``--time-budget`` bounds the whole run of ``conform``, ``matrix``, ``history`` (per release and
  in total) and ``indexer-conform``: a correct engine that turns slow cannot keep a run going past
  the budget plus :data:`BUDGET_SLACK`; the run reports what it judged and exits 3;
- a candidate that holds its thread in C past the budget is killed at ``budget + BUDGET_SLACK``;
- SIGTERM ends a run within :data:`SIGNAL_GRACE` seconds whatever the engine does, and no engine
  process is left behind.

The slow engines are correct: each reply is right and comes within the call timeout, so only a
budget on the whole run can end such a run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pagedprefix.conformance.protocol.watchdog import BudgetSpent, run_budget, time_left
from pagedprefix.conformance.running.supervise import BUDGET_SLACK, SIGNAL_GRACE

TESTS = Path(__file__).resolve().parent
PAGEDPREFIX = [sys.executable, "-m", "pagedprefix"]
SLOW = {"FAST_REPLIES": "50", "SLOW_SECONDS": "2"}  # the engine: 2 s a reply after its 50th


def _unique_copy(tmp_path: Path, name: str) -> Path:
    """A copy of a test engine under a name no other test uses (to find its processes)."""
    target = tmp_path / f"{name.removesuffix('.py')}_{os.getpid()}_{time.monotonic_ns()}.py"
    shutil.copy(TESTS / name, target)
    return target


def _alive(marker: str) -> list[str]:
    """Command lines of live processes that mention ``marker``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state not in ("Z", "X"):
            found.append(cmdline)
    return found


def _gone(marker: str, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while _alive(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _run(args: list[str], timeout: float, env: dict[str, str] | None = None,
         cwd: Path | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    done = subprocess.run([*PAGEDPREFIX, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd, check=False)
    return done, time.monotonic() - start


needs_proc = pytest.mark.skipif(not Path("/proc/self/cmdline").is_file(), reason="reads /proc (Linux)")


# ----- the mechanism ---------------------------------------------------------------------------------


def test_nested_budgets_keep_the_earlier_deadline() -> None:
    assert time_left() is None
    with run_budget(100.0):
        outer = time_left()
        assert outer is not None and 99 < outer <= 100
        with run_budget(1000.0):  # an inner run never outlasts the outer one
            inner = time_left()
            assert inner is not None and inner <= outer
        with run_budget(5.0):
            inner = time_left()
            assert inner is not None and 4 < inner <= 5
    assert time_left() is None


def test_a_guarded_in_process_call_is_cut_at_the_budget() -> None:
    from pagedprefix.conformance.protocol.watchdog import call_limit

    start = time.monotonic()
    spent = r"time budget of 0.5 s ran out during allocate"
    with run_budget(0.5), pytest.raises(BudgetSpent, match=spent), call_limit("allocate", 10.0):
        time.sleep(30)
    assert time.monotonic() - start < 3
    with run_budget(0.0), pytest.raises(BudgetSpent), call_limit("free", 10.0):  # spent: no call starts
        raise AssertionError("unreachable")


# ----- conform ---------------------------------------------------------------------------------------


@needs_proc
def test_conform_on_a_slow_engine_ends_at_its_budget_with_what_it_judged(tmp_path: Path) -> None:
    engine = _unique_copy(tmp_path, "slow_engine.py")
    report = tmp_path / "report.json"
    budget = 20
    done, wall = _run(
        ["conform", "--no-trace", "--no-builtin-vectors", "--time-budget", str(budget),
         "--max-examples", "10", "--call-timeout", "5", "--start-timeout", "20",
         "--engine", f"jsonl:{sys.executable} {engine}", "--json", str(report)],
        timeout=budget + BUDGET_SLACK + 60, env=SLOW)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert wall < budget + BUDGET_SLACK, wall
    data = json.loads(report.read_text())  # the run stopped itself and reported (not the hard stop)
    assert data["incomplete"] is True and data["exit_code"] == 3 and data["ok"] is True
    assert f"the time budget of {budget} s ran out" in data["stopped"]
    assert data["stateful"]["planned"] == 10 and data["stateful"]["examples"] < 10
    rows = {r["name"]: r for r in data["rows"]}
    seeding = rows["key-seeding"]
    assert seeding["status"] == "skip" and "not run: the time budget" in seeding["detail"]
    assert any(r["status"] == "pass" for r in data["rows"]), "what was judged before the budget is reported"
    assert "INCOMPLETE (the time budget of 20 s ran out" in done.stdout
    assert _gone(engine.name)


@needs_proc
def test_a_candidate_stuck_in_c_is_killed_at_budget_plus_slack(tmp_path: Path) -> None:
    engines = _unique_copy(tmp_path, "misbehaving_engines.py")
    budget = 3
    done, wall = _run(
        ["conform", "--in-process", "--no-trace", "--path", str(tmp_path), "--time-budget", str(budget),
         "--engine", f"{engines.stem}:allocate_blocks_in_c"],
        timeout=budget + BUDGET_SLACK + 60)
    assert done.returncode == 3, done.stderr[-2000:]
    assert budget + BUDGET_SLACK - 1 < wall < budget + BUDGET_SLACK + 10, wall
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == (f"pagedprefix conform: INCOMPLETE: the time budget of {budget} s ran out and "
                         f"the run had not ended {BUDGET_SLACK:g} s later: it was killed, "
                         "with every engine process")
    assert "Traceback" not in done.stderr
    assert _gone(engines.stem)


@needs_proc
@pytest.mark.parametrize("where", ["worker", "in-process-c"])
def test_sigterm_ends_a_run_within_the_signal_grace(tmp_path: Path, where: str) -> None:
    if where == "worker":
        marker = _unique_copy(tmp_path, "slow_engine.py")
        args = ["--engine", f"jsonl:{sys.executable} {marker}"]
        env = {**os.environ, **SLOW, "FAST_REPLIES": "5"}
    else:
        marker = _unique_copy(tmp_path, "misbehaving_engines.py")
        args = ["--in-process", "--path", str(tmp_path), "--engine", f"{marker.stem}:allocate_blocks_in_c"]
        env = dict(os.environ)
    proc = subprocess.Popen([*PAGEDPREFIX, "conform", "--no-trace", "--time-budget", "300", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60  # until the engine is slow or stuck
        while time.monotonic() < deadline and not _alive(marker.stem if where != "worker" else marker.name):
            time.sleep(0.2)
        time.sleep(6)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=SIGNAL_GRACE + 30)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert took < SIGNAL_GRACE + 2, took
    assert "Traceback" not in err
    assert _gone(marker.stem)


# ----- matrix, history, indexer-conform --------------------------------------------------------------


def test_a_matrix_cell_past_the_budget_is_incomplete_not_fail(tmp_path: Path) -> None:
    from pagedprefix.conformance.reporting.matrix import MatrixEngine, run_cells

    engine = _unique_copy(tmp_path, "slow_engine.py")
    os.environ.update(SLOW)
    try:
        start = time.monotonic()
        with run_budget(8.0):
            cells = run_cells(MatrixEngine(f"jsonl:{sys.executable} {engine}", ""), [])
        took = time.monotonic() - start
    finally:
        for key in SLOW:
            os.environ.pop(key, None)
    assert took < 8 + 5, took
    assert [c.verdict for c in cells] == ["INCOMPLETE", "INCOMPLETE"]
    assert "the time budget of 8 s ran out" in cells[0].error
    assert cells[1].error == "not run: the time budget ran out"


def test_matrix_with_a_budget_leaves_the_document_and_exits_3(tmp_path: Path) -> None:
    out = tmp_path / "MATRIX.md"
    out.write_text("before\n")
    budget = 5
    done, wall = _run(["matrix", "--out", str(out), "--time-budget", str(budget), "--jobs", "1"],
                      timeout=budget + BUDGET_SLACK + 60, cwd=tmp_path)
    assert done.returncode == 3, done.stderr[-2000:]
    assert wall < budget + BUDGET_SLACK, wall
    assert out.read_text() == "before\n"
    assert "matrix: impl " in done.stderr and ": INCOMPLETE" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("matrix: INCOMPLETE: ")


def _fake_release(cache: Path, version: str, import_sleeps: float) -> None:
    """A release in the history's cache whose ``vllm`` package takes ``import_sleeps`` s to import."""
    root = cache / version
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text(f"import time\ntime.sleep({import_sleeps})\n")
    meta = {"file": f"vllm-{version}.whl", "sha256": "0" * 64, "bytes": 1}
    (root / "wheel.json").write_text(json.dumps(meta))


def test_history_ends_a_slow_release_at_its_budget_and_skips_the_rest(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _fake_release(cache, "0.9.1", 1000)
    _fake_release(cache, "0.9.2", 1000)
    out = tmp_path / "HISTORY.md"
    release_budget, total = 3, 4
    done, wall = _run(
        ["history", "vllm", "--offline", "--cache-dir", str(cache), "--release", "0.9.1",
         "--release", "0.9.2", "--jobs", "1", "--release-budget", str(release_budget),
         "--time-budget", str(total), "--out", str(out)],
        timeout=total + 2 * BUDGET_SLACK + 60)
    assert done.returncode == 3, done.stderr[-2000:]
    assert wall < total + 2 * BUDGET_SLACK, wall
    rows = {r["version"]: r for r in json.loads(out.with_suffix(".json").read_text())}
    assert rows["0.9.1"]["verdict"] == "INCOMPLETE"
    assert f"after its time budget of {release_budget} s: killed" in rows["0.9.1"]["reason"]
    assert rows["0.9.2"] == {**rows["0.9.2"], "verdict": "INCOMPLETE",
                             "reason": "not run: the history's time budget ran out"}
    assert "| 0.9.1 | INCOMPLETE |" in out.read_text()


@needs_proc
def test_indexer_conform_on_a_slow_indexer_ends_at_its_budget() -> None:
    budget = 6
    done, wall = _run(["indexer-conform", "--indexer", "slow_indexer:slow", "--path", str(TESTS),
                       "--time-budget", str(budget)], timeout=budget + BUDGET_SLACK + 60)
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert wall < budget + BUDGET_SLACK, wall
    summary = [line for line in done.stdout.splitlines() if line.endswith("not run")]
    assert summary and " 0 failed, " in summary[-1] and not summary[-1].startswith("0 passed")
    assert "not run: the time budget of 6 s ran out during events" in done.stdout
    assert done.stderr.strip().splitlines()[-1].startswith(
        "pagedprefix indexer-conform: INCOMPLETE: ") and "not run within the time budget" in done.stderr
