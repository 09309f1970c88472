"""Throughput of an indexer beside the reference, on one event stream, in one run:
``python -m pagedprefix.cluster.bench_indexer --indexer dynamo``.

The stream: ``--replicas`` toy replicas (:class:`~pagedprefix.cluster.streams.ToyReplica`: stores
with hits and duplicate copies, evictions, rare clears) over ``--paths`` requests of up to 16
blocks of 16 tokens sharing prefixes, ``--batches`` batches in all, no faults; then ``--queries``
queries of those requests. Each indexer, built fresh, takes every batch (timed: events/s, an event
being one ``BlockStored``/``BlockRemoved``/``AllBlocksCleared``, and blocks/s), then answers every
query (timed: queries/s). For ``dynamo`` a third row times the tree's own calls only
(``RadixTree.apply_event`` on JSON encoded beforehand, ``find_matches`` on local hashes computed
beforehand), so the adapter's share (JSON, Dynamo's content hash called from Python) shows. The
output is a Markdown table with the ratios to the reference, and how often the answers agree (a
fault-free stream: they differ where duplicate copies make a set and a count disagree, and after:
Dynamo's tree then refuses the removal of the other copy and the stores under the lost block).
Timings are wall clock (``time.perf_counter``), best of ``--repeat`` runs, in this process.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from pagedprefix.conformance.protocol.watchdog import EngineHung, call_limit
from pagedprefix.spec.events import BlockRemoved, BlockStored, EventBatch

from .indexer import IndexerConfig, KVIndexer, ReferenceIndexer
from .load import load_indexer
from .prefix import full_groups
from .streams import Query, ToyReplica, _random_paths, toy_keys


@dataclass(frozen=True)
class Stream:
    """Batches per source, in delivery order, and the queries after them."""

    config: IndexerConfig
    batches: tuple[tuple[str, EventBatch], ...]
    queries: tuple[Query, ...]

    @property
    def events(self) -> int:
        return sum(len(b.events) for _, b in self.batches)

    @property
    def blocks(self) -> int:
        return sum(len(e.block_hashes) for _, b in self.batches for e in b.events
                   if isinstance(e, (BlockStored, BlockRemoved)))


def make_stream(seed: int = 0, replicas: int = 8, paths: int = 400, batches: int = 4000,
                queries: int = 2000) -> Stream:
    """The benchmark stream (module docstring); deterministic in its arguments."""
    rng = random.Random(f"bench-indexer/{seed}")
    reqs = _random_paths(rng, paths, 16)
    names = [f"r{i}" for i in range(replicas)]
    toys = {s: ToyReplica(random.Random(f"{seed}/{s}"), reqs) for s in names}
    seqs = dict.fromkeys(names, 0)
    out: list[tuple[str, EventBatch]] = []
    for _ in range(batches):
        s = rng.choice(names)
        out.append((s, EventBatch(seqs[s], toys[s].batch_events())))
        seqs[s] += 1
    qs = []
    for _ in range(queries):
        path = rng.choice(reqs)
        qs.append(Query((toy_keys(path, 0),), 16 * len(path) + 1))
    return Stream(IndexerConfig(groups=full_groups(16), sources=tuple(names)), tuple(out), tuple(qs))


@dataclass
class Row:
    name: str
    events_s: float
    blocks_s: float
    queries_s: float
    agree: float | None  # fraction of per-source answers equal to the reference's


def _best(repeat: int, run: Callable[[], tuple[float, float, list[Any]]]) -> tuple[float, float, list[Any]]:
    results = [run() for _ in range(repeat)]
    return min(r[0] for r in results), min(r[1] for r in results), results[0][2]


def time_indexer(factory: Callable[[IndexerConfig], KVIndexer],
                 stream: Stream) -> tuple[float, float, list[Any]]:
    """Seconds to take every batch, seconds to answer every query, and the answers."""
    ix = factory(stream.config)
    t0 = time.perf_counter()
    for source, batch in stream.batches:
        ix.events(source, batch)
    t1 = time.perf_counter()
    answers = [dict(ix.query(q.keys, q.num_tokens)) for q in stream.queries]
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, answers


def time_dynamo_tree(stream: Stream) -> tuple[float, float, list[Any]]:
    """The tree's own calls only (module docstring): everything the adapter computes is prepared
    first by a :class:`~pagedprefix.cluster.dynamo.DynamoIndexer` that replays the same stream."""
    from .dynamo import DynamoIndexer, load_dynamo

    prep = DynamoIndexer(stream.config)
    for source, batch in stream.batches:  # learns every key's local hash, as the adapter run does
        prep.events(source, batch)
    encoded: list[tuple[int, bytes]] = []
    for source, batch in stream.batches:
        worker = prep._worker(source)
        for e in batch.events:
            event = {"event_id": batch.seq, "data": prep._event_json(e)[0]}
            encoded.append((worker, json.dumps(event).encode()))
    sequences = []
    for q in stream.queries:
        local = []
        for key in q.keys[0]:
            if key not in prep.local:
                break
            local.append(prep.local[key])
        sequences.append(local[: (q.num_tokens - 1) // prep.block_size])
    tree = load_dynamo().RadixTree()
    t0 = time.perf_counter()
    for worker, body in encoded:
        with contextlib.suppress(RuntimeError):  # refused, as the adapter counts it
            tree.apply_event(worker, body)
    t1 = time.perf_counter()
    for seq in sequences:
        tree.find_matches(seq)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, []


def _agreement(answers: Sequence[dict[str, int | None]], ref: Sequence[dict[str, int | None]]) -> float:
    pairs = [(a.get(s), r[s]) for a, r in zip(answers, ref, strict=True) for s in r]
    return sum(x == y for x, y in pairs) / len(pairs) if pairs else 1.0


def bench(indexer: str, stream: Stream, repeat: int = 3, timeout: float = 600.0) -> list[Row]:
    """The rows: the reference, ``indexer``, and for ``dynamo`` the tree's calls alone. Each
    indexer's runs together must end within ``timeout`` seconds (one ``SIGALRM`` limit around them,
    on the main thread: :class:`~pagedprefix.conformance.protocol.watchdog.EngineHung` otherwise), so a hung
    indexer ends the bench instead of hanging it."""
    ev, bl = stream.events, stream.blocks
    with call_limit("the reference's runs", timeout):
        ref_e, ref_q, ref_answers = _best(repeat, lambda: time_indexer(ReferenceIndexer, stream))
    rows = [Row("reference", ev / ref_e, bl / ref_e, len(stream.queries) / ref_q, 1.0)]
    factory = load_indexer(indexer)
    with call_limit(f"{indexer}'s runs", timeout):
        e, q, answers = _best(repeat, lambda: time_indexer(factory, stream))
    rows.append(Row(indexer, ev / e, bl / e, len(stream.queries) / q, _agreement(answers, ref_answers)))
    if indexer == "dynamo":
        with call_limit("the tree's runs", timeout):
            e, q, _ = _best(repeat, lambda: time_dynamo_tree(stream))
        rows.append(Row("dynamo (tree calls only)", ev / e, bl / e, len(stream.queries) / q, None))
    return rows


def markdown(rows: Sequence[Row], stream: Stream) -> str:
    """The table (ratios to the first row, the reference)."""
    ref = rows[0]
    lines = [
        f"stream: {len(stream.config.sources)} replicas, {len(stream.batches)} batches, "
        f"{stream.events} events ({stream.blocks} blocks), {len(stream.queries)} queries",
        "",
        "| indexer | events/s | blocks/s | queries/s | events/s vs reference | queries/s vs reference "
        "| answers equal to the reference's |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        agree = "-" if r.agree is None else f"{100 * r.agree:.1f}%"
        lines.append(f"| {r.name} | {r.events_s:,.0f} | {r.blocks_s:,.0f} | {r.queries_s:,.0f} | "
                     f"{r.events_s / ref.events_s:.2f}x | {r.queries_s / ref.queries_s:.2f}x | {agree} |")
    return "\n".join(lines)


def main(
    indexer: Annotated[str, typer.Option(help="the indexer beside the reference (dynamo, module:factory)")]
    = "dynamo",
    seed: Annotated[int, typer.Option(help="the stream's seed")] = 0,
    replicas: Annotated[int, typer.Option(min=1, help="toy replicas")] = 8,
    paths: Annotated[int, typer.Option(min=1, help="distinct requests")] = 400,
    batches: Annotated[int, typer.Option(min=1, help="batches in all")] = 4000,
    queries: Annotated[int, typer.Option(min=1, help="queries after the batches")] = 2000,
    repeat: Annotated[int, typer.Option(min=1, help="runs per indexer (the best is kept)")] = 3,
    timeout: Annotated[float, typer.Option(min=1, help="seconds all runs of one indexer may take")] = 600.0,
) -> None:
    """Events/s and queries/s of an indexer beside the reference on one stream (module docstring)."""
    from pagedprefix.conformance.protocol import EngineUnavailable

    stream = make_stream(seed, replicas, paths, batches, queries)
    try:
        rows = bench(indexer, stream, repeat, timeout)
    except EngineUnavailable as exc:
        typer.echo(f"bench_indexer: {exc}", err=True)
        raise typer.Exit(2) from None
    except EngineHung as exc:
        typer.echo(f"bench_indexer: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(markdown(rows, stream))


if __name__ == "__main__":
    typer.run(main)
