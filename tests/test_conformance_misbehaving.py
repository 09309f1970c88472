"""Engines that misbehave as adapters: a FAIL verdict (exit 1) or a one-line user error (exit 2),
never a traceback, never a hang, and no engine process left behind.

Every case runs the real ``pagedprefix`` command in a subprocess (with a timeout), on a private
copy of ``misbehaving_engines.py`` whose module name is unique to the test, so that a leftover
worker process can be found by its command line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from pagedprefix.conformance.running.suite import SuiteOptions, load_engine, run_suite

TESTS = Path(__file__).parent


def processes_mentioning(marker: str) -> list[int]:
    """Pids of live processes whose command line contains ``marker`` (Linux /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry.name))
    return pids


def no_process_left(marker: str) -> bool:
    deadline = time.monotonic() + 5
    while processes_mentioning(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture
def engines(tmp_path: Path) -> str:
    """A uniquely named copy of misbehaving_engines on its own --path."""
    name = f"mb_{uuid.uuid4().hex[:12]}"
    shutil.copy(TESTS / "misbehaving_engines.py", tmp_path / f"{name}.py")
    return name


def conform(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pagedprefix", "conform", "--no-trace", "--max-examples", "60", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )


VERDICTS = [
    ("step_raises", 1, "step() raised RuntimeError: step() of a misbehaving engine"),
    ("allocate_sleeps", 1, "allocate did not return within 2 s; the run ended here"),
    ("allocate_returns_none", 1, "crashed: AttributeError"),
    ("dies_mid_run", 1, "exited with status 3 during free; the run ended here"),
    ("factory_raises", 1, "raised RuntimeError: this factory always fails"),
    ("factory_returns_garbage", 1, "engine-errors"),
    ("factory_sleeps", 1, "create did not return within 5 s"),
    ("chatty", 0, "PASS"),
]


@pytest.mark.parametrize(("factory", "code", "text"), VERDICTS)
def test_engine_misbehaviour_is_a_verdict(
    tmp_path: Path, engines: str, factory: str, code: int, text: str
) -> None:
    start = time.monotonic()
    proc = conform(
        tmp_path,
        "--engine",
        f"{engines}:{factory}",
        "--path",
        str(tmp_path),
        "--call-timeout",
        "2",
        "--start-timeout",
        "5",
    )
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert text in proc.stdout
    assert "Traceback (most recent call last)" not in proc.stderr
    assert time.monotonic() - start < 90
    assert no_process_left(engines)
    assert not (tmp_path / ".hypothesis").exists()


USER_ERRORS = [
    ("wrong_arity", "is not a factory (config -> adapter)"),
    ("NOT_CALLABLE", "is not callable"),
    ("nosuch", "has no attribute path 'nosuch'"),
]


@pytest.mark.parametrize(("factory", "text"), USER_ERRORS)
def test_an_engine_that_is_not_a_factory_is_a_user_error(
    tmp_path: Path, engines: str, factory: str, text: str
) -> None:
    proc = conform(tmp_path, "--engine", f"{engines}:{factory}", "--path", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1 and text in proc.stderr
    assert no_process_left(engines)


def test_a_module_with_a_syntax_error_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "broken_syntax.py").write_text("def factory(config):\n    return (\n")
    proc = conform(tmp_path, "--engine", "broken_syntax:factory", "--path", str(tmp_path))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "SyntaxError" in proc.stderr or "cannot import" in proc.stderr


def test_the_working_directory_is_searched_for_the_engine(tmp_path: Path, engines: str) -> None:
    proc = conform(tmp_path, "--engine", f"{engines}:chatty")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_an_in_process_engine_that_sleeps_is_stopped_by_the_watchdog(tmp_path: Path, engines: str) -> None:
    proc = conform(
        tmp_path,
        "--engine",
        f"{engines}:allocate_sleeps",
        "--path",
        str(tmp_path),
        "--in-process",
        "--call-timeout",
        "1",
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "allocate did not return within 1 s" in proc.stdout


def jsonl(tmp_path: Path, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    return conform(
        tmp_path, "--engine", f"jsonl:{command}", "--start-timeout", "3", "--call-timeout", "3", *args
    )


def test_a_silent_jsonl_engine_is_stopped_and_killed(tmp_path: Path) -> None:
    marker = f"{uuid.uuid4().int % 10**6}.5"
    proc = jsonl(tmp_path, f"{sys.executable} -c 'import time; time.sleep({marker})'")
    assert proc.returncode == 2 and "did not return within 3 s" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert no_process_left(marker)


def test_a_non_json_hello_is_refused_and_the_engine_killed(tmp_path: Path) -> None:
    marker = f"{uuid.uuid4().int % 10**6}.25"
    code = f"import time; print('hello there', flush=True); time.sleep({marker})"
    proc = jsonl(tmp_path, f'{sys.executable} -c "{code}"')
    assert proc.returncode == 2 and "does not speak pagedprefix-jsonl" in proc.stderr
    assert no_process_left(marker)


def test_the_engines_whole_process_group_is_killed(tmp_path: Path) -> None:
    marker = f"{uuid.uuid4().int % 10**6}.75"
    server = f"{sys.executable} -m pagedprefix.conformance.running.jsonl_server --engine spec"
    proc = jsonl(tmp_path, f"sh -c 'sleep {marker} & exec {server}'", "--max-examples", "10")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert no_process_left(marker)


def test_in_process_misbehaviour_gives_a_fail_row_within_the_budget() -> None:
    sys.path.insert(0, str(TESTS))
    try:
        factory = load_engine("misbehaving_engines:step_raises", isolate=False)
        start = time.monotonic()
        report = run_suite(factory, SuiteOptions(profile="core", max_examples=60, call_timeout=2))
    finally:
        sys.path.remove(str(TESTS))
    rows = {r.name: r for r in report.rows}
    assert rows["engine-errors"].status == "fail" and report.exit_code == 1
    assert "RuntimeError: step() of a misbehaving engine" in (rows["engine-errors"].counterexample or "")
    assert time.monotonic() - start < 60
