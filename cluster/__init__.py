"""Beyond one engine: a KV indexer fed by many replicas' events, its conformance mode, a
multi-replica replay with routers, and sweeps.

- :mod:`.prefix`: the longest cached prefix of a request given what a replica holds (SEMANTICS.md
  sections 4 and 8, hybrid groups included).
- :mod:`.indexer`: the reference KV indexer (sequence gaps, restarts, resync, copies counted).
- :mod:`.streams`, :mod:`.scenarios`: adversarial event streams (loss, duplication, reordering
  across replicas, restarts, hybrid groups); :mod:`.conform`: judging an indexer against the
  reference; :mod:`.jsonl`, :mod:`.jsonl_server`: the JSON-lines protocol for indexers in any
  language.
- :mod:`.dynamo`: NVIDIA Dynamo's KV-router radix tree as an indexer (``--indexer dynamo``);
  :mod:`.indexer_matrix`: the indexers' section of docs/MATRIX.md; :mod:`.bench_indexer`:
  events/s and queries/s of an indexer beside the reference.
"""

from .conform import Finding, IndexerFactory, Verdict, all_passed, judge, judge_scenario
from .indexer import Answers, IndexerConfig, KVIndexer, ReferenceIndexer, reference_indexer
from .prefix import GROUP_KINDS, GroupSpec, alignment, full_groups, longest_prefix
from .scenarios import builtin_scenarios
from .streams import Faults, Scenario, ScenarioBuilder, random_scenario

__all__ = [
    "GROUP_KINDS",
    "Answers",
    "Faults",
    "Finding",
    "GroupSpec",
    "IndexerConfig",
    "IndexerFactory",
    "KVIndexer",
    "ReferenceIndexer",
    "Scenario",
    "ScenarioBuilder",
    "Verdict",
    "alignment",
    "all_passed",
    "builtin_scenarios",
    "full_groups",
    "judge",
    "judge_scenario",
    "longest_prefix",
    "random_scenario",
    "reference_indexer",
]
