"""A verdict that cannot lie (issue 18): no PASS without judging, capabilities honoured.

Each test drives a candidate that ends the run (``SystemExit(0)``, ``KeyboardInterrupt``,
``os._exit(0)``, death by signal; in a worker process and in process) or a run that judges nothing,
and asserts the FAIL (exit 1) with the one line saying what happened; or an engine that declares a
restricted geometry and must never be sent another one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pagedprefix.conformance import UnsupportedConfig
from pagedprefix.conformance.protocol.adapters import impl
from pagedprefix.conformance.protocol.watchdog import EngineExited, candidate_exit, note_harness_signal
from pagedprefix.conformance.reporting.outputs import output_problem
from pagedprefix.conformance.running.suite import SuiteOptions, run_suite
from pagedprefix.replay.conform_group import slice_geometry, trace_slice_rows
from pagedprefix.spec import CacheConfig

HOSTILE = textwrap.dedent(
    """
    import os, signal
    from pagedprefix.conformance.protocol.adapters import impl

    class Wrap:
        def __init__(self, inner, mode, where):
            self._inner, self._mode, self._where = inner, mode, where
            self.capabilities = inner.capabilities
        def __getattr__(self, name):
            attr = getattr(self._inner, name)
            if name != self._where:
                return attr
            def call(*a, **k):
                if self._mode == "exit0": raise SystemExit(0)
                if self._mode == "kbd": raise KeyboardInterrupt()
                if self._mode == "osexit": os._exit(0)
                if self._mode == "kill": os.kill(os.getpid(), signal.SIGKILL)
                return attr(*a, **k)
            return call

    def make(mode, where="allocate"):
        def factory(config):
            return Wrap(impl(config), mode, where)
        return factory

    exit0, kbd, osexit, kill = make("exit0"), make("kbd"), make("osexit"), make("kill")
    free_exit0 = make("exit0", "free")

    def factory_exit0(config):
        raise SystemExit(0)

    def replay_osexit(config):
        os._exit(0)
    """
)


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("hostile")
    (d / "hostile_eng.py").write_text(HOSTILE, encoding="utf-8")
    return d


def pagedprefix(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [sys.executable, "-m", "pagedprefix", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )


CONFORM = ("conform", "--path", ".", "--no-trace", "--no-builtin-vectors", "--max-examples", "5")


@pytest.mark.parametrize(
    ("engine", "in_process", "expected"),
    [
        ("exit0", False, "exited with status 0 during allocate"),
        ("exit0", True, "raised SystemExit(0)"),
        ("kbd", True, "raised KeyboardInterrupt()"),
        ("osexit", False, "exited with status 0 during allocate"),
        ("osexit", True, "the run ended before its verdict: its process exited with status 0"),
        ("kill", False, "was killed by SIGKILL during allocate"),
        ("kill", True, "its process was killed by SIGKILL"),
        ("factory_exit0", True, "raised SystemExit(0)"),
        ("free_exit0", True, "during free: raised SystemExit(0)"),
    ],
)
def test_a_candidate_that_ends_the_run_is_a_fail(
    hostile_dir: Path, engine: str, in_process: bool, expected: str
) -> None:
    start = time.monotonic()
    args = [*CONFORM, "--engine", f"hostile_eng:{engine}", *(["--in-process"] if in_process else [])]
    done = pagedprefix(*args, cwd=hostile_dir)
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-2000:])
    assert expected in done.stdout + done.stderr
    assert "PASS" not in done.stdout
    assert time.monotonic() - start < 120  # the run ends at the exit, it does not restart the engine


def test_a_replay_engine_that_exits_is_a_fail(hostile_dir: Path) -> None:
    for engine, expected in (
        ("factory_exit0", "raised SystemExit(0) at"),
        ("replay_osexit", "its process exited with status 0"),
    ):
        done = pagedprefix("replay", "--engine", f"hostile_eng:{engine}", "--limit", "20", cwd=hostile_dir)
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], done.stderr
        assert "hit" not in done.stdout  # no table


def test_an_empty_vector_directory_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = pagedprefix("conform", "--vectors", "empty", cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "pagedprefix conform: error: --vectors empty: holds no vector case (no *.json vector file, or "
        "only empty ones): a run of it would judge nothing"
    ]


def test_nothing_to_run_is_a_user_error(tmp_path: Path) -> None:
    done = pagedprefix("conform", "--no-stateful", "--no-builtin-vectors", cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "nothing to judge" in done.stderr


def test_a_run_that_judged_nothing_is_a_fail() -> None:
    def unnamed(config: CacheConfig) -> Any:  # not loaded by name: key-seeding skips as well
        return impl(config)

    report = run_suite(unnamed, SuiteOptions(max_examples=0, builtin_vectors=False), extra_groups=[])
    assert report.exit_code == 1
    assert [r.name for r in report.rows if r.status == "fail"] == ["nothing-judged"]
    assert all(r.status != "pass" for r in report.rows)  # zero examples pass nothing


def test_a_fifo_as_output_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    problem = output_problem({"--json": fifo})
    assert problem is not None and "not a regular file" in problem
    assert output_problem({"--json": Path(os.devnull)}) is None
    assert output_problem({"--json": tmp_path / "new.json"}) is None
    done = pagedprefix("conform", "--json", str(fifo), cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "not a regular file" in done.stderr


def test_candidate_exit_tells_the_candidate_from_the_harness() -> None:
    def raises() -> None:
        raise SystemExit(0)

    try:
        raises()
    except SystemExit as exc:
        exited = candidate_exit("allocate", exc)
    assert isinstance(exited, EngineExited)
    assert str(exited).startswith("the engine ended the run during allocate: raised SystemExit(0) at ")
    assert candidate_exit("allocate", ValueError("judged as usual")) is None


def test_the_harness_own_interrupt_is_not_the_candidate() -> None:
    code = (
        "from pagedprefix.conformance.protocol.watchdog import candidate_exit, note_harness_signal\n"
        "note_harness_signal(2)\n"
        "print(candidate_exit('allocate', KeyboardInterrupt()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "None"
    assert callable(note_harness_signal)


class RestrictedLru:
    """impl at the spec's policy, declaring block sizes 2, 4 and 8 only (and refusing the rest)."""

    def __init__(self, sizes: tuple[int, ...] = (2, 4, 8), max_blocks: int | None = None) -> None:
        self.sizes = sizes
        self.max_blocks = max_blocks
        self.configs: list[tuple[int, int]] = []

    def __call__(self, config: CacheConfig) -> Any:
        self.configs.append((config.block_size, config.num_blocks))
        if config.block_size not in self.sizes or (
            self.max_blocks is not None and config.num_blocks > self.max_blocks
        ):
            raise UnsupportedConfig(f"block_size {config.block_size} / num_blocks {config.num_blocks}")
        adapter = impl(config)
        adapter.capabilities = replace(adapter.capabilities, block_sizes=self.sizes,
                                       max_blocks=self.max_blocks)
        return adapter


def test_the_trace_slice_runs_at_a_declared_geometry() -> None:
    engine = RestrictedLru()
    rows = trace_slice_rows(engine, SuiteOptions(profile="lru"))
    assert [(r.status, r.kind) for r in rows] == [("pass", "group")], rows
    assert "at the declared geometry: 8 tokens per block, 8192 blocks" in rows[0].detail
    assert all(b in (2, 4, 8) for b, _ in engine.configs)


def test_the_trace_slice_is_skipped_when_no_declared_geometry_holds_it() -> None:
    engine = RestrictedLru(sizes=(16,), max_blocks=64)
    rows = trace_slice_rows(engine, SuiteOptions(profile="lru"))
    assert rows[0].status == "skip" and "capability" in rows[0].detail
    assert all(n <= 64 for _, n in engine.configs)


def test_slice_geometry_prefers_the_slice_own() -> None:
    caps = impl(CacheConfig(block_size=16, num_blocks=8)).capabilities
    assert slice_geometry(caps) == (16, 4096)
    assert slice_geometry(replace(caps, block_sizes=(32, 64))) == (32, 2048)
    assert slice_geometry(replace(caps, block_sizes=(2, 4, 8))) == (8, 8192)
    assert slice_geometry(replace(caps, max_blocks=1024)) == (16, 1024)
    assert slice_geometry(replace(caps, max_blocks=1023)) is None  # under 16384 tokens


def test_sigterm_to_the_supervisor_is_not_blamed_on_the_candidate(hostile_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(hostile_dir)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pagedprefix", "conform", "--no-trace", "--max-examples", "100000"],
        cwd=hostile_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    time.sleep(8)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, (out[-1000:], err[-1000:])
    assert "the candidate ended it" not in err and "PASS" not in out


def test_compare_engines_with_an_engine_that_exits_is_a_fail(hostile_dir: Path) -> None:
    done = pagedprefix("compare-engines", "--engines", "radix", "--engine", "hostile_eng:factory_exit0",
                       "--trace", "conversation", "--limit", "20", "--num-blocks", "unbounded",
                       cwd=hostile_dir)
    assert done.returncode == 1, (done.stdout[-1000:], done.stderr[-1000:])
    assert "raised SystemExit(0) at" in done.stderr.strip().splitlines()[-1]


def test_matrix_fails_the_cell_of_an_engine_that_exits_and_goes_on(
    hostile_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pagedprefix.conformance.reporting.matrix import MatrixEngine, run_cells

    monkeypatch.setenv("PYTHONPATH", str(hostile_dir))  # the engine's worker imports it from there
    cells = run_cells(MatrixEngine("hostile_eng:exit0", ""), [], 0)
    assert [c.verdict for c in cells] == ["FAIL", "FAIL"]  # its strongest profile, then core
    assert all("exited with status 0 during allocate" in c.failing[0].detail for c in cells)


def test_a_slow_first_factory_call_gets_the_start_limit_not_the_call_limit() -> None:
    # An in-process adapter imports its engine on the first factory call (vLLM: torch, sympy, ...).
    # Under the 2-s call limit an alarm mid-import left the engine half-imported and the run a
    # false FAIL on a loaded machine; the factory now gets the start limit (120 s), as a worker's
    # ``create`` does, and a slow *operation* is still stopped by the call limit.
    calls = []

    def slow_import(config: CacheConfig) -> Any:
        if not calls:
            time.sleep(3.0)  # a first import, longer than the call limit
        calls.append(config)
        return impl(config)

    options = SuiteOptions(max_examples=5, builtin_vectors=True, call_timeout=2.0)
    report = run_suite(slow_import, options, extra_groups=[])
    assert report.exit_code == 0, [(r.name, r.detail) for r in report.rows if r.status == "fail"]
    assert len(calls) > 1

    class SlowAllocate:
        def __init__(self, inner: Any) -> None:
            self._inner = inner
            self.capabilities = inner.capabilities

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        def allocate(self, *args: Any, **kwargs: Any) -> Any:
            time.sleep(3.0)
            return self._inner.allocate(*args, **kwargs)

    report = run_suite(lambda c: SlowAllocate(impl(c)), options, extra_groups=[])
    fails = [r for r in report.rows if r.status == "fail"]
    assert report.exit_code == 1 and fails[-1].name == "engine-errors"
    assert "allocate did not return within 2 s" in fails[-1].detail
