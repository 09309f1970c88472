"""``pagedprefix sweep``: a grid of cluster replays, each cell one task, on local cores or on Ray.

The grid is written in the replay's own options, nothing else: ``--trace``, ``--num-blocks``,
``--free-order``, ``--replicas``, ``--router`` and ``--drop-events`` take comma lists (the axes);
everything after ``--`` is passed to every cell as it is (``-- --limit 2000 --step-ms 100``). A
cell *is* a ``pagedprefix replay`` command line (its ``cell`` column): parsed by the replay
command itself, checked before anything runs, and runnable on its own.

Executors (no scheduler of our own):

- ``local`` (default): a ``multiprocessing`` pool of ``--workers`` processes (default: the CPU
  count); each worker is in its own process group, and the pool is terminated on every exit path.
- ``ray``: one Ray task per cell, on the cluster ``RAY_ADDRESS`` names, or on a local Ray cluster
  started for the sweep (real GCS, raylet and worker processes; shut down at the end). Every node
  needs pagedprefix installed (the local cluster shares this environment).

Everything is checked before any work starts, and in order of cost: the option values, the
grid's size (the product of the axis lengths, computed before the grid is built; at most
:data:`MAX_CELLS` cells), every cell's command line (the replay's own parser and checks, the
options after ``--`` included), the traces; only then is Ray imported or a pool started.

Each cell must finish within ``--cell-timeout`` seconds, or the sweep stops (exit 1) and its
workers are killed (Ray tasks cancelled). Results are the cells' rows
(:data:`pagedprefix.cluster.report.CLUSTER_FIELDS` plus ``free_order`` and ``cell``), in grid
order whatever order they finish in, so a Ray sweep and a local one give the same rows, the wall
times aside.
"""

from __future__ import annotations

import functools
import itertools
import math
import multiprocessing
import os
import shlex
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import typer
from pagedprefix.replay.cli import ClusterArgs, ClusterRunner, ReplayJob, prepare_job, replay_command
from pagedprefix.replay.cli_common import fail, parse_capacities
from pagedprefix.replay.engines import EngineUnavailable, load_factory
from pagedprefix.replay.sim import ReplayConfig

from .options import cluster_options
from .replay import run_with_twin

try:  # newer typer carries its own copy of click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - older typer on the real click
    from click.exceptions import ClickException  # type: ignore[assignment]

COMMAND = "sweep"
AXES: tuple[str, ...] = ("trace", "num-blocks", "free-order", "replicas", "router", "drop-events")
"""The replay options a sweep takes comma lists for, in grid order (the last varies fastest)."""
EXECUTORS: tuple[str, ...] = ("local", "ray")
MAX_CELLS = 10_000
"""The most cells a sweep takes (each is a whole cluster replay, and each is checked before any
runs, about 4 ms a cell: 40 s at most)."""
RAY_HINT = "--executor ray needs Ray (the cluster extra): pip install 'pagedprefix[cluster]'"
Row = dict[str, Any]


class CellError(Exception):
    """A cell's command line is not a valid replay (the message is the replay's one-line error)."""


@functools.lru_cache(maxsize=1)
def replay_click_command() -> Any:
    """The ``replay`` command as click sees it (to parse a cell's command line exactly as the
    ``pagedprefix replay`` command line is parsed); built once."""
    app = typer.Typer()
    app.command()(replay_command)
    return typer.main.get_command(app)


def parse_cell(argv: Sequence[str]) -> dict[str, Any]:
    """The replay command's parameters for ``argv``. Raises :class:`CellError`."""
    try:
        ctx = replay_click_command().make_context("replay", list(argv))
    except ClickException as exc:
        raise CellError(" ".join(exc.format_message().split())) from None
    return dict(ctx.params)


def grid_size(axes: dict[str, list[str]]) -> int:
    """The number of cells :func:`grid` makes of ``axes`` (the product of their lengths), computed
    without building it."""
    return math.prod(len(axes[a]) for a in AXES if a in axes)


def check_grid_size(axes: dict[str, list[str]]) -> int:
    """:func:`grid_size`; raises :class:`CellError` above :data:`MAX_CELLS`."""
    size = grid_size(axes)
    if size > MAX_CELLS:
        shape = " x ".join(f"{len(axes[a])} --{a}" for a in AXES if a in axes)
        raise CellError(f"the grid has {size:,} cells ({shape}); a sweep takes at most {MAX_CELLS:,}")
    return size


def grid(axes: dict[str, list[str]], rest: Sequence[str]) -> list[list[str]]:
    """Every combination of the axis values (:data:`AXES` order), each a replay command line.
    Raises :class:`CellError` when there would be more than :data:`MAX_CELLS`."""
    check_grid_size(axes)
    names = [a for a in AXES if a in axes]
    cells = []
    for values in itertools.product(*(axes[a] for a in names)):
        argv: list[str] = []
        for name, value in zip(names, values):
            argv += [f"--{name}", value]
        cells.append(argv + list(rest) + ["--no-progress"])
    return cells


def _checking_hook(args: ClusterArgs) -> ClusterRunner:
    try:
        cluster_options(args)
    except ValueError as exc:
        raise fail("replay", exc) from None

    def never(job: ReplayJob, out: Any, console: Any) -> None:  # a cell is run by run_cell
        raise AssertionError("not called")

    return never


def _one_line(exc: BaseException) -> str:
    text = exc.format_message() if isinstance(exc, ClickException) else str(exc)
    return " ".join(text.split())


def check_cell(argv: Sequence[str]) -> None:
    """Everything about a cell that can be checked without its trace: the replay's own parser, the
    capacities and replay configs (as ``prepare_job`` builds them), the engine, the cluster options.
    Raises :class:`CellError` (one line)."""
    params = parse_cell(argv)
    if params["indexer"] != "reference" or params["csv_path"] or params["json_path"] or params["plot"]:
        raise CellError("a sweep cell routes on the reference indexer and writes no files of its own")
    if params["check_spec"]:
        raise CellError("--check-spec does not combine with a sweep")
    if params.get("groups") is not None:
        raise CellError("--groups runs one engine; it does not combine with a sweep")
    try:
        for capacity in parse_capacities(params["num_blocks"]):
            ReplayConfig(block_size=params["block_size"], num_blocks=capacity,
                         max_running=params["max_running"], decode_chunk=params["decode_chunk"],
                         max_output=params["max_output"], samples=params["samples"],
                         step_ms=params["step_ms"], hash_algo=params["hash_algo"],
                         free_order=params["free_order"]).validate()
        cluster_options(_args(params))
    except (ValueError, ClickException) as exc:  # InvalidConfig is a ValueError
        raise CellError(_one_line(exc)) from None
    try:
        load_factory(params["engine"])
    except EngineUnavailable as exc:
        raise CellError(_one_line(exc)) from None
    except Exception as exc:  # a module:factory whose import fails in any other way
        raise CellError(f"engine {params['engine']!r} cannot be loaded: {_one_line(exc)}") from None


def _args(params: dict[str, Any]) -> ClusterArgs:
    return ClusterArgs(params["replicas"], params["router"] or "round_robin", params["router_lambda"],
                       params["drop_events"], list(params["restart_replica"] or []), params["transport"],
                       params["fault_seed"], params["indexer"], params["event_heartbeat"])


def run_cell(argv: Sequence[str]) -> list[Row]:
    """Run one cell (a replay command line) as a cluster replay; its rows, one per capacity. Runs in
    a worker: a user error raises :class:`CellError`; anything else propagates."""
    params = parse_cell(argv)
    params["router"] = params["router"] or "round_robin"  # a cell is always a cluster replay
    try:
        job = prepare_job(params, None, _checking_hook)
    except typer.Exit:  # prepare_job already printed the one-line error
        raise CellError(f"cell {shlex.join(argv)} is not a valid replay") from None
    options = cluster_options(job.cluster)
    rows = []
    for config in job.configs:
        result = run_with_twin(job.requests, config, options, job.factory, engine_name=job.engine,
                               trace_name=job.trace)
        row = result.row()
        row["free_order"] = config.free_order
        row["cell"] = "pagedprefix replay " + shlex.join(argv)
        rows.append(row)
    return rows


# ----- executors --------------------------------------------------------------------------------


@dataclass
class SweepRun:
    """The rows of every cell in grid order, and how the sweep ran."""

    rows: list[Row]
    executor: str
    workers: int
    wall_s: float


Progress = Callable[[int], None]


def _own_group() -> None:
    os.setpgrp()  # a worker's own process group: terminate() reaches it, a terminal's ^C does not


def run_local(cells: list[list[str]], workers: int, cell_timeout: float,
              progress: Progress) -> list[list[Row]]:
    """The cells on a pool of ``workers`` processes; every result within ``cell_timeout`` seconds of
    the previous one (or of the start). Raises ``TimeoutError``; the pool is terminated on every path."""
    out: list[list[Row] | None] = [None] * len(cells)
    pool = multiprocessing.get_context("spawn").Pool(workers, initializer=_own_group)
    try:
        pending = {i: pool.apply_async(run_cell, (cell,)) for i, cell in enumerate(cells)}
        deadline = time.monotonic() + cell_timeout
        while pending:
            done = [i for i, r in pending.items() if r.ready()]
            for i in done:
                out[i] = pending.pop(i).get()
                progress(len(cells) - len(pending))
                deadline = time.monotonic() + cell_timeout
            if not done:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no cell finished within --cell-timeout {cell_timeout:g} s")
                time.sleep(0.05)
    finally:
        pool.terminate()
        pool.join()
    return [rows for rows in out if rows is not None]


@contextmanager
def ray_cluster(workers: int) -> Iterator[Any]:
    """Connect to ``RAY_ADDRESS``, or start a local Ray cluster of ``workers`` CPUs; shut down on
    exit. Yields the ``ray`` module. Raises ``ImportError`` without Ray."""
    import ray

    address = os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address is None:
        kwargs["num_cpus"] = workers
    ray.init(address=address, **kwargs)
    try:
        yield ray
    finally:
        ray.shutdown()


def run_ray(cells: list[list[str]], workers: int, cell_timeout: float, progress: Progress) -> list[list[Row]]:
    """The cells as Ray tasks (one CPU each). Raises ``TimeoutError`` (the tasks are cancelled)."""
    with ray_cluster(workers) as ray:
        task = ray.remote(num_cpus=1, max_retries=0)(run_cell)
        refs = [task.remote(cell) for cell in cells]
        index = {ref: i for i, ref in enumerate(refs)}
        out: list[list[Row] | None] = [None] * len(cells)
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=cell_timeout)
                if not done:
                    raise TimeoutError(f"no cell finished within --cell-timeout {cell_timeout:g} s")
                for ref in done:
                    out[index[ref]] = ray.get(ref)
                progress(len(cells) - len(pending))
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
    return [rows for rows in out if rows is not None]


def run_sweep(cells: list[list[str]], executor: str, workers: int, cell_timeout: float,
              progress: Progress | None = None) -> SweepRun:
    """Run every cell on ``executor`` (``local`` or ``ray``) and flatten their rows in grid order."""
    run = run_ray if executor == "ray" else run_local
    t0 = time.perf_counter()
    per_cell = run(cells, workers, cell_timeout, progress or (lambda done: None))
    rows = [row for cell_rows in per_cell for row in cell_rows]
    return SweepRun(rows, executor, workers, time.perf_counter() - t0)


def ray_available() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True
