"""What both clean corpus engines share: the request-id and prompt checks, the hit cap and the
block-table observation. Each engine keeps its own state and policy; this holds only the parts of
the adapter surface that are the same in a pool and in a tree."""

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
    """The shared checks of a corpus engine over its live requests ``_requests``."""

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

    def block_table(self, request_id: spec.RequestId) -> tuple[int, ...]:
        return tuple(self._live(request_id).table)
