"""The unbounded-capacity prefix-hit bound, computed from ``hash_ids`` alone (no engine, no hashing).

Definition (block size ``B``): requests are taken in trace order. A request's prompt of ``n`` tokens
*hits* the longest run of leading full ``B``-token blocks whose whole prefix (every token from 0 to
the block's end) appeared in the prompt of an earlier request, capped at ``(n - 1) // B`` blocks (the
last prompt token is always recomputed). Its hit tokens are ``B`` times that. The token hit rate is
the sum of hit tokens over the sum of ``input_length``; the block hit rate is the sum of hit blocks
over the sum of ``ceil(input_length / B)``.

Because ids form a prefix tree and token synthesis gives different ids different tokens at every
offset, "the prefix of length ``L`` appeared before" reduces to: the id holding token ``L - 1`` was
seen earlier covering at least as many of its 512 tokens. So the bound keeps, per id, the most
tokens of it any earlier prompt covered, and walks each request's ids while they are fully covered.

A cache that never evicts (and publishes keys at admission, in arrival order) reaches exactly this
bound; decode tokens never contribute, since they are unique to their request.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pagedprefix.spec.errors import safe_repr

from .trace import TRACE_BLOCK_SIZE, TraceRequest, check_requests


@dataclass(frozen=True)
class PrefixBound:
    """Per-request hit blocks of the bound at one block size, and the totals."""

    block_size: int
    hit_blocks: tuple[int, ...]
    prompt_tokens: int
    prompt_blocks: int

    @property
    def hit_tokens(self) -> int:
        return sum(self.hit_blocks) * self.block_size

    @property
    def token_hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        return sum(self.hit_blocks) / self.prompt_blocks if self.prompt_blocks else 0.0


def prefix_hit_bound(requests: Iterable[TraceRequest], block_size: int) -> PrefixBound:
    """The bound of the module docstring for ``requests`` (in the order given) at ``block_size``.

    Raises ``ValueError`` unless ``block_size`` is an int >= 1, and :class:`TraceError` (a
    ``ValueError``) unless ``requests`` is a list or tuple of valid :class:`TraceRequest`.
    """
    if type(block_size) is not int or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1, got {safe_repr(block_size)}")
    requests = check_requests(requests)
    covered: dict[int, int] = {}  # id -> most of its tokens an earlier prompt held
    hits: list[int] = []
    prompt_tokens = 0
    prompt_blocks = 0
    for req in requests:
        n = req.input_length
        seen = 0
        for h in req.hash_ids:
            c = covered.get(h, 0)
            seen += c
            if c < TRACE_BLOCK_SIZE:
                break
        hits.append(min(seen // block_size, (n - 1) // block_size))
        for pos, h in enumerate(req.hash_ids):
            held = min(TRACE_BLOCK_SIZE, n - pos * TRACE_BLOCK_SIZE)
            if covered.get(h, 0) < held:
                covered[h] = held
        prompt_tokens += n
        prompt_blocks += -(-n // block_size)
    return PrefixBound(block_size, tuple(hits), prompt_tokens, prompt_blocks)
