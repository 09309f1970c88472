"""``pagedprefix replay``: drive a request trace through an engine and report hit rates.

Examples::

    pagedprefix replay --trace conversation                       # impl, 16-token blocks, 16000 blocks
    pagedprefix replay --trace synthetic --num-blocks 1000,4000,16000,64000,unbounded \\
        --max-running 1 --plot curve.png --csv curve.csv --json curve.json
    pagedprefix replay --trace my_trace.jsonl.gz --strict --limit 500 --engine spec
    pagedprefix replay --limit 300 --num-blocks 4096 --max-output 128 --check-spec --repro div.json
    pagedprefix replay --engine pagedprefix.conformance.adapters:impl --check-spec --limit 300
    pagedprefix replay --groups 'full(16)+sliding(128,16)' --retention replay,dense \
        --num-blocks 2000,8000,32000 --plot hybrid.png          # gpt-oss-like hybrid groups
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pagedprefix.spec import InvalidConfig, PrefixCacheError, hash_granularity, parse_groups
from pagedprefix.spec.groups import check_groups
from rich.console import Console

from .cli_common import (
    PLOT_HINT,
    _progress,
    fail,
    memory_problem,
    output_problem,
    parse_capacities,
    plot_problem,
)
from .compare import register as register_compare
from .divergence import Divergence
from .engines import DEFAULT_ENGINE, EngineUnavailable, load_factory
from .lockstep import LockstepExecutor
from .report import monotonicity_violations, results_table, write_csv, write_json, write_plot
from .sim import Executor, ReplayConfig, ReplayResult, run_replay, unbounded_blocks
from .trace import BUILTIN_TRACES, BadLine, TraceError, load_trace

COMMAND = "replay"
PROGRESS_MIN_REQUESTS = 500
MAX_BAD_LINES_SHOWN = 10


_H_TRACE = f"built-in trace ({', '.join(BUILTIN_TRACES)}) or a JSONL path (plain or .gz)"
_H_BLOCKS = "pool size in blocks; a comma list sweeps capacities; 'unbounded' never evicts"
_H_CHUNK = "decode tokens appended per sequence per step"
_H_SAMPLES = "sequences per request (fork + copy-on-write)"
_H_STEP = "simulated ms per scheduler step; requests then arrive at their timestamps"
_H_STRICT = "strict: the first bad line is an error; lenient: skip, count and report bad lines"
_H_ENGINE = "'impl' (default), 'spec' or module:factory, a Callable[[CacheConfig], engine]"
_H_CHECK = "run the spec in lockstep and stop at the first divergence"
_H_REPRO = "where --check-spec saves the reproduction of a divergence (JSON)"
_H_PLOT = "write the hit-rate-vs-capacity curve as PNG (needs matplotlib)"
_H_PROGRESS = "progress bar (default: on a terminal, for long runs)"
_H_GROUPS = ("hybrid KV-cache groups over the one pool, e.g. 'full(16)+sliding(128,16)' (gpt-oss-like); "
             "also chunked(C,B), mamba(B); the block size is then their gcd")
_H_RETENTION = ("with --groups: replay (default), dense, or both as 'replay,dense' (which sliding-window "
                "tails and Mamba states are kept)")
RETENTION_CHOICES = ("replay", "dense")


def replay_command(
    trace: Annotated[str, typer.Option(help=_H_TRACE)] = "conversation",
    num_blocks: Annotated[str, typer.Option(help=_H_BLOCKS)] = "16000",
    block_size: Annotated[int, typer.Option(min=1, help="tokens per block")] = 16,
    max_running: Annotated[int, typer.Option(min=1, help="most requests running at once")] = 16,
    decode_chunk: Annotated[int, typer.Option(min=1, help=_H_CHUNK)] = 16,
    max_output: Annotated[int | None, typer.Option(min=0, help="cap each request's output_length")] = None,
    samples: Annotated[int, typer.Option(min=1, help=_H_SAMPLES)] = 1,
    step_ms: Annotated[float | None, typer.Option(min=0.0, help=_H_STEP)] = None,
    limit: Annotated[int | None, typer.Option(min=0, help="take only the first N valid requests")] = None,
    strict: Annotated[bool, typer.Option("--strict/--lenient", help=_H_STRICT)] = False,
    engine: Annotated[str, typer.Option(help=_H_ENGINE)] = DEFAULT_ENGINE,
    hash_algo: Annotated[str, typer.Option(help="block key hash: sha256 or xxh3_128")] = "sha256",
    check_spec: Annotated[bool, typer.Option("--check-spec", help=_H_CHECK)] = False,
    repro: Annotated[Path, typer.Option(help=_H_REPRO)] = Path("replay-divergence.json"),
    csv_path: Annotated[Path | None, typer.Option("--csv", help="write one CSV row per capacity")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the results as JSON")] = None,
    plot: Annotated[Path | None, typer.Option(help=_H_PLOT)] = None,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress", help=_H_PROGRESS)] = None,
    groups: Annotated[str | None, typer.Option("--groups", help=_H_GROUPS)] = None,
    retention: Annotated[str, typer.Option("--retention", help=_H_RETENTION)] = "replay",
) -> None:
    """Replay a request trace through a prefix cache and report hit rates, evictions and peak usage."""
    console = Console(stderr=True)
    out = Console()
    if not out.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        out = Console(width=160)
    # Everything that can be checked before the work starts: options, outputs, dependencies.
    capacities = parse_capacities(num_blocks)
    try:
        hybrid = None if groups is None else parse_groups(groups)
        retentions = parse_retentions(retention, hybrid is not None)
        if hybrid is not None:
            check_groups(hybrid, hash_granularity(hybrid))
            block_size = hash_granularity(hybrid)
        configs = [ReplayConfig(block_size=block_size, num_blocks=cap, max_running=max_running,
                                decode_chunk=decode_chunk, max_output=max_output, samples=samples,
                                step_ms=step_ms, hash_algo=hash_algo, groups=hybrid, retention=ret)
                   for ret in retentions for cap in capacities]
        for config in configs:
            config.validate()
    except InvalidConfig as exc:
        raise fail(COMMAND, exc) from None
    outputs = {"--csv": csv_path, "--json": json_path, "--plot": plot,
               "--repro": repro if check_spec else None}
    problem = output_problem(outputs) or plot_problem(plot)
    if problem is not None:
        raise fail(COMMAND, problem)
    try:
        factory = load_factory(engine)
    except EngineUnavailable as exc:
        raise fail(COMMAND, exc) from None
    except Exception as exc:  # a module:factory whose import fails in any other way
        raise fail(COMMAND, f"engine {engine!r} cannot be loaded: {type(exc).__name__}: {exc}") from None
    try:
        loaded = load_trace(trace, strict=strict, limit=limit)
    except TraceError as exc:
        raise fail(COMMAND, exc) from None
    _report_bad_lines(console, trace, loaded.bad_lines)
    if not loaded.requests:
        raise fail(COMMAND, "the trace has no valid requests")
    sizes = [unbounded_blocks(loaded.requests, c) if c.num_blocks is None else c.num_blocks
             for c in configs]
    problem = memory_problem(engine, sizes, "a pool")
    if problem is not None:
        raise fail(COMMAND, problem)
    show = progress
    if show is None:
        show = console.is_terminal and len(loaded) >= PROGRESS_MIN_REQUESTS
    results: list[ReplayResult] = []
    divergence: Divergence | None = None
    for config in configs:
        cap = config.num_blocks
        label = f"{'unbounded' if cap is None else cap} blocks"
        if config.groups is not None:
            label += f", {config.retention}"
        try:
            with _progress(show, console, label, len(loaded)) as update:
                result = run_replay(loaded.requests, config, factory, engine_name=engine, trace_name=trace,
                                    executor=LockstepExecutor if check_spec else Executor,
                                    progress=update)
        except PrefixCacheError as exc:  # e.g. a pool the engine refuses (InvalidConfig)
            raise fail(COMMAND, exc) from None
        except Exception as exc:  # the engine itself failed: not a user error
            raise fail(COMMAND, f"engine {engine!r} failed: {type(exc).__name__}: {exc}", code=1) from None
        results.append(result)
        if result.divergence is not None:
            divergence = result.divergence
            break
    out.print(results_table(results))
    if check_spec and divergence is None:
        ops = sum(r.operations for r in results)
        out.print(f"check-spec: {ops} operations agree with the spec")
    drops = [d for ret in sorted({r.retention for r in results})
             for d in monotonicity_violations([r for r in results if r.retention == ret])]
    for a, b, ra, rb in drops:
        out.print(f"note: token hit rate drops from {ra:.4f} at {a} blocks to {rb:.4f} at {b} blocks")
    _write_outputs(results, csv_path, json_path, plot)
    if divergence is not None:
        try:
            path = divergence.save(repro)
        except OSError as exc:
            raise fail(COMMAND, f"--repro {repro}: cannot write: {exc}") from None
        console.print(str(divergence), style="red", markup=False, highlight=False)
        console.print(f"reproduction ({divergence.op_index + 1} operations) saved to {path}",
                      markup=False, highlight=False)
        raise typer.Exit(1)


def parse_retentions(text: str, hybrid: bool) -> list[str]:
    """``replay``, ``dense`` or ``replay,dense`` (a sweep of both); only with ``--groups``.
    Raises :class:`InvalidConfig`."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names or any(n not in RETENTION_CHOICES for n in names) or len(set(names)) != len(names):
        raise InvalidConfig(f"--retention: expected replay, dense or replay,dense, got {text!r}")
    if not hybrid and names != ["replay"]:
        raise InvalidConfig("--retention needs --groups (a single full-attention group keeps every block)")
    return names


def _report_bad_lines(console: Console, trace: str, bad_lines: list[BadLine]) -> None:
    """The lenient mode's summary of skipped lines (their text is shown as is, never as markup)."""
    if not bad_lines:
        return
    console.print(f"skipped {len(bad_lines)} bad line(s) in {trace}:", style="yellow", markup=False,
                  highlight=False)
    for bad in bad_lines[:MAX_BAD_LINES_SHOWN]:
        console.print(f"  {bad}", markup=False, highlight=False)
    if len(bad_lines) > MAX_BAD_LINES_SHOWN:
        console.print(f"  … and {len(bad_lines) - MAX_BAD_LINES_SHOWN} more", markup=False)


def _write_outputs(results: list[ReplayResult], csv_path: Path | None, json_path: Path | None,
                   plot: Path | None) -> None:
    """Write the files asked for (their directories were checked before the work)."""
    writers = ((csv_path, "--csv", write_csv), (json_path, "--json", write_json),
               (plot, "--plot", write_plot))
    for path, option, write in writers:
        if path is None:
            continue
        try:
            write(results, path)
        except OSError as exc:
            raise fail(COMMAND, f"{option} {path}: cannot write: {exc}") from None
        except ImportError:
            raise fail(COMMAND, PLOT_HINT) from None
        except ValueError as exc:  # e.g. a file type matplotlib cannot write
            raise fail(COMMAND, f"{option} {path}: {exc}") from None


def register(app: typer.Typer) -> None:
    """Add the ``replay`` and ``compare-engines`` commands to the project's typer app."""
    app.command("replay", help=replay_command.__doc__)(replay_command)
    register_compare(app)
