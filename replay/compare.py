"""``pagedprefix compare-engines``: the hash engine (both free orders) against the radix engine.

Every engine replays the same requests with the same :class:`~pagedprefix.replay.sim.ReplayConfig`
(:func:`~pagedprefix.replay.sim.run_replay`, so the scheduler and the hit accounting are the
replay's), at every capacity of a sweep, on every trace. Engines (:data:`ENGINES`):

- ``hash/unhashed_to_head``: :class:`pagedprefix.impl.BlockManager`, a freed block without a key
  goes to the head of the free queue, keyed blocks to the tail (vLLM today);
- ``hash/append_all``: the same manager, every freed block to the tail (older vLLM v1);
- ``radix``: :class:`pagedprefix.impl.radix.RadixCache`, a tree of token pages with leaf-first LRU
  eviction (it ignores ``free_order``: its policy is its own).

What each run measures, besides the replay's own counters (hit rates, evictions, preemptions):

- **engine time** (``engine_s``): seconds spent inside the engine's ``allocate``, ``append``,
  ``fork`` and ``free`` calls, summed by a thin timing proxy around the engine (``perf_counter``
  around each call). ``ops_per_s`` is the replay's operation count over that time. The replay's
  own work (token synthesis, scheduling, the ``num_free_blocks`` probe after every operation) is
  not in it; ``wall_s`` (the whole :func:`run_replay`) and ``cpu_s`` (its process CPU time) are
  reported beside it.
- **metadata bytes per block**: the engine's state once the replay has ended (every request freed,
  so it is the cache itself: per-block arrays, free queue, index or tree, cached keys or page
  contents), divided by ``num_blocks``. ``walk`` (the default) adds up ``sys.getsizeof`` of every
  object reachable from the engine (each counted once; types, functions, modules, ``None``, bools
  and the interpreter's small ints are shared and not counted). ``tracemalloc`` replays a second
  time under :mod:`tracemalloc` and counts the bytes released when the engine is dropped: the
  approach of ``benchmarks/test_bench_impl.py``, but the traced replay is 3-6 times slower. On
  the first 40 conversation requests the walk reads 0.5-2.2 % below tracemalloc (``getsizeof``
  says 28 bytes for an int the allocator was asked 32 for). Neither counts the allocator's own
  rounding. Both drop the hash engine's memo of the last freed request's keys first (a lookup
  shortcut, not per-block state; the benchmark does the same).
- **cache census**: blocks holding cached content at the end (``cached_blocks``) and how many of
  them repeat content another cached block holds (``duplicate_blocks``): the hash engine keeps
  duplicates indexed until they are evicted; the radix tree keeps one page per content and drops
  a private copy (shadow) as soon as its request frees it.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer
from pagedprefix.conformance.running.supervise import supervised_command
from pagedprefix.spec import CacheConfig, PrefixCacheError
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .cli_common import _progress, fail, memory_problem, outputs_problem, parse_capacities, write_outputs
from .engines import EngineUnavailable, ReplayEngine, load_factory
from .measure import TimedEngine, cache_census, drop_transient, reachable_bytes, traced_metadata_bytes
from .report import CSV_FIELDS, monotonicity_violations
from .sim import ProgressFn, ReplayConfig, ReplayResult, run_replay, unbounded_blocks
from .trace import BUILTIN_TRACES, TraceError, TraceRequest, load_trace

__all__ = [
    "COMPARE_FIELDS",
    "DEFAULT_CAPACITIES",
    "DEFAULT_LIMIT",
    "DEFAULT_TRACES",
    "ENGINES",
    "MEMORY_METHODS",
    "EngineRun",
    "EngineSpec",
    "TimedEngine",
    "cache_census",
    "compare_engines",
    "compare_engines_command",
    "compare_json",
    "compare_table",
    "parse_engines",
    "reachable_bytes",
    "register",
    "run_engine",
    "write_compare_csv",
    "write_compare_json",
    "write_compare_plot",
]

DEFAULT_TRACES = "conversation,synthetic"
DEFAULT_CAPACITIES = "4000,32000,256000,1000000"
DEFAULT_LIMIT = 2000
MEMORY_METHODS: tuple[str, ...] = ("walk", "tracemalloc", "none")


@dataclass(frozen=True)
class EngineSpec:
    """One contender: a label, the engine name for :func:`load_factory`, and the free order put in
    the :class:`CacheConfig` (``None``: the engine has its own policy and ignores it)."""

    label: str
    engine: str
    free_order: str | None
    measure_memory: bool = True
    """Walk the engine's objects for its metadata bytes (off for an engine given with ``--engine``,
    whose object graph reaches into its own package: the bytes would not compare)."""


ENGINES: tuple[EngineSpec, ...] = (
    EngineSpec("hash/unhashed_to_head", "impl", "unhashed_to_head"),
    EngineSpec("hash/append_all", "impl", "append_all"),
    EngineSpec("radix", "radix", None),
)


# ----- one comparison -----------------------------------------------------------------------------


@dataclass
class EngineRun:
    """One engine on one trace at one capacity."""

    label: str
    free_order: str | None
    result: ReplayResult
    engine_s: float
    cpu_s: float
    memory_method: str
    metadata_bytes: int | None
    cached_blocks: int | None
    distinct_cached: int | None

    @property
    def ops_per_s(self) -> float | None:
        return self.result.operations / self.engine_s if self.engine_s > 0 else None

    @property
    def metadata_bytes_per_block(self) -> float | None:
        if self.metadata_bytes is None:
            return None
        return self.metadata_bytes / self.result.num_blocks

    @property
    def duplicate_blocks(self) -> int | None:
        if self.cached_blocks is None or self.distinct_cached is None:
            return None
        return self.cached_blocks - self.distinct_cached

    def row(self) -> dict[str, Any]:
        """The replay's flat row (engine = this label) and this comparison's measurements."""
        out = self.result.row()
        out["engine"] = self.label
        out.update(
            free_order=self.free_order or "",
            engine_s=self.engine_s,
            ops_per_s=self.ops_per_s,
            cpu_s=self.cpu_s,
            memory_method=self.memory_method,
            metadata_bytes=self.metadata_bytes,
            metadata_bytes_per_block=self.metadata_bytes_per_block,
            cached_blocks=self.cached_blocks,
            duplicate_blocks=self.duplicate_blocks,
        )
        return out


COMPARE_FIELDS: tuple[str, ...] = (
    "trace", "engine", "free_order",
    *(f for f in CSV_FIELDS if f not in ("engine", "trace", "diverged")),
    "engine_s", "ops_per_s", "cpu_s", "memory_method", "metadata_bytes", "metadata_bytes_per_block",
    "cached_blocks", "duplicate_blocks",
)


def run_engine(
    requests: Sequence[TraceRequest],
    config: ReplayConfig,
    spec: EngineSpec,
    *,
    trace_name: str = "",
    memory: str = "walk",
    progress: ProgressFn | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> EngineRun:
    """Replay ``requests`` through one engine and measure it (see the module docstring); the
    engine time is read from ``clock`` (:class:`TimedEngine`)."""
    if memory not in MEMORY_METHODS:
        raise ValueError(f"memory must be one of {MEMORY_METHODS}, got {memory!r}")
    base = load_factory(spec.engine)
    cfg = config if spec.free_order is None else replace(config, free_order=spec.free_order)
    timed: list[TimedEngine] = []

    def factory(cache_config: CacheConfig) -> ReplayEngine:
        engine = TimedEngine(base(cache_config), clock)
        timed.append(engine)
        return engine

    gc.collect()  # garbage of an earlier run must not be collected on this run's clock
    cpu0 = time.process_time()
    result = run_replay(requests, cfg, factory, engine_name=spec.label, trace_name=trace_name,
                        progress=progress)
    cpu_s = time.process_time() - cpu0
    engine_s = timed[0].seconds
    engine: object = timed[0].inner
    census = cache_census(engine)
    metadata: int | None = None
    if memory == "walk" and spec.measure_memory:
        drop_transient(engine)
        metadata = reachable_bytes(engine)
    del engine
    timed.clear()
    if memory == "tracemalloc" and spec.measure_memory:
        metadata = traced_metadata_bytes(requests, cfg, base)
    return EngineRun(
        label=spec.label, free_order=spec.free_order, result=result, engine_s=engine_s,
        cpu_s=cpu_s, memory_method=memory, metadata_bytes=metadata,
        cached_blocks=None if census is None else census[0],
        distinct_cached=None if census is None else census[1],
    )


def parse_engines(text: str) -> tuple[EngineSpec, ...]:
    """``"all"`` or a comma list of :data:`ENGINES` labels (``hash`` selects both free orders)."""
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    if not wanted or wanted == ["all"]:
        return ENGINES
    chosen: list[EngineSpec] = []
    for name in wanted:
        matches = [e for e in ENGINES if e.label == name or e.label.split("/")[0] == name]
        if not matches:
            labels = ", ".join(e.label for e in ENGINES)
            raise ValueError(f"unknown engine {name!r}; choose from all, hash, {labels}")
        chosen.extend(m for m in matches if m not in chosen)
    return tuple(e for e in ENGINES if e in chosen)


RunContext = Callable[[str, int | None, EngineSpec], AbstractContextManager[ProgressFn | None]]
"""Entered around each run with (trace, capacity, engine); yields a progress callback or ``None``."""


def compare_engines(
    traces: dict[str, Sequence[TraceRequest]],
    capacities: Sequence[int | None],
    *,
    block_size: int = 16,
    max_running: int = 16,
    decode_chunk: int = 16,
    max_output: int | None = None,
    hash_algo: str = "sha256",
    engines: Sequence[EngineSpec] = ENGINES,
    memory: str = "walk",
    around_run: RunContext | None = None,
    after_run: Callable[[EngineRun], None] | None = None,
) -> list[EngineRun]:
    """Every engine on every trace at every capacity (``None``: a pool that never evicts), in that
    nesting: the engines take turns at each capacity, so a noisy neighbour slows all of them alike."""
    runs: list[EngineRun] = []
    for name, requests in traces.items():
        for cap in capacities:
            config = ReplayConfig(block_size=block_size, num_blocks=cap, max_running=max_running,
                                  decode_chunk=decode_chunk, max_output=max_output, hash_algo=hash_algo)
            for spec in engines:
                context = around_run(name, cap, spec) if around_run is not None else nullcontext(None)
                with context as progress:
                    run = run_engine(requests, config, spec, trace_name=name, memory=memory,
                                     progress=progress)
                runs.append(run)
                if after_run is not None:
                    after_run(run)
    return runs


# ----- outputs ------------------------------------------------------------------------------------


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _count(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"


def _ordered(runs: Sequence[EngineRun]) -> list[EngineRun]:
    traces = list(dict.fromkeys(r.result.trace for r in runs))
    labels = list(dict.fromkeys(r.label for r in runs))
    return sorted(runs, key=lambda r: (traces.index(r.result.trace), r.result.num_blocks,
                                       labels.index(r.label)))


def compare_table(runs: Sequence[EngineRun]) -> Table:
    """One row per run, grouped by trace and capacity (``*``: a pool that never evicts)."""
    table = Table(title="engine comparison", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for name in ("trace", "blocks", "engine", "token\nhit", "block\nhit", "evicted", "dup\nblocks",
                 "pre-\nempted", "ops", "engine\ns", "ops/s", "bytes/\nblock", "wall\ns"):
        table.add_column(name, justify="left" if name in ("trace", "engine") else "right", no_wrap=True)
    previous: tuple[str, int] | None = None
    for run in _ordered(runs):
        r = run.result
        group = (r.trace, r.num_blocks)
        if previous is not None and group != previous:
            table.add_section()
        previous = group
        table.add_row(
            Text(r.trace), f"{r.num_blocks:,}{'*' if r.unbounded else ''}", run.label,
            _fmt(r.token_hit_rate), _fmt(r.block_hit_rate), _count(r.evictions), _count(run.duplicate_blocks),
            str(r.preemptions), f"{r.operations:,}", f"{run.engine_s:.2f}",
            "-" if run.ops_per_s is None else f"{run.ops_per_s:,.0f}",
            _fmt(run.metadata_bytes_per_block, 1), f"{r.wall_s:.1f}",
        )
    bounds = {r.result.trace: r.result for r in runs if r.result.bound_token_hit_rate is not None}
    notes = [f"{t}: unbounded bound {_fmt(r.bound_token_hit_rate)} token, "
             f"{_fmt(r.bound_block_hit_rate)} block hit rate" for t, r in bounds.items()]
    if any(r.result.unbounded for r in runs):
        notes.append("* unbounded: a pool that never evicts")
    table.caption = Text("\n".join(notes)) if notes else None  # trace names are not markup
    return table


def _violations(runs: Sequence[EngineRun]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[ReplayResult]] = {}
    for run in runs:
        groups.setdefault((run.result.trace, run.label), []).append(run.result)
    return [
        {"trace": trace, "engine": label, "from_blocks": a, "to_blocks": b, "from_rate": ra, "to_rate": rb}
        for (trace, label), results in groups.items()
        for a, b, ra, rb in monotonicity_violations(results)
    ]


def compare_json(runs: Sequence[EngineRun], settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document: settings, one row per run, the bound per trace, and any capacity at which
    an engine's token hit rate drops below its rate at a smaller capacity."""
    bounds = {
        r.result.trace: {"token_hit_rate": r.result.bound_token_hit_rate,
                         "block_hit_rate": r.result.bound_block_hit_rate}
        for r in runs
    }
    return {
        "format": "pagedprefix.replay.engines",
        "version": 1,
        "settings": settings or {},
        "runs": [r.row() for r in _ordered(runs)],
        "bounds": bounds,
        "monotonicity_violations": _violations(runs),
    }


def write_compare_json(
    runs: Sequence[EngineRun], path: str | Path, settings: dict[str, Any] | None = None
) -> None:
    Path(path).write_text(json.dumps(compare_json(runs, settings), indent=2) + "\n")


def write_compare_csv(runs: Sequence[EngineRun], path: str | Path) -> None:
    import csv

    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COMPARE_FIELDS), extrasaction="ignore")
        writer.writeheader()
        for run in _ordered(runs):
            writer.writerow(run.row())


_STYLES: dict[str, dict[str, Any]] = {
    "hash/unhashed_to_head": {"marker": "o", "linestyle": "-", "markersize": 8},
    "hash/append_all": {"marker": "s", "linestyle": "--", "markersize": 6},
    "radix": {"marker": "^", "linestyle": ":", "markersize": 5},
}


def write_compare_plot(runs: Sequence[EngineRun], path: str | Path, *, title: str | None = None) -> None:
    """One column per trace: token hit rate against capacity (log x; one line per engine; the
    unbounded bound as a grey line), engine ops/s, and metadata bytes per block when measured.

    Needs matplotlib (the ``plot`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = _ordered(runs)
    traces = list(dict.fromkeys(r.result.trace for r in ordered))
    labels = list(dict.fromkeys(r.label for r in ordered))
    with_memory = any(r.metadata_bytes is not None for r in ordered)
    panels: list[tuple[str, Callable[[EngineRun], float | None]]] = [
        ("token hit rate", lambda r: r.result.token_hit_rate),
        ("engine ops/s", lambda r: r.ops_per_s),
    ]
    if with_memory:
        panels.append(("metadata bytes per block", lambda r: r.metadata_bytes_per_block))
    fig, axes = plt.subplots(len(panels), len(traces), figsize=(5.5 * len(traces), 3.2 * len(panels)),
                             squeeze=False, sharex="col")
    for col, trace in enumerate(traces):
        mine = [r for r in ordered if r.result.trace == trace]
        for row, (ylabel, value) in enumerate(panels):
            ax = axes[row][col]
            for label in labels:
                points = [(r.result.num_blocks, value(r)) for r in mine if r.label == label]
                xs = [x for x, y in points if y is not None]
                ys = [y for _, y in points if y is not None]
                if xs:
                    ax.plot(xs, ys, label=label, **_STYLES.get(label, {"marker": "o"}))
            if row == 0 and mine and mine[0].result.bound_token_hit_rate is not None:
                bound = mine[0].result.bound_token_hit_rate
                ax.axhline(bound, color="grey", linestyle=":", label=f"unbounded bound ({bound:.3f})")
                first = mine[0].result
                ax.set_title(f"{trace}: {first.requests} requests, max_running {first.max_running}",
                             fontsize=10)
            xs_all = sorted({r.result.num_blocks for r in mine})
            if len(xs_all) > 1 and xs_all[0] > 0 and xs_all[-1] / xs_all[0] >= 10:
                ax.set_xscale("log")
            if row == len(panels) - 1 and mine:
                ax.set_xlabel(f"capacity (blocks of {mine[0].result.block_size} tokens)")
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            if row == 0:
                ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----- the command --------------------------------------------------------------------------------

_H_TRACE = f"comma list of built-in traces ({', '.join(BUILTIN_TRACES)}) or JSONL paths"
_H_BLOCKS = "comma list of pool sizes in blocks; 'unbounded' never evicts"
_H_LIMIT = "first N valid requests of each trace; 0 takes the whole trace"
_H_ENGINES = "all, or a comma list of: hash (both free orders), " + ", ".join(e.label for e in ENGINES)
_H_MEMORY = ("metadata bytes: walk (getsizeof of the reachable state), tracemalloc (a second, "
             "traced replay; several times slower) or none")
_H_PLOT = "write hit rate, ops/s and bytes per block against capacity as PNG (needs matplotlib)"
_H_PROGRESS = "progress bar (default: on a terminal, for long runs)"
_H_HASH = "the hash engine's block key hash: sha256 or xxh3_128"
_H_ENGINE = ("also run this engine beside the others (repeatable): a short name (vllm, sglang, spec, ...) "
             "or module:factory, with its own policy (its metadata bytes are not measured)")


def compare_engines_command(
    trace: Annotated[str, typer.Option(help=_H_TRACE)] = DEFAULT_TRACES,
    num_blocks: Annotated[str, typer.Option(help=_H_BLOCKS)] = DEFAULT_CAPACITIES,
    block_size: Annotated[int, typer.Option(min=1, help="tokens per block")] = 16,
    limit: Annotated[int, typer.Option(min=0, help=_H_LIMIT)] = DEFAULT_LIMIT,
    max_running: Annotated[int, typer.Option(min=1, help="most requests running at once")] = 16,
    decode_chunk: Annotated[int, typer.Option(min=1, help="decode tokens per sequence per step")] = 16,
    max_output: Annotated[int | None, typer.Option(min=0, help="cap each request's output_length")] = None,
    hash_algo: Annotated[str, typer.Option(help=_H_HASH)] = "sha256",
    engines: Annotated[str, typer.Option(help=_H_ENGINES)] = "all",
    engine: Annotated[list[str] | None, typer.Option("--engine", help=_H_ENGINE)] = None,
    memory: Annotated[str, typer.Option(help=_H_MEMORY)] = "walk",
    csv_path: Annotated[Path | None, typer.Option("--csv", help="write one CSV row per run")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the results as JSON")] = None,
    plot: Annotated[Path | None, typer.Option(help=_H_PLOT)] = None,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress", help=_H_PROGRESS)] = None,
) -> None:
    """Compare the hash engine (both free orders) with the radix engine: hit rates, ops/s and
    metadata bytes per block, per trace and capacity."""
    console = Console(stderr=True)
    out = Console()
    if not out.is_terminal:
        out = Console(width=160)
    capacities, chosen, names = _check_options(num_blocks, engines, trace, memory, block_size, max_running,
                                               decode_chunk, max_output, hash_algo, engine or [])
    problem = outputs_problem({"--csv": csv_path, "--json": json_path, "--plot": plot})
    if problem is not None:
        raise fail(COMMAND, problem)
    loaded = _load_traces(names, limit)
    _check_memory(loaded, capacities, chosen, block_size, max_output)
    show = progress
    if show is None:
        show = console.is_terminal and max(len(r) for r in loaded.values()) >= 500
    supervised_command(
        lambda: _compare_run(loaded, capacities, chosen, names, show, console, out, limit, block_size,
                             max_running, decode_chunk, max_output, hash_algo, memory,
                             (csv_path, json_path, plot)),
        COMMAND,
    )


def _compare_run(
    loaded: dict[str, Sequence[TraceRequest]], capacities: list[int | None], chosen: tuple[EngineSpec, ...],
    names: list[str], show: bool, console: Console, out: Console, limit: int, block_size: int,
    max_running: int, decode_chunk: int, max_output: int | None, hash_algo: str, memory: str,
    outputs: tuple[Path | None, Path | None, Path | None],
) -> None:
    """The runs of ``compare-engines`` (every option checked), the table and the files. (Run in
    the supervised child: :mod:`pagedprefix.conformance.running.supervise`.)"""
    csv_path, json_path, plot = outputs
    t0 = time.perf_counter()

    def around_run(name: str, cap: int | None, spec: EngineSpec) -> AbstractContextManager[ProgressFn | None]:
        label = f"{name} {'unbounded' if cap is None else cap} {spec.label}"
        return _progress(show, console, label, len(loaded[name]))

    def after_run(run: EngineRun) -> None:
        r = run.result
        console.print(f"{r.trace} {r.num_blocks} {run.label}: token hit {r.token_hit_rate:.4f}, "
                      f"wall {r.wall_s:.1f} s", highlight=False, markup=False)

    try:
        runs = compare_engines(
            loaded, capacities, block_size=block_size, max_running=max_running, decode_chunk=decode_chunk,
            max_output=max_output, hash_algo=hash_algo, engines=chosen, memory=memory,
            around_run=around_run, after_run=after_run,
        )
    except PrefixCacheError as exc:  # e.g. a pool an engine refuses (InvalidConfig)
        raise fail(COMMAND, exc) from None
    except Exception as exc:  # an engine failed: not a user error
        raise fail(COMMAND, f"an engine failed: {type(exc).__name__}: {exc}", code=1) from None
    total = time.perf_counter() - t0
    out.print(compare_table(runs))
    out.print(f"{len(runs)} runs in {total:.1f} s")
    for v in _violations(runs):
        out.print(f"note: {v['trace']} {v['engine']}: token hit rate drops from {v['from_rate']:.4f} at "
                  f"{v['from_blocks']} blocks to {v['to_rate']:.4f} at {v['to_blocks']} blocks",
                  markup=False, highlight=False)
    settings = {
        "traces": names, "capacities": ["unbounded" if c is None else c for c in capacities],
        "block_size": block_size, "limit": limit or None, "max_running": max_running,
        "decode_chunk": decode_chunk, "max_output": max_output, "hash_algo": hash_algo,
        "engines": [e.label for e in chosen], "memory": memory, "total_s": total,
    }
    _write_outputs(runs, settings, csv_path, json_path, plot)


COMMAND = "compare-engines"


def _check_options(
    num_blocks: str, engines: str, trace: str, memory: str, block_size: int, max_running: int,
    decode_chunk: int, max_output: int | None, hash_algo: str, extra: Sequence[str] = (),
) -> tuple[list[int | None], tuple[EngineSpec, ...], list[str]]:
    """The capacities, engines and trace names of the command line, every option checked (one
    plain error line and exit 2 otherwise), before anything is loaded."""
    capacities = parse_capacities(num_blocks)
    if memory not in MEMORY_METHODS:
        raise fail(COMMAND, f"--memory must be one of {', '.join(MEMORY_METHODS)}")
    try:
        given = tuple(EngineSpec(name, name, None, measure_memory=False) for name in extra)
        chosen = parse_engines(engines) + given
        for cap in capacities:
            ReplayConfig(block_size=block_size, num_blocks=cap, max_running=max_running,
                         decode_chunk=decode_chunk, max_output=max_output, hash_algo=hash_algo).validate()
    except ValueError as exc:  # InvalidConfig is a ValueError
        raise fail(COMMAND, exc) from None
    for spec in dict.fromkeys(e.engine for e in chosen):
        try:
            load_factory(spec)
        except EngineUnavailable as exc:
            raise fail(COMMAND, exc) from None
    names = [t.strip() for t in trace.split(",") if t.strip()]
    if not names:
        raise fail(COMMAND, "give at least one trace")
    return capacities, chosen, names


def _load_traces(names: list[str], limit: int) -> dict[str, Sequence[TraceRequest]]:
    loaded: dict[str, Sequence[TraceRequest]] = {}
    for name in names:
        try:
            requests = load_trace(name, limit=limit or None).requests
        except TraceError as exc:
            raise fail(COMMAND, exc) from None
        if not requests:
            raise fail(COMMAND, f"trace {name} has no valid requests")
        loaded[name] = requests
    return loaded


def _check_memory(loaded: dict[str, Sequence[TraceRequest]], capacities: list[int | None],
                  chosen: Sequence[EngineSpec], block_size: int, max_output: int | None) -> None:
    """Every pool of the sweep (an unbounded one sized for its trace) fits for every engine."""
    config = ReplayConfig(block_size=block_size, max_output=max_output)
    sizes = sorted({unbounded_blocks(reqs, config) if cap is None else cap
                    for reqs in loaded.values() for cap in capacities})
    for engine in dict.fromkeys(e.engine for e in chosen):
        problem = memory_problem(engine, sizes, "a pool")
        if problem is not None:
            raise fail(COMMAND, problem)


def _write_outputs(runs: list[EngineRun], settings: dict[str, Any], csv_path: Path | None,
                   json_path: Path | None, plot: Path | None) -> None:
    """Write the files asked for (their directories were checked before the work)."""
    write_outputs(COMMAND, [(csv_path, "--csv", lambda p: write_compare_csv(runs, p)),
                            (json_path, "--json", lambda p: write_compare_json(runs, p, settings)),
                            (plot, "--plot", lambda p: write_compare_plot(runs, p))])


def register(app: typer.Typer) -> None:
    """Add the ``compare-engines`` command to the project's typer app."""
    app.command("compare-engines", help=compare_engines_command.__doc__)(compare_engines_command)
