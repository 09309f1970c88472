"""Loading vLLM 0.33.0's cache modules (``pagedprefix.conformance.engines.vllm``), on any machine.

Two ways (``pagedprefix.conformance.engines._harness``): a fully installed vLLM, where every module
is the real one (``loaded().mode == "real"``), or a CPU-only machine with the wheel installed
``--no-deps`` (``conformance/engines/README.md``), where the real cache modules load with the
stand-ins of :data:`STAND_INS` for the modules around them that do not import without CUDA,
tokenizers or servers (``loaded().mode == "harness"``).
"""

from __future__ import annotations

import logging
import os
import types
from typing import Any

from . import _harness
from ._harness import Loaded, StandIn

VERSION = "0.33.0"
"""The vLLM release this adapter is written against (``pip install --no-deps vllm==0.33.0``)."""

TARGETS: tuple[str, ...] = (
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.request",
    "vllm.utils.hashing",
    "vllm.lora.request",
    "vllm.sampling_params",
    "vllm.distributed.kv_events",
)
"""The real vLLM modules the adapter drives (all real in both modes)."""


class SamplingParams:
    """Stand-in for ``vllm.sampling_params.SamplingParams`` (the real one imports the tokenizer stack,
    ``transformers``). ``Request.__init__`` and ``Request.get_skip_reading_prefix_cache`` read only
    these four attributes; the KV-cache manager reads none."""

    def __init__(self, max_tokens: int = 16) -> None:
        self.max_tokens = max_tokens
        self.extra_args: dict[str, Any] | None = None
        self.structured_outputs: Any = None
        self.skip_reading_prefix_cache: bool | None = None


def _sampling_params(module: types.ModuleType) -> None:
    SamplingParams.__module__ = module.__name__
    module.SamplingParams = SamplingParams  # type: ignore[attr-defined]


STAND_INS: tuple[StandIn, ...] = (
    StandIn(
        "vllm.distributed", "package",
        "its __init__ imports the collective-communication stack (psutil, NCCL wrappers); the cache "
        "needs only the real submodule vllm.distributed.kv_events (event classes, MEDIUM_*)",
    ),
    StandIn(
        "vllm.config", "package",
        "its __init__ imports every config class (transformers, the attention backends); the cache "
        "imports VllmConfig and friends for annotations only, and KVCacheSpecRegistry calls "
        "get_current_vllm_config_or_none() (re-exported from the partial vllm.config.vllm)",
        names=("VllmConfig", "ModelConfig", "PoolerConfig", "SpeculativeConfig", "StructuredOutputsConfig"),
        exports=(("get_current_vllm_config_or_none", "vllm.config.vllm"),),
    ),
    StandIn(
        "vllm.config.vllm", "partial",
        "VllmConfig's module imports transformers; only the current-config global and its getter "
        "(None: no config was set, as in a bare KVCacheManager) are needed",
        names=("_current_vllm_config", "get_current_vllm_config_or_none"),
    ),
    StandIn(
        "vllm.utils.network_utils", "placeholder",
        "imports psutil; kv_events uses these only in its ZMQ publisher, which the adapter never builds",
        names=("get_ip", "get_tcp_uri", "is_valid_ipv6_address", "split_zmq_path"),
    ),
    StandIn(
        "vllm.multimodal", "package",
        "its __init__ imports Pillow; the cache imports two names from submodules",
    ),
    StandIn(
        "vllm.multimodal.utils", "placeholder",
        "imports Pillow; get_mm_features_in_window is called only for requests with multimodal "
        "features, which the adapter never sends (mm is not declared)",
        names=("get_mm_features_in_window",),
    ),
    StandIn(
        "vllm.multimodal.inputs", "placeholder",
        "imports Pillow; MultiModalFeatureSpec is an annotation in Request",
        names=("MultiModalFeatureSpec",),
    ),
    StandIn(
        "vllm.sampling_params", "custom",
        "imports the tokenizer stack (transformers); Request reads four attributes of it "
        "(SamplingParams in this module), StructuredOutputsParams is an annotation",
        names=("StructuredOutputsParams",),
        build=_sampling_params,
    ),
    StandIn(
        "vllm.pooling_params", "placeholder",
        "imports vllm.sampling_params' real enums and the config stack; Request gets pooling_params=None",
        names=("PoolingParams",),
    ),
    StandIn(
        "vllm.compilation.cuda_graph", "placeholder",
        "imports the CUDA-graph and NCCL stack (psutil); CUDAGraphStat is an annotation in "
        "vllm.v1.metrics.stats",
        names=("CUDAGraphStat",),
    ),
    StandIn(
        "vllm.v1.metrics.perf", "placeholder",
        "imports prometheus_client; PerfStats is an annotation in vllm.v1.metrics.stats",
        names=("PerfStats",),
    ),
    StandIn(
        "vllm.v1.spec_decode.metrics", "placeholder",
        "imports prometheus_client; SpecDecodingStats is an annotation in vllm.v1.metrics.stats",
        names=("SpecDecodingStats",),
    ),
    StandIn(
        "vllm.v1.outputs", "placeholder",
        "imports the scheduler output and multimodal stack; these are annotations in vllm.v1.engine",
        names=("LogprobsLists", "LogprobsTensors", "SamplingMaskLists"),
    ),
    StandIn(
        "vllm.v1.serial_utils", "placeholder",
        "imports cloudpickle and the multimodal stack; UtilityResult is an annotation in vllm.v1.engine",
        names=("UtilityResult",),
    ),
    StandIn(
        "vllm.v1.structured_output", "package",
        "its __init__ imports the grammar backends (openai, xgrammar); Request needs the real "
        "submodule vllm.v1.structured_output.request",
    ),
    StandIn(
        "vllm.v1.utils", "partial",
        "imports uvloop, psutil and the engine-process utilities; Request needs vLLM's own "
        "ConstantList (the read-only token views the block hasher slices) and kv_cache_utils "
        "tensor_data (prompt-embeds hashing, not driven)",
        names=("T", "ConstantList", "tensor_data"),
    ),
)
"""The harness's stand-ins, in the order they are tried (each only when its real module fails)."""

_LOADED: Loaded | None = None


IMPORTS_NEEDED = ("torch", "numpy", "msgspec", "cbor2", "zmq", "regex", "pydantic")
"""What vLLM's cache modules import besides vLLM itself (conformance/engines/README.md)."""


def unavailable_reason() -> str | None:
    """Why this adapter cannot run here (vLLM missing, another release, or a module its cache
    imports missing), without importing vLLM; ``None`` when it can."""
    return _harness.unavailable_reason("vllm", VERSION, IMPORTS_NEEDED)


def loaded() -> Loaded:
    """vLLM's cache modules, loaded once (real if possible, else through the harness).

    Raises :class:`~pagedprefix.conformance.protocol.EngineUnavailable` when vLLM is not installed.
    """
    global _LOADED
    if _LOADED is None:
        _LOADED = _harness.load("vllm", "vllm", TARGETS, STAND_INS)
        if "VLLM_LOGGING_LEVEL" not in os.environ:
            # vLLM warns on every refused reset_prefix_cache and every xxhash root; a conformance
            # run makes thousands of those. VLLM_LOGGING_LEVEL, when set, is left in charge.
            logging.getLogger("vllm").setLevel(logging.ERROR)
    return _LOADED

