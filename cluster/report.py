"""Outputs of cluster replays and sweeps: a rich table, CSV, JSON, and a plot."""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

CLUSTER_FIELDS: tuple[str, ...] = (
    "trace", "engine", "replicas", "router", "lam", "indexer", "transport", "drop_events", "restarts",
    "heartbeat",
    "block_size", "num_blocks", "max_running", "step_ms", "requests", "admitted", "completed", "rejected",
    "aborted", "preemptions", "prompt_tokens", "hit_tokens", "prefill_tokens_saved", "token_hit_rate",
    "bound_token_hit_rate", "oracle_token_hit_rate", "hit_rate_lost", "load_imbalance",
    "requests_per_replica", "evictions", "peak_blocks_in_use", "batches_published", "batches_dropped",
    "resyncs", "stale_decisions", "misroutes", "steps", "wall_s",
)
"""One CSV column per field of :meth:`pagedprefix.cluster.replay.ClusterResult.row` (sweeps add
``free_order`` and ``cell``)."""


def _fmt(x: object, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def cluster_table(rows: Sequence[Mapping[str, Any]], title: str = "cluster replay") -> Table:
    """One line per run (``lost``: the oracle-routed twin's hit rate minus this one's, with faults)."""
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    columns = ("trace", "R", "router", "blocks\n/replica", "drop", "restarts", "token\nhit", "bound",
               "saved\nMtok", "imbal-\nance", "requests\nper replica", "batches\n(lost)", "re-\nsyncs",
               "stale", "mis-\nroutes", "hit\nlost", "wall\ns")
    for name in columns:
        table.add_column(name, justify="left" if name in ("trace", "router") else "right", no_wrap=True)
    for r in rows:
        table.add_row(
            str(r["trace"]), str(r["replicas"]), str(r["router"]), str(r["num_blocks"]),
            _fmt(r["drop_events"], 2), r["restarts"] or "-", _fmt(r["token_hit_rate"]),
            _fmt(r["bound_token_hit_rate"]), f"{r['prefill_tokens_saved'] / 1e6:.2f}",
            _fmt(r["load_imbalance"], 3), str(r["requests_per_replica"]),
            f"{r['batches_published']} ({r['batches_dropped']})", str(r["resyncs"]),
            _fmt(r["stale_decisions"]), _fmt(r["misroutes"]), _fmt(r["hit_rate_lost"]), _fmt(r["wall_s"], 1),
        )
    return table


def write_rows_csv(rows: Sequence[Mapping[str, Any]], path: str | Path,
                   fields: Sequence[str] = CLUSTER_FIELDS) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow(row)


def write_rows_json(rows: Sequence[Mapping[str, Any]], path: str | Path, kind: str = "cluster",
                    extra: Mapping[str, Any] | None = None) -> None:
    doc = {"format": f"pagedprefix.{kind}.results", "version": 1, **(extra or {}), "runs": list(rows)}
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


def write_rows_plot(rows: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    """Token hit rate against replicas, one line per (router, drop, capacity, trace); the unbounded
    single-cache bound dotted. Needs matplotlib (the ``plot`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[tuple[str, str, float, int], list[tuple[int, float]]] = {}
    for r in rows:
        key = (str(r["trace"]), str(r["router"]), float(r["drop_events"]), int(r["num_blocks"]))
        lines.setdefault(key, []).append((int(r["replicas"]), float(r["token_hit_rate"])))
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for (trace, router, drop, blocks), points in sorted(lines.items()):
        points.sort()
        label = router + (f", drop {drop:g}" if drop else "")
        if len({k[3] for k in lines}) > 1:
            label += f", {blocks} blocks"
        if len({k[0] for k in lines}) > 1:
            label += f", {trace}"
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o",
                linestyle="--" if drop else "-", label=label)
    bounds = {(str(r["trace"]), r["bound_token_hit_rate"]) for r in rows
              if r["bound_token_hit_rate"] is not None}
    for trace, bound in sorted(bounds):
        ax.axhline(bound, color="grey", linestyle=":", label=f"one unbounded cache ({trace}: {bound:.3f})")
    ax.set_xscale("log", base=2)
    ticks = sorted({int(r["replicas"]) for r in rows})
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.set_xlabel("replicas")
    ax.set_ylabel("cluster token hit rate")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
