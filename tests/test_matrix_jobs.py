"""``pagedprefix matrix --jobs``: the engines run in forked workers, the cells come back in the
order of the engines (conformance/reporting/matrix.py ``run_matrix``)."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence

import pytest
from pagedprefix.conformance.reporting import matrix
from pagedprefix.conformance.reporting.matrix import Cell, MatrixEngine, run_matrix

needs_fork = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform"
)
ENGINES = [MatrixEngine(f"e{i}", "") for i in range(5)]


def _fake_cells(engine: MatrixEngine, groups: Sequence[object], seed: int) -> list[Cell]:
    """Two cells an engine, stamped with the process that ran it; the first engine is the slowest,
    so a pool that returned cells as they finish would put it last."""
    if engine.name == "e0":
        time.sleep(0.5)
    return [Cell(engine.name, str(os.getpid()), profile, f"PASS-{seed}") for profile in ("exact", "core")]


def test_one_job_runs_every_engine_here_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix, "run_cells", _fake_cells)
    seen: list[str] = []
    cells = run_matrix(ENGINES, [], 7, jobs=1, progress=seen.append)
    assert [(c.engine, c.profile) for c in cells] == [
        (e.name, p) for e in ENGINES for p in ("exact", "core")
    ]
    assert {c.version for c in cells} == {str(os.getpid())}
    assert {c.verdict for c in cells} == {"PASS-7"}
    assert seen == ["e0", "e1", "e2", "e3", "e4"]


@needs_fork
def test_two_jobs_run_in_workers_and_keep_the_engines_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix, "run_cells", _fake_cells)
    cells = run_matrix(ENGINES, [], 3, jobs=2)
    assert [(c.engine, c.profile) for c in cells] == [
        (e.name, p) for e in ENGINES for p in ("exact", "core")
    ]
    workers = {c.version for c in cells}
    assert str(os.getpid()) not in workers
    assert len(workers) == 2  # e0 sleeps, so the other worker takes the rest meanwhile
    assert {c.verdict for c in cells} == {"PASS-3"}
    assert matrix._WORK is None  # nothing of the run is left behind


@needs_fork
def test_real_rows_are_the_same_in_workers() -> None:
    """The not-driven and not-installed rows through the pool, unpatched: the cells pickle back."""
    engines = [
        MatrixEngine("sglang-swa", "pagedprefix", not_driven=True),
        MatrixEngine("sglang-mamba", "no-such-distribution-pagedprefix", not_driven=True),
    ]
    assert run_matrix(engines, [], 0, jobs=2) == run_matrix(engines, [], 0, jobs=1)
    assert [c.verdict for c in run_matrix(engines, [], 0, jobs=2)] == ["not driven", "not installed"]


@pytest.mark.parametrize("jobs", [-1, (os.cpu_count() or 1) + 1])
def test_jobs_out_of_range_is_a_user_error(jobs: int) -> None:
    from pagedprefix import cli
    from typer.testing import CliRunner

    cli._register()
    done = CliRunner().invoke(cli.app, ["matrix", "--jobs", str(jobs)])
    assert done.exit_code == 2
    cores = os.cpu_count() or 1
    assert done.stderr.strip() == f"pagedprefix matrix: error: --jobs must be in [0, {cores}], got {jobs}"
