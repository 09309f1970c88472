"""The adapter protocol: what an engine implements so the suite (and replay) can drive it.

The operations mirror SEMANTICS.md section 4 and :class:`pagedprefix.spec.SpecCache`, whose
signatures they share; errors are the spec's typed errors (``pagedprefix.spec.errors``), which an
adapter translates its engine's errors into. What an engine cannot do or show is declared in
:class:`Capabilities`; checks needing an undeclared capability are skipped and reported as such.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from pagedprefix.spec import Allocation, AppendResult, CacheConfig, Extras, RequestId

ExtraKind = Literal["lora", "cache_salt", "mm", "prompt_embeds"]
ALL_EXTRA_KINDS: frozenset[ExtraKind] = frozenset({"lora", "cache_salt", "mm", "prompt_embeds"})


@dataclass(frozen=True)
class Capabilities:
    """What an engine declares about itself.

    Attributes:
        fork: supports ``fork`` (and so copy-on-write of a shared partial block).
        ref_cnt: can report ``ref_cnt(block_id)``.
        free_queue: can report the free_block_queue order (``free_blocks()``).
        extras: extra-key kinds it supports; requests using others are not sent.
        free_order: the spec policy it claims (``"unhashed_to_head"``, ``"append_all"``) or
            ``"other"`` (e.g. a radix tree with leaf-first LRU).
        dedup_on_full: the spec policy it claims, or ``None`` for "other".
        exact_ids: it promises the spec's physical block ids (profile ``exact``).
        publish: ``"allocation"`` when keys are published at admission (vLLM) or ``"step"`` when
            they appear only after compute, i.e. at the next ``step()`` call (nano-vllm, SGLang).
        lookup_is_pure: ``lookup`` changes nothing observable (a tree engine may split nodes).
    """

    fork: bool = True
    ref_cnt: bool = True
    free_queue: bool = True
    extras: frozenset[ExtraKind] = field(default=ALL_EXTRA_KINDS)
    free_order: str = "unhashed_to_head"
    dedup_on_full: bool | None = False
    exact_ids: bool = False
    publish: Literal["allocation", "step"] = "allocation"
    lookup_is_pure: bool = True


@runtime_checkable
class PrefixCacheAdapter(Protocol):
    """An engine's prefix cache, seen through the spec's operations."""

    capabilities: Capabilities

    def allocate(
        self, request_id: RequestId, tokens: Sequence[int], extras: Extras = ...
    ) -> Allocation:
        """Admit a request; returns ``num_computed_tokens`` and its block_table."""
        ...

    def append(self, request_id: RequestId, tokens: Sequence[int]) -> AppendResult:
        """Decode tokens; returns the copy-on-write copies and the new block_table."""
        ...

    def fork(self, parent_id: RequestId, child_id: RequestId) -> None:
        """Share every block of the parent with a new child request."""
        ...

    def free(self, request_id: RequestId) -> None:
        """Release a finished request."""
        ...

    def lookup(self, tokens: Sequence[int], extras: Extras = ...) -> int:
        """``num_computed_tokens`` an admission would get now."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Forget every cached key if no block is in use; False otherwise."""
        ...

    def block_table(self, request_id: RequestId) -> tuple[int, ...]:
        """A live request's block_table."""
        ...

    def num_free_blocks(self) -> int:
        """Blocks not referenced by any live request."""
        ...

    def ref_cnt(self, block_id: int) -> int:
        """References to a block (only if ``capabilities.ref_cnt``)."""
        ...

    def free_blocks(self) -> tuple[int, ...]:
        """The free_block_queue head to tail (only if ``capabilities.free_queue``)."""
        ...

    def step(self) -> None:
        """Boundary after each operation: an engine that publishes keys after compute does so now."""
        ...


AdapterFactory = Callable[[CacheConfig], PrefixCacheAdapter]
