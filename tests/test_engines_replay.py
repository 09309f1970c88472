"""vLLM's own KV-cache manager as a replay engine: the same hit rates as ``impl`` (which is proven
equal to the spec) on a Mooncake slice, through the API and through ``pagedprefix replay``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_support import skip_unless_available
from pagedprefix.conformance.engines.vllm import unavailable_reason
from pagedprefix.replay.engines import load_factory
from pagedprefix.replay.sim import ReplayConfig, run_replay
from pagedprefix.replay.trace import load_trace

pytestmark = skip_unless_available(unavailable_reason())


@pytest.mark.parametrize("num_blocks", [600, 4000])
def test_vllm_replays_the_slice_with_impls_hits(num_blocks: int) -> None:
    requests = load_trace("conversation", limit=150).requests
    config = ReplayConfig(block_size=16, num_blocks=num_blocks)
    impl = run_replay(requests, config, load_factory("impl"), engine_name="impl")
    vllm = run_replay(requests, config, load_factory("vllm"), engine_name="vllm")
    assert vllm.hits == impl.hits and vllm.hit_tokens == impl.hit_tokens > 0
    assert (vllm.operations, vllm.peak_blocks_in_use) == (impl.operations, impl.peak_blocks_in_use)


def _pagedprefix_json(out: Path, *args: str) -> list[dict[str, Any]]:
    """The ``runs`` of ``python -m pagedprefix ARGS --no-progress --json OUT`` (which must succeed)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pagedprefix", *args, "--no-progress", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs: list[dict[str, Any]] = json.loads(out.read_text())["runs"]
    return runs


def test_replay_command_with_engine_vllm(tmp_path: Path) -> None:
    rates = {}
    for engine in ("impl", "vllm"):
        rows = _pagedprefix_json(
            tmp_path / f"{engine}.json", "replay", "--engine", engine, "--limit", "100",
            "--num-blocks", "1000,4000",
        )
        rates[engine] = [(r["num_blocks"], r["token_hit_rate"], r["hit_tokens"]) for r in rows]
    assert rates["vllm"] == rates["impl"] and all(r[2] > 0 for r in rates["impl"])


def test_compare_engines_with_engine_vllm(tmp_path: Path) -> None:
    runs = _pagedprefix_json(
        tmp_path / "compare.json", "compare-engines", "--trace", "conversation", "--limit", "100",
        "--num-blocks", "600,4000", "--engines", "hash/unhashed_to_head", "--engine", "vllm",
    )
    by = {(r["engine"], r["num_blocks"]): r for r in runs}
    for cap in (600, 4000):
        hashed, vllm = by[("hash/unhashed_to_head", cap)], by[("vllm", cap)]
        assert vllm["hit_tokens"] == hashed["hit_tokens"] > 0 and vllm["operations"] == hashed["operations"]
        assert vllm["ops_per_s"] > 0 and vllm["metadata_bytes"] is None
