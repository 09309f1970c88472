"""What both clean corpus engines share: the request-id and prompt checks, the hit cap, the
admission tail, the decode ``append`` and the block-table observation. Each engine keeps its own
state and policy (how a block is taken, how full blocks are published, when a write must copy);
this holds only the parts of the adapter surface that are the same in a pool and in a tree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from pagedprefix import spec
from pagedprefix.conformance.protocol import AdapterBase


@dataclass
class CorpusRequest:
    """A live request as both engines hold it: its tokens, extras and block table."""

    tokens: list[int]
    extras: spec.Extras
    table: list[int]


R = TypeVar("R", bound=CorpusRequest)


class CorpusEngine(AdapterBase, Generic[R]):
    """The shared checks and operations of a corpus engine over its live requests ``_requests``.

    A subclass supplies the hooks ``_take_block``, ``_publish``, ``_needs_copy``,
    ``_copy_on_write`` and ``num_free_blocks``.
    """

    B: int
    N: int
    _requests: dict[spec.RequestId, R]

    def _hit_cap(self, num_tokens: int) -> int:
        """The most leading blocks a prompt may hit: its last token is always recomputed."""
        return (num_tokens - 1) // self.B

    def _check_new_id(self, request_id: object) -> spec.RequestId:
        rid = spec.check_request_id(request_id)
        if rid in self._requests:
            raise spec.DuplicateRequest(f"request {rid!r} is already live")
        return rid

    def _live(self, request_id: object) -> R:
        req = self._requests.get(spec.check_request_id(request_id))
        if req is None:
            raise spec.UnknownRequest(f"request {request_id!r} is not live")
        return req

    def _pop_live(self, request_id: object) -> R:
        """The live request ``request_id``, no longer live."""
        req = self._live(request_id)
        del self._requests[spec.check_request_id(request_id)]
        return req

    def _checked_prompt(self, tokens: Sequence[int], extras: spec.Extras) -> list[int]:
        """The prompt's tokens as a list, after the token and extras checks."""
        token_list = spec.check_tokens(tokens)
        spec.check_extras(extras, len(token_list))
        return token_list

    # ----- hooks ---------------------------------------------------------------------------

    def _take_block(self) -> int:
        """A block for new content, with one reference; capacity was checked."""
        raise NotImplementedError

    def _publish(self, req: R) -> None:
        """Make every block of ``req`` that became full findable by later prompts."""
        raise NotImplementedError

    def _needs_copy(self, req: R) -> bool:
        """Whether an append must copy the last block first: it is partial and shared."""
        raise NotImplementedError

    def _copy_on_write(self, req: R) -> tuple[int, int]:
        """Give ``req`` a private copy of its shared partial last block; returns ``(src, dst)``."""
        raise NotImplementedError

    def num_free_blocks(self) -> int:
        raise NotImplementedError

    # ----- shared operations ----------------------------------------------------------------

    def _admit(self, rid: spec.RequestId, req: R, hit_blocks: int) -> spec.Allocation:
        """Make ``req`` live under ``rid``, publish its full blocks; ``hit_blocks`` were hits."""
        self._requests[rid] = req
        self._publish(req)
        return spec.Allocation(hit_blocks * self.B, tuple(req.table))

    def append(self, request_id: spec.RequestId, tokens: Sequence[int]) -> spec.AppendResult:
        """Decode: copy a shared partial last block, take blocks as needed, publish the full ones.

        Raises :class:`spec.OutOfBlocks` (changing nothing) when the copy and the new blocks
        need more than the free blocks.
        """
        req = self._live(request_id)
        token_list = spec.check_tokens(tokens)
        cow = self._needs_copy(req)
        total = spec.blocks_needed(len(req.tokens) + len(token_list), self.B)
        grow = total - len(req.table)
        if int(cow) + grow > self.num_free_blocks():
            raise spec.OutOfBlocks(int(cow) + grow, self.num_free_blocks(), self.N, total)
        copies = [self._copy_on_write(req)] if cow else []
        req.tokens.extend(token_list)
        req.table.extend(self._take_block() for _ in range(grow))
        self._publish(req)
        return spec.AppendResult(tuple(copies), tuple(req.table))

    def block_table(self, request_id: spec.RequestId) -> tuple[int, ...]:
        return tuple(self._live(request_id).table)
