"""``pagedprefix replay``: drive a request trace through an engine and report hit rates.

Examples::

    pagedprefix replay --trace conversation                       # impl, 16-token blocks, 16000 blocks
    pagedprefix replay --trace synthetic --num-blocks 1000,4000,16000,64000,unbounded \\
        --max-running 1 --plot curve.png --csv curve.csv --json curve.json
    pagedprefix replay --trace my_trace.jsonl.gz --strict --limit 500 --engine spec
    pagedprefix replay --limit 300 --num-blocks 4096 --max-output 128 --check-spec --repro div.json
    pagedprefix replay --engine pagedprefix.conformance.protocol.adapters:impl --check-spec --limit 300
    pagedprefix replay --limit 2000 --num-blocks unbounded --replicas 4 --router prefix_aware \\
        --drop-events 0.1 --restart-replica 1@1000 --transport zmq
    pagedprefix replay --groups 'full(16)+sliding(128,16)' --retention replay,dense \
        --num-blocks 40000,160000,unbounded --plot hybrid.png   # gpt-oss-like hybrid groups
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from pagedprefix.conformance.running.supervise import supervised_command
from pagedprefix.spec import InvalidConfig, PrefixCacheError, hash_granularity, parse_groups
from pagedprefix.spec.groups import check_groups
from rich.console import Console

from .cli_common import _progress, fail, memory_problem, outputs_problem, parse_capacities, write_outputs
from .compare import register as register_compare
from .divergence import Divergence
from .engines import DEFAULT_ENGINE, EngineFactory, EngineUnavailable, load_factory
from .lockstep import LockstepExecutor
from .report import monotonicity_violations, results_table, write_csv, write_json, write_plot
from .sim import Executor, ReplayConfig, ReplayResult, run_replay, unbounded_blocks
from .trace import BUILTIN_TRACES, BadLine, TraceError, TraceRequest, load_trace

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
_H_GROUPS = ("hybrid KV-cache groups over the one pool, e.g. 'full(16)+sliding(128,16)' (gpt-oss-like); "
             "also chunked(C,B), mamba(B); the block size is then their gcd")
_H_RETENTION = ("with --groups: replay (default), dense, or both as 'replay,dense' (which sliding-window "
                "tails and Mamba states are kept)")
RETENTION_CHOICES = ("replay", "dense")
_H_PLOT = "write the hit-rate-vs-capacity curve as PNG (needs matplotlib)"
_H_PROGRESS = "progress bar (default: on a terminal, for long runs)"


_H_FREE_ORDER = "cache policy: unhashed_to_head (vLLM today) or append_all (older vLLM v1)"
_H_REPLICAS = "replicas of --num-blocks each, routed by their KV-cache events (pagedprefix.cluster)"
_H_ROUTER = "round_robin (default with --replicas), least_loaded or prefix_aware"
_H_LAMBDA = "prefix_aware: score = cached prefix tokens - LAMBDA * blocks in use"
_H_DROP = "probability that a replica's event batch is lost on the way to the router"
_H_RESTART = "REPLICA@REQUEST: that replica restarts (empty cache) before that request arrives (repeatable)"
_H_TRANSPORT = ("how events reach the router: inprocess, zmq (real PUB/SUB over IPC sockets in a private "
                "directory) or zmq-tcp (loopback TCP with CURVE); zmq needs pyzmq")
_H_HEARTBEAT = "replicas publish an empty event batch every idle step (a lost batch is then always seen)"
_H_INDEXER = "the router's indexer: reference, module:factory or jsonl:COMMAND (pagedprefix indexer-conform)"


@dataclass
class ClusterArgs:
    """The cluster options of ``pagedprefix replay`` as given (their meaning and checks are the
    cluster replay's, :mod:`pagedprefix.cluster.replay`)."""

    replicas: int = 1
    router: str | None = None
    router_lambda: float | None = None
    drop_events: float = 0.0
    restart_replica: list[str] = field(default_factory=list)
    transport: str = "inprocess"
    fault_seed: int = 0
    indexer: str = "reference"
    event_heartbeat: bool = False

    def wanted(self) -> bool:
        """Whether any cluster option was given (otherwise the replay drives one engine)."""
        return self != ClusterArgs()


@dataclass
class ReplayJob:
    """A replay ready to run: every check that can be made before the work is made."""

    trace: str
    engine: str
    configs: list[ReplayConfig]
    requests: list[TraceRequest]
    factory: EngineFactory
    check_spec: bool
    repro: Path
    csv_path: Path | None
    json_path: Path | None
    plot: Path | None
    show_progress: bool
    cluster: ClusterArgs
    cluster_runner: ClusterRunner | None = None


ClusterRunner = Callable[[ReplayJob, Console, Console], None]
"""Runs a cluster replay job and reports it (``out`` for the table, ``console`` for progress)."""
ClusterHook = Callable[[ClusterArgs], ClusterRunner]
"""Checks the cluster options (a user error ends the command) and returns the runner."""

_cluster_hook: list[ClusterHook] = []


def set_cluster_hook(hook: ClusterHook) -> None:
    """Install the cluster replay (``pagedprefix.cluster`` does, when the CLI registers it)."""
    _cluster_hook[:] = [hook]


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
    free_order: Annotated[str, typer.Option(help=_H_FREE_ORDER)] = "unhashed_to_head",
    check_spec: Annotated[bool, typer.Option("--check-spec", help=_H_CHECK)] = False,
    repro: Annotated[Path, typer.Option(help=_H_REPRO)] = Path("replay-divergence.json"),
    replicas: Annotated[int, typer.Option(min=1, help=_H_REPLICAS)] = 1,
    router: Annotated[str | None, typer.Option(help=_H_ROUTER)] = None,
    router_lambda: Annotated[float | None, typer.Option(min=0.0, help=_H_LAMBDA)] = None,
    drop_events: Annotated[float, typer.Option(min=0.0, max=1.0, help=_H_DROP)] = 0.0,
    restart_replica: Annotated[list[str] | None, typer.Option(help=_H_RESTART)] = None,
    transport: Annotated[str, typer.Option(help=_H_TRANSPORT)] = "inprocess",
    fault_seed: Annotated[int, typer.Option(min=0, help="seed of the event losses")] = 0,
    indexer: Annotated[str, typer.Option(help=_H_INDEXER)] = "reference",
    event_heartbeat: Annotated[bool, typer.Option("--event-heartbeat", help=_H_HEARTBEAT)] = False,
    csv_path: Annotated[Path | None, typer.Option("--csv", help="write one CSV row per capacity")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the results as JSON")] = None,
    plot: Annotated[Path | None, typer.Option(help=_H_PLOT)] = None,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress", help=_H_PROGRESS)] = None,
    groups: Annotated[str | None, typer.Option("--groups", help=_H_GROUPS)] = None,
    retention: Annotated[str, typer.Option("--retention", help=_H_RETENTION)] = "replay",
) -> None:
    """Replay a request trace through a prefix cache and report hit rates, evictions and peak usage;
    with --replicas, through a cluster routed by the replicas' KV-cache events."""
    params = dict(locals())
    console = Console(stderr=True)
    out = Console()
    if not out.is_terminal:  # piped or captured: do not squeeze the table into 80 columns
        out = Console(width=160)
    job = prepare_job(params, console)
    runner = job.cluster_runner
    if runner is not None:
        supervised_command(lambda: runner(job, out, console), COMMAND)
    supervised_command(lambda: _run_single(job, out, console), COMMAND)


def prepare_job(params: Mapping[str, Any], console: Console | None = None,
                cluster_hook: ClusterHook | None = None) -> ReplayJob:
    """Check everything that can be checked before the work starts (options, outputs, optional
    dependencies, the engine, the cluster options), then load the trace. ``params`` maps the
    ``replay`` command's parameter names to values (what the command, or click parsing its command
    line, gives); ``cluster_hook`` replaces the installed one (:func:`set_cluster_hook`). A user
    error ends the command: ``typer.Exit`` after one line on stderr."""
    p = dict(params)
    capacities = parse_capacities(p["num_blocks"])
    try:
        hybrid = None if p.get("groups") is None else parse_groups(p["groups"])
        retentions = parse_retentions(p.get("retention", "replay"), hybrid is not None)
        block_size = p["block_size"]
        if hybrid is not None:
            block_size = hash_granularity(hybrid)
            check_groups(hybrid, block_size)
        configs = [ReplayConfig(block_size=block_size, num_blocks=cap, max_running=p["max_running"],
                                decode_chunk=p["decode_chunk"], max_output=p["max_output"],
                                samples=p["samples"], step_ms=p["step_ms"], hash_algo=p["hash_algo"],
                                free_order=p["free_order"], groups=hybrid, retention=ret)
                   for ret in retentions for cap in capacities]
        for config in configs:
            config.validate()
    except InvalidConfig as exc:
        raise fail(COMMAND, exc) from None
    cluster = ClusterArgs(p["replicas"], p["router"], p["router_lambda"], p["drop_events"],
                          list(p["restart_replica"] or []), p["transport"], p["fault_seed"], p["indexer"],
                          p["event_heartbeat"])
    runner = None
    if cluster.wanted():
        if p["check_spec"]:
            raise fail(COMMAND, "--check-spec runs one engine; it does not combine with the cluster options")
        if hybrid is not None:
            raise fail(COMMAND, "--groups runs one engine (hybrid caches publish no KV-cache events); "
                       "it does not combine with the cluster options")
        hook = cluster_hook or (_cluster_hook[0] if _cluster_hook else None)
        if hook is None:
            raise fail(COMMAND, "the cluster replay (pagedprefix.cluster) is not installed")
        runner = hook(cluster)
    outputs = {"--csv": p["csv_path"], "--json": p["json_path"], "--plot": p["plot"],
               "--repro": p["repro"] if p["check_spec"] else None}
    problem = outputs_problem(outputs)
    if problem is not None:
        raise fail(COMMAND, problem)
    engine = p["engine"]
    try:
        factory = load_factory(engine)
    except EngineUnavailable as exc:
        raise fail(COMMAND, exc) from None
    except Exception as exc:  # a module:factory whose import fails in any other way
        raise fail(COMMAND, f"engine {engine!r} cannot be loaded: {type(exc).__name__}: {exc}") from None
    trace = p["trace"]
    try:
        loaded = load_trace(trace, strict=p["strict"], limit=p["limit"])
    except TraceError as exc:
        raise fail(COMMAND, exc) from None
    if console is not None:
        _report_bad_lines(console, trace, loaded.bad_lines)
    if not loaded.requests:
        raise fail(COMMAND, "the trace has no valid requests")
    sizes = [unbounded_blocks(loaded.requests, c) if c.num_blocks is None else c.num_blocks
             for c in configs]
    problem = memory_problem(engine, [s * cluster.replicas for s in sizes], "a pool")
    if problem is not None:
        raise fail(COMMAND, problem)
    show = p["progress"]
    if show is None:
        show = console is not None and console.is_terminal and len(loaded) >= PROGRESS_MIN_REQUESTS
    return ReplayJob(trace, engine, configs, list(loaded.requests), factory, p["check_spec"], p["repro"],
                     p["csv_path"], p["json_path"], p["plot"], bool(show), cluster, runner)


def _run_single(job: ReplayJob, out: Console, console: Console) -> None:
    """One engine: a replay per capacity, the table, the files, and a divergence's reproduction."""
    results: list[ReplayResult] = []
    divergence: Divergence | None = None
    engine = job.engine
    for config in job.configs:
        cap = config.num_blocks
        label = f"{'unbounded' if cap is None else cap} blocks"
        if config.groups is not None:
            label += f", {config.retention}"
        try:
            with _progress(job.show_progress, console, label, len(job.requests)) as update:
                result = run_replay(job.requests, config, job.factory, engine_name=engine,
                                    trace_name=job.trace, progress=update,
                                    executor=LockstepExecutor if job.check_spec else Executor)
        except PrefixCacheError as exc:  # e.g. a pool the engine refuses (InvalidConfig)
            raise fail(COMMAND, exc) from None
        except Exception as exc:  # the engine itself failed: not a user error
            raise fail(COMMAND, f"engine {engine!r} failed: {type(exc).__name__}: {exc}", code=1) from None
        results.append(result)
        if result.divergence is not None:
            divergence = result.divergence
            break
    out.print(results_table(results))
    if job.check_spec and divergence is None:
        ops = sum(r.operations for r in results)
        out.print(f"check-spec: {ops} operations agree with the spec")
    drops = [d for ret in sorted({r.retention for r in results})
             for d in monotonicity_violations([r for r in results if r.retention == ret])]
    for a, b, ra, rb in drops:
        out.print(f"note: token hit rate drops from {ra:.4f} at {a} blocks to {rb:.4f} at {b} blocks")
    _write_outputs(results, job.csv_path, job.json_path, job.plot)
    if divergence is not None:
        try:
            path = divergence.save(job.repro)
        except OSError as exc:
            raise fail(COMMAND, f"--repro {job.repro}: cannot write: {exc}") from None
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
    write_outputs(COMMAND, [(csv_path, "--csv", lambda p: write_csv(results, p)),
                            (json_path, "--json", lambda p: write_json(results, p)),
                            (plot, "--plot", lambda p: write_plot(results, p))])


def register(app: typer.Typer) -> None:
    """Add the ``replay`` and ``compare-engines`` commands to the project's typer app."""
    app.command("replay", help=replay_command.__doc__)(replay_command)
    register_compare(app)
