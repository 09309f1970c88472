"""Replay of real request traces (Mooncake FAST'25) through a prefix cache.

- :mod:`.trace`: load and validate traces (shipped: ``conversation``, ``synthetic``; or any JSONL(.gz)).
- :mod:`.synth`: deterministic token ids from ``hash_ids`` (prompt) and a reserved range (decode).
- :mod:`.bound`: the unbounded-capacity hit bound, computed from ``hash_ids`` alone.
- :mod:`.sim`: the replay model (admission, decode, preemption) and its measurements.
- :mod:`.lockstep`: ``--check-spec`` (the spec in lockstep) and :func:`check_trace_slice`.
- :mod:`.report`: CSV, JSON, plots; :mod:`.cli`: the ``pagedprefix replay`` command.
- :mod:`.compare`: ``pagedprefix compare-engines``, the hash engine against the radix engine.

Hit-rate definition (also in README.md): a request's hit is the ``num_computed_tokens`` of its first
admission; token hit rate = sum of hits / sum of ``input_length`` (rejected requests count as misses);
block hit rate = sum of ``hit // block_size`` / sum of ``ceil(input_length / block_size)``. With
capacity that never evicts, the token hit rate equals :func:`prefix_hit_bound`: each request hits the
longest run of leading full ``B``-token blocks whose prefix appeared in an earlier prompt, capped at
``(input_length - 1) // B`` blocks.
"""

from .bound import PrefixBound, prefix_hit_bound
from .compare import ENGINES, EngineRun, EngineSpec, compare_engines
from .divergence import Divergence
from .engines import DEFAULT_ENGINE, EngineFactory, EngineUnavailable, ReplayEngine, load_factory
from .lockstep import (
    SliceResult,
    check_trace_slice,
    load_repro,
    rerun_repro,
    run_ops,
)
from .report import monotonicity_violations, write_csv, write_json, write_plot
from .sim import ReplayConfig, ReplayResult, run_replay, unbounded_blocks
from .synth import DECODE_BASE, PROMPT_TOKEN_LIMIT, decode_tokens, prompt_token_array, prompt_tokens
from .trace import (
    BUILTIN_TRACES,
    MAX_LINE_BYTES,
    MAX_TRACE_BYTES,
    BadLine,
    Trace,
    TraceError,
    TraceLimitError,
    TraceRequest,
    load_trace,
    parse_lines,
)

__all__ = [
    "BUILTIN_TRACES",
    "DECODE_BASE",
    "DEFAULT_ENGINE",
    "ENGINES",
    "MAX_LINE_BYTES",
    "MAX_TRACE_BYTES",
    "PROMPT_TOKEN_LIMIT",
    "BadLine",
    "Divergence",
    "EngineFactory",
    "EngineRun",
    "EngineSpec",
    "EngineUnavailable",
    "PrefixBound",
    "ReplayConfig",
    "ReplayEngine",
    "ReplayResult",
    "SliceResult",
    "Trace",
    "TraceError",
    "TraceLimitError",
    "TraceRequest",
    "check_trace_slice",
    "compare_engines",
    "decode_tokens",
    "load_factory",
    "load_repro",
    "load_trace",
    "monotonicity_violations",
    "parse_lines",
    "prefix_hit_bound",
    "prompt_token_array",
    "prompt_tokens",
    "rerun_repro",
    "run_ops",
    "run_replay",
    "unbounded_blocks",
    "write_csv",
    "write_json",
    "write_plot",
]
