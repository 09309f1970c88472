"""pagedprefix sweep: the grid is the replay's own options, cells are replay command lines checked
before anything runs, the local pool and a real local Ray cluster give the same rows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pagedprefix.cluster.sweep import MAX_CELLS, CellError, check_cell, grid, grid_size, run_cell, run_sweep
from test_cluster_conform import assert_one_line_error

REST = ["--limit", "60", "--num-blocks", "unbounded", "--max-output", "16"]
CELLS = grid({"replicas": ["1", "2"], "router": ["round_robin", "prefix_aware"]}, REST)


def without_wall(rows):  # type: ignore[no-untyped-def]
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def test_the_grid_is_replay_command_lines_in_axis_order() -> None:
    cells = grid({"trace": ["conversation", "synthetic"], "replicas": ["1", "4"]}, ["--limit", "9"])
    assert cells == [
        ["--trace", t, "--replicas", r, "--limit", "9", "--no-progress"]
        for t in ("conversation", "synthetic") for r in ("1", "4")
    ]


@pytest.mark.parametrize("argv, phrase", [
    (["--router", "nope"], "unknown router 'nope'"),
    (["--replicas", "0"], "--replicas"),
    (["--frobnicate", "1"], "No such option"),
    (["--csv", "x.csv"], "writes no files of its own"),
    (["--check-spec"], "--check-spec"),
])
def test_bad_cells_are_refused_before_running(argv: list[str], phrase: str) -> None:
    with pytest.raises(CellError, match=phrase):
        check_cell(argv)


def test_local_pool_equals_running_the_cells_here() -> None:
    done = run_sweep(CELLS, "local", 2, cell_timeout=300)
    assert done.executor == "local" and len(done.rows) == 4
    here = [row for cell in CELLS for row in run_cell(cell)]
    assert without_wall(done.rows) == without_wall(here)
    assert [(r["replicas"], r["router"]) for r in done.rows] == [
        (1, "round_robin"), (1, "prefix_aware"), (2, "round_robin"), (2, "prefix_aware")]
    assert done.rows[0]["cell"].startswith("pagedprefix replay --replicas 1 --router round_robin --limit 60")


def test_a_cell_over_its_time_limit_stops_the_sweep() -> None:
    slow = grid({"replicas": ["2"]}, ["--limit", "3000", "--num-blocks", "unbounded"])
    with pytest.raises(TimeoutError, match=r"--cell-timeout 0\.5 s"):
        run_sweep(slow, "local", 1, cell_timeout=0.5)


@pytest.mark.cluster
def test_a_local_ray_cluster_gives_the_local_rows_cell_for_cell() -> None:
    if os.environ.get("PAGEDPREFIX_REQUIRE_CLUSTER") != "1":
        pytest.importorskip("ray")
    env_address = os.environ.pop("RAY_ADDRESS", None)  # a local cluster, started for the test
    try:
        on_ray = run_sweep(CELLS, "ray", 2, cell_timeout=300)
    finally:
        if env_address is not None:
            os.environ["RAY_ADDRESS"] = env_address
    local = run_sweep(CELLS, "local", 2, cell_timeout=300)
    assert on_ray.executor == "ray"
    assert without_wall(on_ray.rows) == without_wall(local.rows)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pagedprefix", "sweep", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def test_sweep_command_writes_csv_json_and_plot(tmp_path: Path) -> None:
    csv_path, json_path, plot = tmp_path / "s.csv", tmp_path / "s.json", tmp_path / "s.png"
    proc = run_cli("--replicas", "1,2", "--router", "prefix_aware", "--workers", "2", "--csv", str(csv_path),
                   "--json", str(json_path), "--plot", str(plot), "--", *REST)
    assert proc.returncode == 0, proc.stderr
    assert "2 cells on local (2 workers)" in proc.stdout
    doc = json.loads(json_path.read_text())
    assert doc["format"] == "pagedprefix.sweep.results" and doc["sweep"]["cells"] == 2
    assert [r["replicas"] for r in doc["runs"]] == [1, 2]
    assert csv_path.read_text().splitlines()[0].endswith("free_order,cell")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, phrase", [
    (["--executor", "slurm"], "--executor must be one of local, ray"),
    (["--router", "nope"], "unknown router 'nope'"),
    (["--replicas", ""], "--replicas needs at least one value"),
    (["--trace", "/no/such/trace.jsonl"], "/no/such/trace.jsonl"),
    (["--cell-timeout", "0"], "--cell-timeout must be"),
    (["--", "--bogus"], "No such option"),
])
def test_sweep_errors_are_one_line(args: list[str], phrase: str) -> None:
    assert_one_line_error(run_cli(*args), "sweep", phrase)


# ----- validate before work (issue 18, rule 5) ------------------------------------------------------


@pytest.mark.parametrize("argv, phrase", [
    (["--num-blocks", "abc"], "not a block count: 'abc'"),
    (["--num-blocks", "0"], "block counts must be >= 1"),
    (["--engine", "nope"], "engine 'nope'"),
    (["--groups", "full:16"], "--groups runs one engine"),
    (["--replicas", "2", "--restart-replica", "5@1"], "restart 5@1"),
    (["--num-blocks", "64,2147483647"], "num_blocks must be an int in [1, 2147483646]"),
    (["--samples", "100000000000"], "samples must be an int in [1, 1024]"),
])
def test_cell_options_the_replay_checks_late_are_checked_before_running(argv: list[str], phrase: str) -> None:
    with pytest.raises(CellError, match=re.escape(phrase)):
        check_cell(argv)


def test_the_grid_size_is_checked_before_the_grid_is_built() -> None:
    huge = {"replicas": [str(i) for i in range(1000)], "num-blocks": [str(i) for i in range(1, 1001)],
            "drop-events": ["0"] * 1000}
    assert grid_size(huge) == 10**9
    t0 = time.monotonic()
    with pytest.raises(CellError, match=r"the grid has 1,000,000,000 cells .* at most 10,000"):
        grid(huge, [])
    assert time.monotonic() - t0 < 5  # not minutes of building cells
    assert len(grid({"replicas": ["1"] * MAX_CELLS}, [])) == MAX_CELLS


def sweep_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pagedprefix", "sweep", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("args, phrase", [
    (["--executor", "ray", "--num-blocks", "abc"],
     "Invalid value for --num-blocks: not a block count: 'abc'"),
    (["--executor", "ray", "--", "--limit", "abc"], "Invalid value for '--limit'"),
    (["--executor", "ray", "--replicas", ",".join(map(str, range(1, 201))), "--num-blocks",
      ",".join(map(str, range(1, 201)))], "the grid has 40,000 cells"),
])
def test_a_bad_sweep_option_fails_in_one_line_before_ray_is_imported(tmp_path: Path, args: list[str],
                                                                     phrase: str) -> None:
    fake = tmp_path / "ray"  # shadows the real Ray: importing it leaves a mark
    fake.mkdir()
    mark = tmp_path / "ray-imported"
    (fake / "__init__.py").write_text(f"open({str(mark)!r}, 'w').close()\nraise ImportError('fake')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    t0 = time.monotonic()
    proc = sweep_cli(*args, env=env)
    assert time.monotonic() - t0 < 60
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagedprefix sweep: error:") and phrase in lines[0], lines
    assert not mark.exists()  # Ray was never imported, let alone started
