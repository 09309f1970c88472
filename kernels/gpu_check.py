"""GPU check of the Triton kernels: correctness on CUDA, then decode bandwidth and prefix-sharing speed.

Usage (one NVIDIA GPU, a few minutes; never part of CI)::

    python -m pagedprefix.kernels.gpu_check --out DIR [--peak-gbps N] [--quick]

1. Correctness: ``write_kv``, ``copy_blocks`` and ``paged_attention`` (decode, prefill over a cached
   prefix, shared prefixes, GQA/MHA, block sizes 1/16/32, several head sizes and splits; sliding
   windows and chunked local attention with the block-table entries before each window released to
   ``NO_BLOCK``) in float16, bfloat16 and float32 on CUDA, against the torch reference on the same
   device and against dense causal (windowed) attention over each request's own K/V
   (``torch.testing.assert_close`` defaults).
2. Decode throughput for batch {16, 64, 256} x context {1k, 8k} (32 query heads, 8 KV heads, head_dim
   128, block_size 16, float16), timed with ``triton.testing.do_bench`` (CUDA events, L2 flushed before
   every run, median). Reported as effective HBM bandwidth = bytes / time, where

   - *unique bytes* count every distinct cache block read once, plus queries, outputs, block tables and
     sequence lengths (what must cross HBM at least once), and
   - *logical bytes* count every request's K/V separately (what a non-sharing reader would move).

   ``% of peak`` uses unique bytes and the device's peak from :data:`PEAK_HBM_GBPS`.
3. Prefix sharing: a batch of 64 requests that share an 8k-token prefix (each with 64 tokens of its
   own) against the same batch with private copies of the prefix.
4. Windowed decode (the sliding and chunked groups of hybrid models): batch 64 with a 128-token window
   (gpt-oss) and a 1024-token window (Gemma 3) at 8k context, and 8192-token chunks (Llama 4) at 32k,
   each with the entries outside the window released (``NO_BLOCK``), the same bandwidth figures
   (bytes counted over the window's tokens only) and the speedup over full decode of the same batch,
   timed in the same run.

Writes ``DIR/gpu_check.json`` and prints a table. Exits 1 if a correctness check fails, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import torch

from . import reference
from .workloads import PagedBatch, PagedLayout, build_paged_batch, first_keys, make_layout, release_before

# Peak HBM bandwidth in GB/s (1e9 bytes/s), from the vendors' data sheets, matched as a substring of
# torch.cuda.get_device_name(); the first match wins, so specific names come before general ones.
PEAK_HBM_GBPS: tuple[tuple[str, float], ...] = (
    ("GH200", 4000.0),  # Grace Hopper, 96 GB HBM3 (the 144 GB HBM3e part: 4900)
    ("H200", 4800.0),  # H200 SXM / NVL, 141 GB HBM3e
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),  # H100 SXM5 80 GB HBM3
    ("H800", 3350.0),
    ("H20", 4000.0),
    ("B200", 8000.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),  # 40 GB parts
    ("A800", 2039.0),
    ("L40S", 864.0),
    ("L40", 864.0),
    ("L4", 300.0),
    ("A10G", 600.0),
    ("A10", 600.0),
    ("RTX 4090", 1008.0),
    ("RTX 3090", 936.0),
    ("V100", 900.0),
)

NUM_Q_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
BLOCK_SIZE = 16
TARGET_FRACTION = 0.70  # decode at batch 64 x 8k should reach this fraction of peak


def peak_bandwidth_gbps(device_name: str) -> float | None:
    """Peak HBM bandwidth (GB/s) of a device, or ``None`` if it is not in :data:`PEAK_HBM_GBPS`."""
    for pattern, gbps in PEAK_HBM_GBPS:
        if pattern.lower() in device_name.lower():
            return gbps
    return None


# --------------------------------------------------------------------------------------------------
# Correctness
# --------------------------------------------------------------------------------------------------


@dataclass
class CheckResult:
    name: str
    ok: bool
    max_abs_diff: float = 0.0
    detail: str = ""


def _compare(name: str, got: torch.Tensor, want: torch.Tensor, exact: bool = False) -> CheckResult:
    diff = float((got.float() - want.float()).abs().max()) if got.numel() else 0.0
    try:
        if exact:
            assert torch.equal(got, want), "tensors differ"
        else:
            torch.testing.assert_close(got, want)
    except AssertionError as exc:
        return CheckResult(name, False, diff, str(exc).splitlines()[0])
    return CheckResult(name, True, diff)


class Window(TypedDict, total=False):
    """The window keyword of ``paged_attention``: ``{"sliding_window": W}``,
    ``{"attention_chunk_size": C}``, or ``{}`` for full attention."""

    sliding_window: int
    attention_chunk_size: int


def _dense(batch: PagedBatch, window: Window | None = None) -> torch.Tensor:
    parts = []
    start = 0
    for keys, values, q_len in zip(batch.keys, batch.values, batch.query_lens, strict=True):
        if q_len:
            q = batch.query[start : start + q_len]
            parts.append(reference.dense_causal_attention(q, keys, values, batch.scale, **(window or {})))
        start += q_len
    return torch.cat(parts)


@dataclass(frozen=True)
class AttentionCheck:
    name: str
    seq_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    share_groups: tuple[int | None, ...] | None = None
    shared_prefix_blocks: int = 0
    num_splits: int | None = None
    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    @property
    def window_kwargs(self) -> Window:
        window = Window()
        if self.sliding_window is not None:
            window["sliding_window"] = self.sliding_window
        if self.attention_chunk_size is not None:
            window["attention_chunk_size"] = self.attention_chunk_size
        return window


ATTENTION_CHECKS: tuple[AttentionCheck, ...] = (
    AttentionCheck(
        "decode, shared prefix", (1000, 1003, 1500, 77), (1, 1, 1, 1), 32, 8, 128, 16, (0, 0, 0, None), 40
    ),
    AttentionCheck("decode, 4 splits", (4096, 300, 2049), (1, 1, 1), 32, 8, 128, 16, num_splits=4),
    AttentionCheck("prefill over cached prefix", (700, 1200), (129, 300), 32, 8, 128, 16, (0, 0), 20),
    AttentionCheck("full prefill + decode mix", (333, 512, 90), (333, 1, 45), 16, 16, 64, 32),
    AttentionCheck("block_size 1, head_dim 80", (200, 150), (3, 150), 8, 2, 80, 1, (0, 0), 100, 2),
    AttentionCheck("GQA 8, head_dim 256", (600, 64), (1, 64), 16, 2, 256, 16),
    # Sliding-window and chunked groups of hybrid models; the entries before each window are released.
    AttentionCheck(
        "decode, sliding 128, shared prefix",
        (4096, 4100, 3000, 129),
        (1, 1, 1, 1),
        32,
        8,
        128,
        16,
        (0, 0, None, None),
        200,
        sliding_window=128,
    ),
    AttentionCheck(
        "decode, sliding 1024, 4 splits", (8192, 1500), (1, 1), 32, 8, 128, 16, num_splits=4,
        sliding_window=1024,
    ),
    AttentionCheck(
        "prefill over cached prefix, sliding 512", (2000, 700), (600, 700), 16, 4, 64, 16, (0, 0), 10,
        sliding_window=512,
    ),
    AttentionCheck(
        "decode + prefill, chunks of 1024", (5000, 2100, 1500), (1, 300, 1500), 32, 8, 128, 16,
        attention_chunk_size=1024,
    ),
    AttentionCheck(
        "block_size 1, sliding 7", (300, 90), (1, 90), 8, 2, 80, 1, num_splits=2,
        sliding_window=7,
    ),
)


def check_attention(
    case: AttentionCheck, dtype: torch.dtype, device: torch.device, ops: Any, seed: int
) -> list[CheckResult]:
    """One attention case through ``ops.paged_attention`` (``ops``: ``triton_kernels``, or any module
    with the same ``paged_attention``), against the reference on the same table and dense attention over
    each request's own K/V. A windowed case runs on the table with the entries before each window
    released to ``NO_BLOCK``."""
    tag = str(dtype).removeprefix("torch.")
    batch = build_paged_batch(
        case.seq_lens,
        case.query_lens,
        num_q_heads=case.num_q_heads,
        num_kv_heads=case.num_kv_heads,
        head_dim=case.head_dim,
        block_size=case.block_size,
        dtype=dtype,
        device=device,
        share_groups=case.share_groups,
        shared_prefix_blocks=case.shared_prefix_blocks,
        spare_blocks=3,
        extra_table_columns=2,
        seed=seed,
    )
    window = case.window_kwargs
    table = batch.released_table(**window) if window else batch.block_table
    args = (batch.query, batch.key_cache, batch.value_cache, table, batch.seq_lens, batch.query_start_loc)
    out = ops.paged_attention(*args, batch.scale, num_splits=case.num_splits, **window)
    want = reference.paged_attention(*args, batch.scale, **window)
    return [
        _compare(f"attention {case.name} [{tag}] vs reference", out, want),
        _compare(f"attention {case.name} [{tag}] vs dense", out, _dense(batch, window)),
    ]


def check_correctness(device: torch.device, triton_ops: Any) -> list[CheckResult]:
    """Every CUDA correctness check; ``triton_ops`` is ``pagedprefix.kernels.triton_kernels``."""
    results: list[CheckResult] = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        tag = str(dtype).removeprefix("torch.")
        for case in ATTENTION_CHECKS:
            results += check_attention(case, dtype, device, triton_ops, seed=len(results))
        results += _check_cache_ops(device, dtype, triton_ops, tag)
    return results


def _check_cache_ops(
    device: torch.device, dtype: torch.dtype, triton_ops: Any, tag: str
) -> list[CheckResult]:
    gen = torch.Generator(device=device).manual_seed(7)
    shape = (64, 16, 8, 128)
    caches = [torch.randn(shape, generator=gen, device=device).to(dtype) for _ in range(8)]
    key = torch.randn(100, 8, 128, generator=gen, device=device).to(dtype)
    value = torch.randn(100, 8, 128, generator=gen, device=device).to(dtype)
    slots = torch.randperm(64 * 16, generator=gen, device=device)[:100]
    slots[::7] = -1
    mine = [c.clone() for c in caches]
    theirs = [c.clone() for c in caches]
    triton_ops.write_kv(key, value, mine[0], mine[1], slots)
    reference.write_kv(key, value, theirs[0], theirs[1], slots)
    results = [_compare(f"write_kv [{tag}]", torch.stack(mine[:2]), torch.stack(theirs[:2]), exact=True)]
    pairs = torch.randperm(64, generator=gen, device=device)[:20].reshape(10, 2)
    triton_ops.copy_blocks(mine[:4], mine[4:], pairs)
    reference.copy_blocks(theirs[:4], theirs[4:], pairs)
    results.append(
        _compare(f"copy_blocks 4 layers [{tag}]", torch.stack(mine), torch.stack(theirs), exact=True)
    )
    return results


# --------------------------------------------------------------------------------------------------
# Bandwidth
# --------------------------------------------------------------------------------------------------


@dataclass
class DecodeRun:
    name: str
    batch: int
    context: int
    shared_prefix: int
    num_splits: int
    time_us: float
    unique_bytes: int
    logical_bytes: int
    unique_gbps: float
    logical_gbps: float
    pct_of_peak: float | None
    extra: dict[str, Any] = field(default_factory=dict)


DecodeInputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def decode_first_keys(seq_lens: Sequence[int], window: Window | None) -> list[int]:
    """The first key position each request's decode query (at ``seq_len - 1``) sees."""
    return first_keys([n - 1 for n in seq_lens], **(window or {}))


def _decode_inputs(
    layout: PagedLayout,
    seq_lens: Sequence[int],
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    window: Window | None = None,
) -> DecodeInputs:
    """query, key_cache, value_cache, block_table, seq_lens, query_start_loc of one decode step; with a
    window, the block table's entries before each window are released (``NO_BLOCK``)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (layout.num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    key_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    value_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    batch = len(seq_lens)
    query = torch.randn(batch, NUM_Q_HEADS, HEAD_DIM, generator=gen, device=device, dtype=dtype)
    block_table = layout.block_table_tensor(device=device)
    if window:
        block_table = release_before(block_table, decode_first_keys(seq_lens, window), BLOCK_SIZE)
    lens = torch.tensor(list(seq_lens), dtype=torch.int32, device=device)
    starts = torch.arange(batch + 1, dtype=torch.int32, device=device)
    return query, key_cache, value_cache, block_table, lens, starts


def _bytes(
    layout: PagedLayout, seq_lens: Sequence[int], elem: int, window: Window | None = None
) -> tuple[int, int]:
    """(unique, logical) bytes one decode step must read and write; with a window, only the keys and
    block-table entries inside it (what the kernel reads)."""
    token_bytes = NUM_KV_HEADS * HEAD_DIM * elem * 2  # K and V of one token
    batch = len(seq_lens)
    io = 2 * batch * NUM_Q_HEADS * HEAD_DIM * elem  # query in, output out
    firsts = decode_first_keys(seq_lens, window)
    entries = sum(len(row) - first // BLOCK_SIZE for row, first in zip(layout.tables, firsts, strict=True))
    index = 4 * entries + 4 * batch + 4 * (batch + 1)
    # Distinct (block, tokens read): a shared block counts once, with the most tokens any request reads.
    used: dict[int, int] = {}
    for row, seq_len, first in zip(layout.tables, seq_lens, firsts, strict=True):
        for i in range(first // BLOCK_SIZE, len(row)):
            tokens = min((i + 1) * BLOCK_SIZE, seq_len) - max(i * BLOCK_SIZE, first)
            used[row[i]] = max(used.get(row[i], 0), tokens)
    unique = sum(used.values()) * token_bytes + io + index
    logical = sum(n - first for n, first in zip(seq_lens, firsts, strict=True)) * token_bytes + io + index
    return unique, logical


def time_decode(
    name: str,
    layout: PagedLayout,
    seq_lens: Sequence[int],
    device: torch.device,
    triton_ops: Any,
    peak_gbps: float | None,
    shared_prefix: int = 0,
    window: Window | None = None,
) -> DecodeRun:
    import triton.testing

    dtype = torch.float16
    window = window or {}
    args = _decode_inputs(layout, seq_lens, device, dtype, seed=len(seq_lens), window=window)
    scale = HEAD_DIM**-0.5

    def step() -> torch.Tensor:
        out: torch.Tensor = triton_ops.paged_attention(
            *args, scale, max_query_len=1, check_values=False, **window
        )
        return out

    plan = triton_ops.attention_plan_for(args[0], args[1], args[3], 1, **window)
    ms = float(triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median"))
    unique, logical = _bytes(layout, seq_lens, torch.finfo(dtype).bits // 8, window)
    seconds = ms * 1e-3
    unique_gbps = unique / seconds / 1e9
    run = DecodeRun(
        name=name,
        batch=len(seq_lens),
        context=max(seq_lens),
        shared_prefix=shared_prefix,
        num_splits=plan.num_splits,
        time_us=ms * 1e3,
        unique_bytes=unique,
        logical_bytes=logical,
        unique_gbps=unique_gbps,
        logical_gbps=logical / seconds / 1e9,
        pct_of_peak=None if peak_gbps is None else 100.0 * unique_gbps / peak_gbps,
    )
    if window:
        run.extra["window"] = dict(window)
    return run


def decode_sweep(
    device: torch.device,
    triton_ops: Any,
    peak_gbps: float | None,
    batches: Sequence[int],
    contexts: Sequence[int],
) -> list[DecodeRun]:
    runs = []
    for context in contexts:
        for batch in batches:
            seq_lens = [context] * batch
            layout = make_layout(seq_lens, BLOCK_SIZE, generator=torch.Generator().manual_seed(batch))
            runs.append(
                time_decode(f"decode b{batch} ctx{context}", layout, seq_lens, device, triton_ops, peak_gbps)
            )
    return runs


def sharing_comparison(
    device: torch.device, triton_ops: Any, peak_gbps: float | None, batch: int, prefix: int, own: int
) -> list[DecodeRun]:
    """The same decode batch with one shared ``prefix``-token prefix, and with private prefixes."""
    seq_lens = [prefix + own] * batch
    prefix_blocks = prefix // BLOCK_SIZE
    shared = make_layout(
        seq_lens,
        BLOCK_SIZE,
        share_groups=[0] * batch,
        shared_prefix_blocks=prefix_blocks,
        generator=torch.Generator().manual_seed(1),
    )
    private = make_layout(seq_lens, BLOCK_SIZE, generator=torch.Generator().manual_seed(1))
    with_sharing = time_decode(
        f"shared {prefix} prefix b{batch}", shared, seq_lens, device, triton_ops, peak_gbps, prefix
    )
    without = time_decode(f"private prefixes b{batch}", private, seq_lens, device, triton_ops, peak_gbps)
    with_sharing.extra["speedup_vs_private"] = without.time_us / with_sharing.time_us
    return [with_sharing, without]


#: Windowed decode runs: (name, window, batch, context). gpt-oss slides 128 tokens, Gemma 3 1024, and
#: Llama 4's local layers use chunks of 8192.
WINDOWED_DECODE: tuple[tuple[str, Window, int, int], ...] = (
    ("sliding 128", {"sliding_window": 128}, 64, 8192),
    ("sliding 1024", {"sliding_window": 1024}, 64, 8192),
    ("chunked 8192", {"attention_chunk_size": 8192}, 64, 32768),
)


def windowed_decode(
    device: torch.device, triton_ops: Any, peak_gbps: float | None, quick: bool
) -> list[DecodeRun]:
    """Each :data:`WINDOWED_DECODE` run, then full decode of the same batch (same layout), so that the
    speedup of the window is a ratio of two timings of one run."""
    runs = []
    for name, window, batch, context in WINDOWED_DECODE[:1] if quick else WINDOWED_DECODE:
        seq_lens = [context] * batch
        layout = make_layout(seq_lens, BLOCK_SIZE, generator=torch.Generator().manual_seed(batch))
        label = f"b{batch} ctx{context}"
        windowed = time_decode(
            f"decode {name} {label}", layout, seq_lens, device, triton_ops, peak_gbps, window=window
        )
        full = time_decode(f"decode full {label}", layout, seq_lens, device, triton_ops, peak_gbps)
        windowed.extra["speedup_vs_full"] = full.time_us / windowed.time_us
        runs += [windowed, full]
        torch.cuda.empty_cache()
    return runs


def check_windowed_benchmark_output(device: torch.device, triton_ops: Any) -> list[CheckResult]:
    """The timed windowed configurations, on their released tables, give the reference's answer."""
    results = []
    for name, window, batch, context in WINDOWED_DECODE:
        seq_lens = [context] * batch
        layout = make_layout(seq_lens, BLOCK_SIZE, generator=torch.Generator().manual_seed(batch))
        args = _decode_inputs(layout, seq_lens, device, torch.float16, seed=5, window=window)
        scale = HEAD_DIM**-0.5
        out = triton_ops.paged_attention(*args, scale, max_query_len=1, check_values=False, **window)
        want = reference.paged_attention(*args, scale, **window)
        label = f"attention decode {name} b{batch} ctx{context} (benchmark config) vs reference"
        results.append(_compare(label, out, want))
        del args
        torch.cuda.empty_cache()
    return results


def check_benchmark_output(device: torch.device, triton_ops: Any) -> CheckResult:
    """The timed configuration (batch 64 x 8k) gives the reference's answer too."""
    seq_lens = [8192] * 64
    layout = make_layout(seq_lens, BLOCK_SIZE, generator=torch.Generator().manual_seed(64))
    args = _decode_inputs(layout, seq_lens, device, torch.float16, seed=3)
    scale = HEAD_DIM**-0.5
    out = triton_ops.paged_attention(*args, scale, max_query_len=1, check_values=False)
    want = reference.paged_attention(*args, scale)
    result = _compare("attention decode b64 ctx8192 (benchmark config) vs reference", out, want)
    del args
    torch.cuda.empty_cache()
    return result


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def _table(runs: Sequence[DecodeRun]) -> str:
    header = (
        f"{'run':<36} {'splits':>6} {'time us':>9} {'unique GB':>10} {'logical GB':>11} "
        f"{'unique GB/s':>12} {'logical GB/s':>13} {'% peak':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in runs:
        pct = "n/a" if r.pct_of_peak is None else f"{r.pct_of_peak:.1f}"
        lines.append(
            f"{r.name:<36} {r.num_splits:>6} {r.time_us:>9.1f} {r.unique_bytes / 1e9:>10.3f} "
            f"{r.logical_bytes / 1e9:>11.3f} {r.unique_gbps:>12.0f} {r.logical_gbps:>13.0f} {pct:>7}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json")
    parser.add_argument("--peak-gbps", type=float, default=None, help="override the device's peak HBM GB/s")
    parser.add_argument("--quick", action="store_true", help="fewer timing configurations")
    options = parser.parse_args(argv)

    if not torch.cuda.is_available():
        print("gpu_check needs a CUDA device; none is available", file=sys.stderr)
        return 2
    from . import triton_kernels as triton_ops

    if triton_ops.kernel_mode() != "compiled":
        print("gpu_check needs compiled Triton kernels: unset TRITON_INTERPRET", file=sys.stderr)
        return 2

    started = time.perf_counter()
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    peak = options.peak_gbps if options.peak_gbps is not None else peak_bandwidth_gbps(name)
    print(f"device: {name}; peak HBM: {peak if peak is not None else 'unknown'} GB/s")

    checks = check_correctness(device, triton_ops)
    checks.append(check_benchmark_output(device, triton_ops))
    checks += check_windowed_benchmark_output(device, triton_ops)
    failed = [c for c in checks if not c.ok]
    for c in checks:
        print(f"{'ok  ' if c.ok else 'FAIL'} {c.name}  (max abs diff {c.max_abs_diff:.3g}) {c.detail}")

    batches = (64,) if options.quick else (16, 64, 256)
    contexts = (8192,) if options.quick else (1024, 8192)
    sweep = decode_sweep(device, triton_ops, peak, batches, contexts)
    sharing = sharing_comparison(device, triton_ops, peak, batch=64, prefix=8192, own=64)
    windowed = windowed_decode(device, triton_ops, peak, options.quick)
    print()
    print(_table([*sweep, *sharing, *windowed]))

    target_run = next((r for r in sweep if r.batch == 64 and r.context == 8192), None)
    target_met = None
    if target_run is not None and target_run.pct_of_peak is not None:
        target_met = target_run.pct_of_peak >= 100 * TARGET_FRACTION
    speedup = sharing[0].extra["speedup_vs_private"]
    print(f"\nshared 8k prefix vs private prefixes (batch 64): {speedup:.2f}x faster")
    for run in windowed:
        if "speedup_vs_full" in run.extra:
            gain = run.extra["speedup_vs_full"]
            print(f"{run.name}: {gain:.2f}x faster than full decode of the same batch")
    if target_run is not None:
        print(
            f"decode b64 x 8k: {target_run.unique_gbps:.0f} GB/s"
            + ("" if target_met is None else f"; target >= {TARGET_FRACTION:.0%} of peak met: {target_met}")
        )

    report = {
        "device": name,
        "peak_hbm_gbps": peak,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "python": platform.python_version(),
        "config": {
            "num_q_heads": NUM_Q_HEADS,
            "num_kv_heads": NUM_KV_HEADS,
            "head_dim": HEAD_DIM,
            "block_size": BLOCK_SIZE,
            "dtype": "float16",
            "timing": "triton.testing.do_bench, median, L2 flushed before each run",
        },
        "correctness": [asdict(c) for c in checks],
        "correctness_ok": not failed,
        "decode": [asdict(r) for r in sweep],
        "sharing": [asdict(r) for r in sharing],
        "windowed_decode": [asdict(r) for r in windowed],
        "target": {
            "fraction_of_peak": TARGET_FRACTION,
            "at": "batch 64 x context 8192",
            "met": target_met,
        },
        "elapsed_s": time.perf_counter() - started,
    }
    options.out.mkdir(parents=True, exist_ok=True)
    path = options.out / "gpu_check.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {path} in {report['elapsed_s']:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
