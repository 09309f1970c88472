"""Outputs of a replay or a capacity sweep: CSV, JSON, a hit-rate-vs-capacity plot, a rich table."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.table import Table

from .sim import ReplayResult

CSV_FIELDS: tuple[str, ...] = (
    "engine", "trace", "block_size", "num_blocks", "unbounded", "max_running", "decode_chunk", "samples",
    "requests", "admitted", "completed", "rejected", "aborted", "delayed", "preemptions",
    "prompt_tokens", "hit_tokens", "token_hit_rate", "prompt_blocks", "hit_blocks", "block_hit_rate",
    "bound_token_hit_rate", "bound_block_hit_rate", "decode_tokens", "evictions", "peak_blocks_in_use",
    "cow_copies", "operations", "steps", "mean_wait_ms", "wall_s", "diverged",
    "groups", "retention", "orphans", "orphans_peak",
)


def monotonicity_violations(results: Sequence[ReplayResult]) -> list[tuple[int, int, float, float]]:
    """Adjacent capacities (in increasing order) where the token hit rate drops:
    ``(smaller num_blocks, larger num_blocks, its rate, the larger's rate)``."""
    ordered = sorted(results, key=lambda r: r.num_blocks)
    out: list[tuple[int, int, float, float]] = []
    for a, b in zip(ordered, ordered[1:]):
        if b.token_hit_rate < a.token_hit_rate:
            out.append((a.num_blocks, b.num_blocks, a.token_hit_rate, b.token_hit_rate))
    return out


def sweep_json(results: Sequence[ReplayResult]) -> dict[str, Any]:
    """The JSON document of a run or a sweep: one row per capacity, and any monotonicity drops."""
    return {
        "format": "pagedprefix.replay.results",
        "version": 1,
        "runs": [r.row() for r in results],
        "monotonicity_violations": [
            {"from_blocks": a, "to_blocks": b, "from_rate": ra, "to_rate": rb}
            for a, b, ra, rb in monotonicity_violations(results)
        ],
        "divergences": [str(r.divergence) for r in results if r.divergence is not None],
    }


def write_json(results: Sequence[ReplayResult], path: str | Path) -> None:
    Path(path).write_text(json.dumps(sweep_json(results), indent=2) + "\n")


def write_csv(results: Sequence[ReplayResult], path: str | Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(CSV_FIELDS), extrasaction="ignore")
        writer.writeheader()
        for r in results:
            writer.writerow(r.row())


def write_plot(results: Sequence[ReplayResult], path: str | Path, *, title: str | None = None) -> None:
    """Token and block hit rate against capacity (log x), with the unbounded bound as a line.

    Needs matplotlib (the ``plot`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(results, key=lambda r: r.num_blocks)
    xs = [r.num_blocks for r in ordered]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    retentions = sorted({r.retention for r in ordered if r.groups})
    if retentions:  # hybrid groups: one token-hit curve per retention, the orphans on a second axis
        orphans_ax = ax.twinx()
        for ret, marker in zip(retentions, "os^"):
            runs = [r for r in ordered if r.retention == ret]
            rx = [r.num_blocks for r in runs]
            ax.plot(rx, [r.token_hit_rate for r in runs], marker=marker, label=f"token hit rate ({ret})")
            orphans_ax.plot(rx, [r.orphans or 0 for r in runs], marker=marker, linestyle=":", alpha=0.6,
                            color="tab:red", label=f"orphans at the end ({ret})")
        orphans_ax.set_ylabel("orphaned keyed blocks")
        orphans_ax.set_ylim(bottom=0)
        orphans_ax.legend(loc="lower right", fontsize=8)
    else:
        ax.plot(xs, [r.token_hit_rate for r in ordered], marker="o", label="token hit rate")
        ax.plot(xs, [r.block_hit_rate for r in ordered], marker="s", linestyle="--", label="block hit rate")
    bound = next((r.bound_token_hit_rate for r in ordered if r.bound_token_hit_rate is not None), None)
    if bound is not None:
        ax.axhline(bound, color="grey", linestyle=":", label=f"unbounded bound ({bound:.3f})")
    if len(xs) > 1 and xs[0] > 0 and xs[-1] / xs[0] >= 10:
        ax.set_xscale("log")
    first = ordered[0] if ordered else None
    ax.set_xlabel(f"capacity (blocks of {first.block_size} tokens)" if first else "capacity (blocks)")
    ax.set_ylabel("hit rate")
    ax.set_ylim(bottom=0)
    if title is None and first is not None:
        title = (f"{first.trace or 'trace'}: {first.requests} requests, engine {first.engine}, "
                 f"max_running {first.max_running}" + (f", {first.groups}" if first.groups else ""))
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def results_table(results: Sequence[ReplayResult]) -> Table:
    """A compact rich table, one row per run (``*``: an unbounded pool). With hybrid groups it
    has a retention column and the orphan counts (at the end, and the most seen at once)."""
    hybrid = any(r.groups for r in results)
    title = "replay" + (f" ({results[0].groups})" if hybrid else "")
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    names = ["blocks", "token\nhit", "block\nhit", "bound", "evicted", "peak\nused", "CoW",
             "de-\nlayed", "pre-\nempted", "re-\njected", "ab-\norted", "wall\ns"]
    if hybrid:
        names[1:1] = ["reten-\ntion"]
        names[-1:-1] = ["orphans\nend", "orphans\npeak"]
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    for r in sorted(results, key=lambda r: (r.num_blocks, r.retention)):
        cells = [
            f"{r.num_blocks}{'*' if r.unbounded else ''}",
            _fmt(r.token_hit_rate), _fmt(r.block_hit_rate), _fmt(r.bound_token_hit_rate),
            "-" if r.evictions is None else str(r.evictions), str(r.peak_blocks_in_use), str(r.cow_copies),
            str(r.delayed), str(r.preemptions), str(r.rejected), str(r.aborted), f"{r.wall_s:.1f}",
        ]
        if hybrid:
            cells[1:1] = [r.retention]
            cells[-1:-1] = ["-" if r.orphans is None else str(r.orphans),
                            "-" if r.orphans_peak is None else str(r.orphans_peak)]
        table.add_row(*cells)
    if any(r.unbounded for r in results):
        table.caption = "* unbounded: a pool that never evicts"
    return table
