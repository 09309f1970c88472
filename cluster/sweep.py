"""``pagedprefix sweep``: a grid of cluster replays, each cell one task, on local cores or on Ray.

The grid is written in the replay's own options, nothing else: ``--trace``, ``--num-blocks``,
``--free-order``, ``--replicas``, ``--router`` and ``--drop-events`` take comma lists (the axes);
everything after ``--`` is passed to every cell as it is (``-- --limit 2000 --step-ms 100``). A
cell *is* a ``pagedprefix replay`` command line (its ``cell`` column): parsed by the replay
command itself, checked before anything runs, and runnable on its own.

Executors (no scheduler of our own):

- ``local`` (default): ``--workers`` worker processes (default: the CPU count) started with
  ``multiprocessing``'s ``spawn``, each in its own process group and killed when the harness dies
  (:func:`pagedprefix.conformance.running.lifetime.worker_setup`), all killed on every exit path. The
  harness waits on each worker's pipe *and* its process sentinel, so a worker that dies
  (``os._exit``, a signal, a crash in C) is seen at once and fails the cell it was running.
- ``ray``: one Ray task per cell, on the cluster ``RAY_ADDRESS`` names, or on a local Ray cluster
  started for the sweep (real GCS, raylet and worker processes; shut down at the end). Every node
  needs pagedprefix installed (the local cluster shares this environment).

Everything is checked before any work starts, and in order of cost: the option values, the
grid's size (the product of the axis lengths, computed before the grid is built; at most
:data:`MAX_CELLS` cells), every cell's command line (the replay's own parser and checks, the
options after ``--`` included), the traces; only then is Ray imported or a pool started.

Each cell must finish within ``--cell-timeout`` seconds (from when a worker takes it), or the sweep
stops (exit 1) and its workers are killed (Ray tasks cancelled). A cell that raises anything
(``SystemExit(0)`` and ``KeyboardInterrupt`` included) or kills its worker stops the sweep the same
way, with one line naming the cell and what happened (:class:`CellFailed`): never a PASS.

Results are the cells' rows (:data:`pagedprefix.cluster.report.CLUSTER_FIELDS` plus
``free_order`` and ``cell``), in grid order whatever order they finish in, so a Ray sweep and a
local one give the same rows, the wall times aside.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import math
import multiprocessing
import os
import shlex
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import typer
from pagedprefix.conformance.running.lifetime import watching_descendants, worker_setup
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

CELL_HOOK_ENV = "PAGEDPREFIX_SWEEP_CELL_HOOK"
"""Test hook: ``module:function``, called in the worker with a cell's command line before the cell
runs (a test makes a cell that kills its worker, raises ``SystemExit``, ...). Unset in real use."""
WORKER_START_TIMEOUT = 120.0
"""Seconds a local worker may take to start (import pagedprefix) before it is given a cell."""


class CellFailed(RuntimeError):
    """A cell raised (anything, ``SystemExit`` and ``KeyboardInterrupt`` included) or killed its
    worker; the message is one line naming the cell and what happened."""


def _cell_name(argv: Sequence[str]) -> str:
    return f"cell 'pagedprefix replay {shlex.join(argv)}'"


def _what(exc: BaseException) -> str:
    return " ".join(repr(exc).split())[:300]


def _cell_hook() -> Callable[[list[str]], object] | None:
    spec = os.environ.get(CELL_HOOK_ENV)
    if not spec:
        return None
    module, _, attr = spec.partition(":")
    hook: Callable[[list[str]], object] = getattr(importlib.import_module(module), attr)
    return hook


def _worker(conn: Connection, parent: int) -> None:
    """A local worker: ``("ready",)``, then for each ``(index, argv)`` it receives one of
    ``("rows", index, rows)``, ``("user", index, message)`` (a :class:`CellError`) or
    ``("raised", index, what)`` (anything else; the worker then exits); ``None`` ends it."""
    worker_setup(parent)
    hook = _cell_hook()
    conn.send(("ready",))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        index, argv = task
        try:
            if hook is not None:
                hook(list(argv))
            rows = run_cell(argv)
        except CellError as exc:
            conn.send(("user", index, str(exc)))
        except BaseException as exc:  # SystemExit(0) and KeyboardInterrupt are failures of the cell too
            conn.send(("raised", index, _what(exc)))
            return
        else:
            conn.send(("rows", index, rows))


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-exitcode).name}"
        return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


@dataclass
class _Slot:
    """One local worker: its process, its end of the task pipe, and the cell it runs."""

    proc: Any
    conn: Connection
    started: float
    cell: int | None = None
    deadline: float = 0.0
    ready: bool = False


def run_local(cells: list[list[str]], workers: int, cell_timeout: float,
              progress: Progress) -> list[list[Row]]:
    """The cells on ``workers`` worker processes (``spawn``), each cell within ``cell_timeout``
    seconds of being handed to a worker. A worker's death is seen at once (its sentinel): the
    cell it ran fails. Raises :class:`CellFailed` (a cell raised or killed its worker),
    :class:`CellError` (a cell is not a valid replay) or ``TimeoutError``; every worker is killed
    on every path."""
    ctx = multiprocessing.get_context("spawn")
    out: list[list[Row] | None] = [None] * len(cells)
    todo = list(range(len(cells)))[::-1]
    slots: list[_Slot] = []
    done = 0
    try:
        for _ in range(min(workers, len(cells))):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(theirs, os.getpid()), daemon=True)
            proc.start()
            theirs.close()
            slots.append(_Slot(proc, mine, time.monotonic()))
        while done < len(cells):
            now = time.monotonic()
            for slot in slots:
                if slot.cell is not None and now > slot.deadline:
                    raise TimeoutError(f"{_cell_name(cells[slot.cell])} did not finish within "
                                       f"--cell-timeout {cell_timeout:g} s")
                if not slot.ready and now > slot.started + WORKER_START_TIMEOUT:
                    raise CellFailed(f"a sweep worker did not start within {WORKER_START_TIMEOUT:g} s")
            live = [s for s in slots if s.proc is not None]
            waits = [s.deadline if s.cell is not None else s.started + WORKER_START_TIMEOUT
                     for s in live if s.cell is not None or not s.ready]
            timeout = max(0.0, min(waits) - now) if waits else None
            ready = set(wait([s.conn for s in live] + [s.proc.sentinel for s in live], timeout))
            for slot in live:
                if slot.conn in ready or slot.conn.poll():
                    try:
                        message = slot.conn.recv()
                    except (EOFError, OSError):
                        message = None
                    if message is not None:
                        done += _handle(slot, message, cells, out, todo, cell_timeout)
                        if message[0] in ("rows",):
                            progress(done)
                        continue
                if slot.proc.sentinel in ready or not slot.proc.is_alive():
                    slot.proc.join(1)
                    if slot.cell is None and slot.ready and not todo:
                        slot.proc = None  # retired after its last cell
                        continue
                    what = _death(slot.proc.exitcode)
                    if slot.cell is None:
                        raise CellFailed(f"a sweep worker died before running a cell ({what})")
                    raise CellFailed(f"{_cell_name(cells[slot.cell])} killed its worker ({what})")
    finally:
        for slot in slots:
            slot.conn.close()
            if slot.proc is not None:
                slot.proc.kill()
        for slot in slots:
            if slot.proc is not None:
                slot.proc.join(5)
    return [rows for rows in out if rows is not None]


def _handle(slot: _Slot, message: tuple[Any, ...], cells: list[list[str]], out: list[list[Row] | None],
            todo: list[int], cell_timeout: float) -> int:
    """Act on one message from a worker (hand it the next cell); the number of cells it finished."""
    kind = message[0]
    finished = 0
    if kind == "rows":
        out[message[1]] = message[2]
        finished = 1
    elif kind == "user":
        raise CellError(message[2])
    elif kind == "raised":
        raise CellFailed(f"{_cell_name(cells[message[1]])} raised {message[2]}")
    slot.ready = True
    slot.cell = None
    if todo:
        slot.cell = todo.pop()
        slot.deadline = time.monotonic() + cell_timeout
        slot.conn.send((slot.cell, cells[slot.cell]))
    else:
        slot.conn.send(None)
    return finished


@contextmanager
def ray_cluster(workers: int) -> Iterator[Any]:
    """Connect to ``RAY_ADDRESS``, or start a local Ray cluster of ``workers`` CPUs; shut down on
    every exit path (this process's SIGTERM, SIGHUP and SIGINT handlers are kept: Ray's own would
    replace them), and a local cluster's processes killed even when this process is SIGKILLed
    (:func:`~pagedprefix.conformance.running.lifetime.watching_descendants`). Yields the ``ray`` module.
    Raises ``ImportError`` without Ray."""
    import ray

    address = os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address is None:
        kwargs["num_cpus"] = workers
    ours = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    with contextlib.ExitStack() as stack:
        if address is None:  # a cluster of our own: its daemons go with this process, SIGKILL included
            stack.enter_context(watching_descendants())
        try:
            ray.init(address=address, **kwargs)
        finally:
            for signum, handler in ours.items():  # Ray installs its own: SIGTERM must still end us cleanly
                if handler is not None:
                    signal.signal(signum, handler)
        try:
            yield ray
        finally:
            ray.shutdown()


def _ray_cell(argv: list[str]) -> tuple[str, Any]:
    """One cell in a Ray task: ``("rows", rows)``, ``("user", message)`` (a :class:`CellError`) or
    ``("raised", what)`` (anything else, ``SystemExit`` and ``KeyboardInterrupt`` included)."""
    try:
        hook = _cell_hook()
        if hook is not None:
            hook(list(argv))
        return "rows", run_cell(argv)
    except CellError as exc:
        return "user", str(exc)
    except BaseException as exc:
        return "raised", _what(exc)


def _ray_result(ray: Any, ref: Any, argv: list[str]) -> list[Row]:
    try:
        kind, value = ray.get(ref)
    except Exception as exc:  # the task's worker died (ray.exceptions.WorkerCrashedError, ...)
        raise CellFailed(f"{_cell_name(argv)} killed its worker ({type(exc).__name__})") from None
    if kind == "user":
        raise CellError(value)
    if kind == "raised":
        raise CellFailed(f"{_cell_name(argv)} raised {value}")
    rows: list[Row] = value
    return rows


def run_ray(cells: list[list[str]], workers: int, cell_timeout: float, progress: Progress) -> list[list[Row]]:
    """The cells as Ray tasks (one CPU each). Raises ``TimeoutError`` (the tasks are cancelled),
    :class:`CellFailed` or :class:`CellError` as :func:`run_local` does."""
    with ray_cluster(workers) as ray:
        task = ray.remote(num_cpus=1, max_retries=0)(_ray_cell)
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
                    out[index[ref]] = _ray_result(ray, ref, cells[index[ref]])
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
