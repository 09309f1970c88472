"""The indexer section of ``docs/MATRIX.md``: third-party KV indexers judged by ``indexer-conform``.

``pagedprefix matrix`` writes the engines' matrix (:mod:`pagedprefix.conformance.reporting.matrix`) and then
this section, handed in by the app that composes both (``pagedprefix.cli``; conformance does not
import cluster). For each indexer of :data:`MATRIX_INDEXERS` it runs the built-in scenarios
(:func:`~pagedprefix.cluster.scenarios.builtin_scenarios`) in process, against the reference, and
writes one table row (indexer, version, verdict, failing scenarios), then every scenario's verdict
with its first finding and the plain-words explanation of :data:`NOTES` (``*unexplained*`` when a
failure has none: a changed verdict shows). Deterministic (no timings), so ``matrix --check``
compares it byte for byte. An indexer whose distribution is missing gets ``not installed``.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pagedprefix.conformance.protocol import EngineUnavailable

from .conform import Verdict, all_passed, judge
from .load import open_indexer
from .scenarios import builtin_scenarios


@dataclass(frozen=True)
class MatrixIndexer:
    """A row of the indexer table: the ``--indexer`` name and the distribution it comes from."""

    name: str
    distribution: str


MATRIX_INDEXERS: tuple[MatrixIndexer, ...] = (MatrixIndexer("dynamo", "ai-dynamo-runtime"),)

ABOUT: dict[str, str] = {
    "dynamo": (
        "NVIDIA Dynamo's KV-router index, `dynamo.llm.RadixTree` (Rust), driven in process by "
        "`pagedprefix.cluster.dynamo` (`--indexer dynamo`; `pip install --no-deps ai-dynamo-runtime==1.6.1 "
        "'pydantic<=2.13.5' uvloop`). The adapter maps each `BlockStored` to Dynamo's `stored` event "
        "(`block_hash`: a 64-bit digest of our key; `tokens_hash`: Dynamo's own "
        "`compute_block_hash_for_seq` of the block's tokens, extras not passed), `BlockRemoved` to "
        "`removed`, `AllBlocksCleared` to `cleared`, and answers `find_matches` over the local hashes "
        "learned for the query's keys. It adds no rule: the tree never asks for a resync and never "
        "answers None, and what it refuses (a store whose parent the worker does not hold, a "
        "removal of a block it does not hold: `RuntimeError`) is skipped, as the tree's own log says "
        "(\"skipping store operation\")."
    ),
}

PAIR_NOTES: dict[tuple[str, str], str] = {
    ("per_copy", "last_copy"): (
        "The engine removes each evicted copy of a key (a key computed twice is stored twice and "
        "removed twice); the indexer drops the replica from the key at the first removal, so a "
        "replica that still holds the other copy loses its credit and the router sends the prefix "
        "elsewhere. Dynamo puts its KV event consolidator between such engines and its router "
        "(ai-dynamo/dynamo#3725: one store per unique block, a removal only when no source holds "
        "it), which turns the stream into `last_copy`; without it, the pair disagrees."
    ),
    ("last_copy", "per_copy"): (
        "The engine removes a key once, with its last copy, but stores every copy; an indexer that "
        "counts copies never reaches zero and keeps crediting a key the replica no longer holds."
    ),
}
"""Why a pair of removal models that differ goes wrong, by (engine stream, indexer)."""

_NO_SEQUENCE = (
    "The tree carries `event_id` but never checks it (probe: a gap, a number going back and a "
    "re-delivered batch are all applied), so it has no notion of a source out of sync and answers "
    "from what reached it. Dynamo validates consecutive event ids and recovers (a replay from the "
    "worker's local indexer, or its full tree dump) in its router's recovery path, outside the tree "
    "(Dynamo docs, 'KV Event Replay: Dynamo vs vLLM'; dynamo-llm `kv_router/indexer/recovery`): that "
    "needs the runtime's transport and workers, and is not judged here."
)
_NO_GROUPS = (
    "Not expressible: Dynamo's event has no KV-cache group and the tree one block size; a hybrid model's "
    "sliding-window or Mamba group (sparse blocks whose parents are not stored) has no place in it. "
    "The adapter refuses the config when built (`NotImplementedError`) rather than answer from the full "
    "group alone (the `full_group_only` defect)."
)

NOTES: dict[str, dict[str, str]] = {
    "dynamo": {
        "restart": (
            f"{_NO_SEQUENCE} A restarted engine's batch 0 is applied on top of the old instance's "
            "blocks, which stay credited although the new engine's cache is empty."
        ),
        "restart-first-batch-lost": (
            f"{_NO_SEQUENCE} After the restart the old instance's blocks stay in the tree, so a block "
            "the new instance does not hold is credited."
        ),
        "lost-batch": (
            f"{_NO_SEQUENCE} A lost batch's removal never arrives, so the removed block stays credited "
            "where the reference holds the source out of sync until resynced."
        ),
        "late-join": (
            f"{_NO_SEQUENCE} Besides, a store whose parent the worker does not hold is refused "
            "(`RuntimeError: Failed to find parent block`, logged 'skipping store operation'): an "
            "indexer that joins late never places the blocks whose parents it missed, and answers 0 "
            "for a replica that holds them."
        ),
        "reordered-replicas": (
            f"{_NO_SEQUENCE} r1's first batch (ABC's first two blocks) is lost and its next one "
            "stores other blocks: the tree answers 0 for ABC where the reference holds r1 out of sync "
            "until resynced (the same first finding as `tests/broken_indexers.py:ignores_gaps`)."
        ),
        "duplicate-batch": (
            f"{_NO_SEQUENCE} The re-delivered batch re-stores a block the replica has since evicted, so "
            "the tree credits it (a set makes a duplicate store harmless only while the block is held)."
        ),
        "unknown-parent-mamba": _NO_GROUPS,
        "sliding-window-sparse": _NO_GROUPS,
        "spec-hybrid-stream": _NO_GROUPS,
        "random-sliding-1": _NO_GROUPS,
        "random-mamba-2": _NO_GROUPS,
        "random-sliding-4": _NO_GROUPS,
        "random-mamba-5": _NO_GROUPS,
        "random-full-0": (
            f"{_NO_SEQUENCE} r1's batch 2, with two removals, is lost; the reference sees the gap at "
            "batch 4 and is resynced, the tree keeps crediting a removed block (the same first finding "
            "as `tests/broken_indexers.py:ignores_gaps`)."
        ),
        "random-full-3": (
            f"{_NO_SEQUENCE} r0 restarts and its new batch 0 is lost; its batch 1 (the number went back) "
            "is applied on top of the old instance's blocks (the same first finding as "
            "`tests/broken_indexers.py:ignores_restarts`)."
        ),
    },
}


@dataclass
class IndexerRow:
    """One indexer's verdicts (``verdicts`` empty when it is not installed: ``error`` says why)."""

    name: str
    version: str
    verdicts: list[Verdict]
    error: str = ""

    @property
    def removal(self) -> str:
        """The removal model the indexer assumes (its scenarios were played in it)."""
        return self.verdicts[0].removal if self.verdicts else "-"

    @property
    def verdict(self) -> str:
        if not self.verdicts:
            return "not installed" if self.version == "-" else "FAIL"
        return "PASS" if all_passed(self.verdicts) else "FAIL"


def run_indexer(indexer: MatrixIndexer) -> IndexerRow:
    """Judge ``indexer`` on the built-in scenarios, in process (module docstring)."""
    try:
        version = importlib.metadata.version(indexer.distribution)
    except importlib.metadata.PackageNotFoundError:
        return IndexerRow(indexer.name, "-", [], f"pip install {indexer.distribution}")
    try:
        loaded = open_indexer(indexer.name, in_process=True)
    except EngineUnavailable as exc:
        return IndexerRow(indexer.name, version, [], str(exc))
    try:
        return IndexerRow(indexer.name, version, judge(loaded.factory, builtin_scenarios()))
    finally:
        loaded.close()


def explain(indexer: str, scenario: str) -> str:
    """The note for a failing ``scenario`` of ``indexer``, or ``*unexplained*``."""
    return NOTES.get(indexer, {}).get(scenario, "*unexplained*")


def _pairs(rows: Sequence[IndexerRow], streams: Mapping[str, str]) -> list[str]:
    """Each judged indexer against each engine stream of the matrix: the removal models agree, or
    the pair is a mismatch (SEMANTICS.md section 9: neither side's bug, the pair's)."""
    judged = [r for r in rows if r.verdicts]
    if not judged or not streams:
        return []
    lines = [
        "",
        "Removal models (SEMANTICS.md section 9): each indexer is judged on streams of the model it "
        "assumes (`assumes`); each engine's stream is judged against the model it declares "
        "(`Capabilities.event_removal`). A pair whose models differ is a mismatch of the pair:",
        "",
    ]
    for r in judged:
        for engine, model in sorted(streams.items()):
            if model == r.removal:
                lines.append(f"- `{engine}` (`{model}`) with `{r.name}` (`{r.removal}`): the models agree.")
            else:
                why = PAIR_NOTES.get((model, r.removal), "*unexplained*")
                lines.append(
                    f"- `{engine}` (`{model}`) with `{r.name}` (`{r.removal}`): **mismatch**. {why}"
                )
    return lines


def render_section(rows: Sequence[IndexerRow], streams: Mapping[str, str] | None = None) -> str:
    """The Markdown section (starts with a blank line; no timings); ``streams``: engine -> the
    removal model of its event stream, to pair with each indexer's."""
    streams = streams or {}
    lines = [
        "",
        "# Indexers",
        "",
        "Generated by the same `pagedprefix matrix` run: each indexer judged by `pagedprefix "
        "indexer-conform` (the built-in adversarial scenarios, in process) against the reference "
        "indexer. Explanations: `cluster/indexer_matrix.py`.",
        "",
        "| indexer | version | assumes | verdict | failing scenarios |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        failing = ", ".join(f"`{v.scenario.name}`" for v in r.verdicts if not v.passed) or "-"
        lines.append(f"| {r.name} | {r.version} | `{r.removal}` | {r.verdict} | {failing} |")
    lines += _pairs(rows, streams)
    for r in rows:
        lines += ["", f"## {r.name} (indexer)", "", ABOUT.get(r.name, "an indexer."), ""]
        if not r.verdicts:
            lines.append(f"Not judged here: {r.error}.")
        for v in r.verdicts:
            if v.passed:
                lines.append(f"- PASS `{v.scenario.name}` ({v.queries} queries)")
            elif v.finding is not None:
                lines.append(f"- FAIL `{v.scenario.name}`: {v.finding}. {explain(r.name, v.scenario.name)}")
            else:
                lines.append(f"- {v.status} `{v.scenario.name}`: {v.not_run}")
    return "\n".join(lines) + "\n"


def indexer_matrix_section(streams: Mapping[str, str] | None = None) -> str:
    """Judge every indexer of :data:`MATRIX_INDEXERS` and render the section, pairing each with the
    engine streams ``streams`` (engine -> removal model)."""
    return render_section([run_indexer(i) for i in MATRIX_INDEXERS], streams)
