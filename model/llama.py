"""A small Llama forward pass in torch whose only KV storage is the project's paged cache.

One call of :meth:`Llama.forward` runs a batch of requests, each contributing the tokens it has not
computed yet (a whole prompt suffix at prefill, one token at decode). In every layer it

1. projects the tokens to Q, K and V and rotates Q and K by their positions (RoPE),
2. writes K and V into the paged cache at the tokens' slots (``KVCache.write``, which runs any
   scheduled copy-on-write copies first, then ``kernels.write_kv``),
3. attends from the new queries to every cached position of their request through its block table
   (``kernels.paged_attention``: causal, grouped-query), which includes a prefix that another request
   computed and now shares,

and finally returns the logits of one chosen position per request. No K or V tensor outlives the layer
except in the cache. The weights are in Hugging Face layout, so RoPE rotates the two halves of each
head (see :mod:`.weights` for the GGUF layout and why this is the same model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .weights import LlamaConfig

if TYPE_CHECKING:
    from pagedprefix.impl import KVCache
    from pagedprefix.kernels import Backend

__all__ = ["ForwardBatch", "Llama", "apply_rope", "rope_cos_sin"]


@dataclass
class ForwardBatch:
    """What one forward pass computes, flattened over its requests (R requests, T new tokens).

    Attributes:
        token_ids: int64 ``[T]``, the new tokens, request after request.
        positions: int64 ``[T]``, each token's position in its request.
        slot_mapping: int64 ``[T]``, each token's cache slot ``block * block_size + offset``.
        block_table: int32 ``[R, max_blocks]``, each request's blocks (rows padded with 0).
        seq_lens: int32 ``[R]``, tokens of each request including the new ones.
        query_start_loc: int32 ``[R + 1]``, where each request's new tokens start in ``token_ids``.
        logits_index: int64 ``[R]``, the token (index into ``token_ids``) whose logits to return.
    """

    token_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    logits_index: torch.Tensor


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` ``[T, head_dim]`` for half RoPE: frequency ``i`` serves dimensions ``i`` and
    ``i + head_dim/2``. Computed in float32 from the integer positions, so the same position always
    gets the same rotation, in whatever batch it is computed."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[T, heads, head_dim]``: pairs ``(x[i], x[i + D/2])`` by the angle of frequency ``i``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square normalization over the last dimension, in float32."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype)


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    ffn_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor


class Llama:
    """Llama decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, tied output embedding).

    Args:
        config: the model's shape.
        tensors: weights named as in :class:`.weights.Weights`.
        num_layers: keep only the first layers (a truncated model for quick kernel checks).
        dtype: compute and cache dtype (float32 on CPU; float16/bfloat16 are fine on a GPU).
        device: where the weights live.
    """

    def __init__(
        self,
        config: LlamaConfig,
        tensors: dict[str, torch.Tensor],
        *,
        num_layers: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.config = config
        self.num_layers = config.num_layers if num_layers is None else num_layers
        if not 1 <= self.num_layers <= config.num_layers:
            raise ValueError(f"num_layers must be in [1, {config.num_layers}], got {self.num_layers}")
        self.dtype = dtype
        self.device = torch.device(device)

        def get(name: str) -> torch.Tensor:
            return tensors[name].to(device=self.device, dtype=dtype)

        self.embed = get("embed")
        self.norm = get("norm")
        self.lm_head = get("lm_head") if "lm_head" in tensors else self.embed
        self.layers = [
            _Layer(**{field: get(f"layers.{i}.{field}") for field in _Layer.__dataclass_fields__})
            for i in range(self.num_layers)
        ]
        self.scale = config.head_dim**-0.5

    def new_kv(self, num_blocks: int, block_size: int, *, backend: Backend = "auto") -> KVCache:
        """An empty paged cache (:class:`pagedprefix.impl.KVCache`) sized for this model: its
        layers, KV heads, head_dim, dtype and device."""
        from pagedprefix.impl import KVCache

        cfg = self.config
        return KVCache(
            self.num_layers, num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=self.dtype, device=self.device, backend=backend,
        )

    def forward(self, batch: ForwardBatch, kv: KVCache, *, backend: Backend = "auto") -> torch.Tensor:
        """Run the new tokens of a batch, writing their K/V into ``kv``; logits ``[R, vocab]`` (float32)
        of the tokens named by ``batch.logits_index``.

        ``backend`` picks the kernels' implementation (``"auto"``: Triton on CUDA or under
        ``TRITON_INTERPRET=1``, the torch reference otherwise).
        """
        from pagedprefix import kernels

        cfg = self.config
        num_tokens = batch.token_ids.shape[0]
        cos, sin = rope_cos_sin(batch.positions, cfg.head_dim, cfg.rope_theta, self.dtype)
        hidden = self.embed[batch.token_ids]
        for index, layer in enumerate(self.layers):
            x = rms_norm(hidden, layer.attn_norm, cfg.rms_eps)
            q = F.linear(x, layer.wq).view(num_tokens, cfg.num_q_heads, cfg.head_dim)
            k = F.linear(x, layer.wk).view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
            v = F.linear(x, layer.wv).view(num_tokens, cfg.num_kv_heads, cfg.head_dim)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
            # The first write of a step runs the step's copy-on-write copies first (KVCache.write).
            kv.write(index, k, v, batch.slot_mapping)
            key_cache, value_cache = kv.key_caches[index], kv.value_caches[index]
            attn = kernels.paged_attention(
                q,
                key_cache,
                value_cache,
                batch.block_table,
                batch.seq_lens,
                batch.query_start_loc,
                self.scale,
                backend=backend,
            )
            hidden = hidden + F.linear(attn.reshape(num_tokens, -1), layer.wo)
            x = rms_norm(hidden, layer.ffn_norm, cfg.rms_eps)
            hidden = hidden + F.linear(
                F.silu(F.linear(x, layer.w_gate)) * F.linear(x, layer.w_up), layer.w_down
            )
        last = rms_norm(hidden[batch.logits_index], self.norm, cfg.rms_eps)
        return F.linear(last, self.lm_head).float()
