"""Loading SGLang 0.5.23's cache modules (``pagedprefix.conformance.engines.sglang``), on any machine.

Two ways (``pagedprefix.conformance.engines._harness``): a fully installed SGLang (nothing is
replaced), or a CPU-only machine with the wheel installed ``--no-deps``, where the stand-ins of
:data:`STAND_INS` replace the modules around the cache that do not import without CUDA, Triton,
``transformers`` or the server stack. SGLang 0.5.23 needs Python >= 3.11.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from ..protocol import EngineUnavailable
from . import _harness
from ._harness import Loaded, StandIn

VERSION = "0.5.23"
"""The SGLang release this adapter is written against (``pip install --no-deps sglang==0.5.23``)."""

TARGETS: tuple[str, ...] = (
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.allocator.paged",
    "sglang.srt.mem_cache.allocator.token",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.common",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.sampling.sampling_params",
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.unified_cache.components",
)
"""The SGLang modules the adapter drives."""

_UTILS_COMMON = (
    "ceil_align", "get_int_env_var", "get_bool_env_var", "is_hip", "is_cuda", "is_mps",
    "get_num_new_pages", "next_power_of_2", "is_xpu", "get_device_module", "assert_int64_array",
    "is_gfx95_supported", "async_h2d",
)

STAND_INS: tuple[StandIn, ...] = (
    StandIn(
        "sglang", "package",
        "its __init__ imports the frontend language and transformers patches (orjson, transformers)",
    ),
    StandIn(
        "sglang.srt.utils", "package",
        "its __init__ star-imports sglang.srt.utils.common (orjson, requests, Triton, Pillow, "
        "starlette); other names resolve from the partial common module",
        exports=(("is_port_available", "sglang.srt.utils.network"), ("*", "sglang.srt.utils.common")),
    ),
    StandIn(
        "sglang.srt.utils.common", "partial",
        "imports orjson, pybase64, requests, Triton, Pillow and starlette; the cache uses these "
        "small helpers of it (ceil_align among them)",
        names=_UTILS_COMMON,
    ),
    StandIn(
        "sglang.kernels.ops.kvcache.mla_buffer", "placeholder",
        "Triton kernels for MLA KV buffers, re-exported by mem_cache.utils; never called",
        names=(
            "get_mla_kv_buffer_kernel", "get_mla_kv_buffer_triton", "set_mla_kv_buffer_dcp_sharded_triton",
            "set_mla_kv_buffer_fp8_quant_kernel", "set_mla_kv_buffer_kernel", "set_mla_kv_buffer_triton",
            "set_mla_kv_buffer_triton_fp8_quant", "set_mla_kv_scale_buffer_kernel",
            "set_mla_kv_scale_buffer_triton",
        ),
    ),
    StandIn(
        "sglang.srt.mem_cache.allocator", "package",
        "its __init__ imports every allocator, some with Triton kernels; base and paged are kept real",
        exports=(("BaseTokenToKVPoolAllocator", "sglang.srt.mem_cache.allocator.base"),),
    ),
    StandIn(
        "sglang.srt.mem_cache.allocator.hisparse", "placeholder",
        "DeepSeek V4's HiSparse allocator (DSV4 kernels, the model config); SWAComponent names it "
        "only in an isinstance check",
        names=("DeepSeekV4HiSparseTokenToKVPoolAllocator",),
    ),
    StandIn(
        "sglang.srt.mem_cache.allocator.unified_hybrid_swa", "placeholder",
        "the unified (shared-buffer) hybrid SWA allocators (CUDA VMM backing); the Rust tree core "
        "names UnifiedSWAAllocatorBase only in an isinstance check",
        names=("UnifiedSWAAllocatorBase",),
    ),
    StandIn(
        "sglang.srt.mem_cache.allocator.paged", "partial",
        "imports the Triton alloc kernels; PagedTokenToKVPoolAllocator falls back to its own torch "
        "code (alloc_decode_naive) when the platform has no Triton",
        names=("PagedTokenToKVPoolAllocator",),
    ),
    StandIn(
        "sglang.srt.mem_cache.memory_pool", "partial",
        "imports Triton and the device KV pools; ReqToTokenPool is plain torch",
        names=("ReqToTokenPool", "KVCache", "MHATokenToKVPool", "MLATokenToKVPool", "DSATokenToKVPool",
               "MHATokenToKOnlyPool"),
    ),
    StandIn(
        "sglang.srt.mem_cache.allocator.swa", "partial",
        "imports a Triton page-clearing kernel (get_and_clear_swa_pages, called only on CUDA); "
        "SWATokenToKVPoolAllocator is two paged allocators and a full-to-SWA index map in torch",
        names=("SWATokenToKVPoolAllocator",),
    ),
    StandIn(
        "sglang.srt.observability.metrics_collector", "placeholder",
        "imports the config stack (transformers) and prometheus; the collectors are annotations and "
        "are built only with metrics on (every name is a placeholder)",
        names=("*",),
    ),
    StandIn(
        "sglang.srt.dllm.config", "placeholder",
        "imports the server-argument stack; DllmConfig is None for an autoregressive request",
        names=("DllmConfig",),
    ),
    StandIn(
        "sglang.srt.disaggregation.utils", "partial",
        "imports the model config (transformers); Req and its time stats need DisaggregationMode",
        names=("DisaggregationMode", "FAKE_BOOTSTRAP_HOST"),
    ),
    StandIn(
        "sglang.srt.model_executor.forward_batch_info", "partial",
        "imports the model executor (Triton kernels, layers); Req needs the CaptureHiddenMode enum "
        "and its time stats ForwardMode",
        names=("CaptureHiddenMode", "ForwardMode"),
    ),
    StandIn(
        "sglang.srt.distributed", "package",
        "its __init__ star-imports the collective-communication stack (NCCL, Triton); "
        "UnifiedRadixCache needs the real submodule communication_tags",
    ),
    StandIn(
        "sglang.srt.managers.cache_controller", "placeholder",
        "the HiCache controller (host pools, storage backends, NCCL); UnifiedRadixCache builds it "
        "only for a hierarchical cache (every name is a placeholder)",
        names=("*",),
    ),
    StandIn(
        "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller", "placeholder",
        "the hybrid HiCache controller (page-interleaved host pools, NCCL, Triton); built only for "
        "a hierarchical cache (every name is a placeholder)",
        names=("*",),
    ),
    StandIn(
        "sglang.srt.mem_cache.common", "partial",
        "imports Triton memory kernels; the scheduler-side functions the adapter calls are plain "
        "Python over the tree, the allocator and the row",
        names=("match_kv_cache", "checkpoint_kv_cache", "release_kv_cache", "_evict_until_allocatable",
               "coalesce_ranges", "free_kv_row_segments", "RetractionBackup", "free_swa_out_of_window_slots"),
    ),
    StandIn(
        "sglang.srt.managers.schedule_batch", "partial",
        "imports the model executor, grammar backends, disaggregation and multimodal transport; "
        "the Req class (with the extra_key + lora_id line) and its finish reasons are run from "
        "the installed file",
        names=("Req", "ReqKvInfo", "ReqLogprob", "get_return_hidden_states_mode", "FINISH_ABORT"),
    ),
)
"""The harness's stand-ins, in the order they are tried (each only when its real module fails)."""

_LOADED: Loaded | None = None


IMPORTS_NEEDED = ("torch", "numpy", "msgspec", "zmq", "pydantic", "psutil")
"""What SGLang's cache modules import besides SGLang itself (conformance/engines/README.md)."""


def unavailable_reason() -> str | None:
    """Why this adapter cannot run here (Python older than 3.11, SGLang missing, another release,
    or a module its cache imports missing), without importing SGLang; ``None`` when it can."""
    if sys.version_info < (3, 11):
        return f"SGLang {VERSION} needs Python >= 3.11"
    return _harness.unavailable_reason("sglang", VERSION, IMPORTS_NEEDED)


def _check_python() -> None:
    if sys.version_info < (3, 11):
        raise EngineUnavailable(f"SGLang {VERSION} needs Python >= 3.11, this is {sys.version.split()[0]}")


def loaded() -> Loaded:
    """SGLang's cache modules, loaded once (real if possible, else through the harness).

    Raises :class:`~pagedprefix.conformance.protocol.EngineUnavailable` when SGLang is not installed
    or Python is older than 3.11.
    """
    global _LOADED
    if _LOADED is None:
        _check_python()
        _LOADED = _harness.load("sglang", "sglang", TARGETS + ("sglang.srt.runtime_context",), STAND_INS)
        _publish_runtime_defaults(_LOADED.modules["sglang.srt.runtime_context"])
        if "SGLANG_LOGGING_LEVEL" not in os.environ:
            logging.getLogger("sglang").setLevel(logging.ERROR)
    return _LOADED


RUNTIME_DEFAULTS: dict[str, dict[str, Any]] = {
    "serving": {"strip_thinking_cache": False},
    "spec": {"speculative_algorithm": None},
}
"""The runtime-config leaves the driven code reads (``Req.owned_kv_len``, ``release_kv_cache``),
with ``ServerArgs``' defaults."""


def _publish_runtime_defaults(runtime_context: Any) -> None:
    """SGLang's code reads process-wide config bags that its launcher publishes from ``ServerArgs``
    (``runtime_context.publish``); building ``ServerArgs`` needs the whole server stack, so each
    namespace of :data:`RUNTIME_DEFAULTS` that nobody has published yet gets a bag (SGLang's own
    ``_ConfigBag``) holding just those defaults. A namespace already published is left alone."""
    context = runtime_context._CONTEXT
    for namespace, leaves in RUNTIME_DEFAULTS.items():
        if context.is_config_namespace_published(namespace):
            continue
        bag = runtime_context._ConfigBag(namespace)
        for leaf, value in leaves.items():
            bag._set(leaf, value)
        context._config_bags = {**(context._config_bags or {}), namespace: bag}
