"""What the shipped engine adapters (vLLM 0.33, the older vLLM releases, SGLang) share.

Each engine keeps one object per live request (vLLM's ``Request``, SGLang's ``Req``) under a string
id of its own, has no block-level fork, keys blocks its own way (never the spec's bytes), leaves
input validation to the layers above its cache, and takes LoRA and salt as extras. This module says
that once: :func:`engine_capabilities` (the declaration every engine adapter starts from),
:func:`engine_request_id` (the spec's request id as the engine's string id) and
:class:`EngineAdapter` (the table of live requests, the error mapping of unknown and duplicate
ids, the block-table observation, ``fork`` and ``close``). An adapter module holds only what its
engine does differently.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from pagedprefix import spec

from ..protocol import ADAPTER_PROTOCOL_VERSION, AdapterBase, Capabilities

ENGINE_CAPABILITIES = Capabilities(
    fork=False,
    keys=False,
    reset=True,
    input_errors=False,
    extras=frozenset({"lora", "cache_salt"}),
    lookup=True,
    block_sizes=None,
    weak_hash=False,
    verify_tokens=False,
    events=False,
    protocol_version=ADAPTER_PROTOCOL_VERSION,
)
"""What every shipped engine adapter declares alike: no block-level fork or copy-on-write, keys
that are not the spec's bytes, a reset, no input validation (the engine's input processor does it,
above the cache), LoRA and salt extras, a ``lookup``, no weak hash, no ``verify_tokens``, events
off."""


def engine_capabilities(**own: Any) -> Capabilities:
    """:data:`ENGINE_CAPABILITIES` with what one engine declares of its own (its policy, its
    observations, when it publishes keys)."""
    return replace(ENGINE_CAPABILITIES, **own)


def engine_request_id(request_id: spec.RequestId) -> str:
    """The engine's string id for a spec request id (``1`` and ``"1"`` stay apart)."""
    return f"{type(request_id).__name__}:{request_id}"


class EngineAdapter(AdapterBase):
    """An engine's cache behind the protocol, holding the engine's request object per live id.

    A subclass names its ``engine`` (for messages), fills :attr:`requests` and implements
    :meth:`_table` (the spec ids of a live request's blocks).
    """

    engine: ClassVar[str] = "the engine"
    requests: dict[str, Any]

    def _new_id(self, request_id: spec.RequestId) -> str:
        """The engine id of a request about to be admitted; ``DuplicateRequest`` if it is live."""
        key = engine_request_id(request_id)
        if key in self.requests:
            raise spec.DuplicateRequest(f"request {request_id!r} is live")
        return key

    def _live(self, request_id: spec.RequestId) -> tuple[str, Any]:
        """The engine id and request object of a live request; ``UnknownRequest`` otherwise."""
        key = engine_request_id(request_id)
        request = self.requests.get(key)
        if request is None:
            raise spec.UnknownRequest(f"request {request_id!r} is not live")
        return key, request

    def _table(self, key: str, request: Any) -> tuple[int, ...]:
        raise NotImplementedError

    def block_table(self, request_id: spec.RequestId) -> tuple[int, ...]:
        return self._table(*self._live(request_id))

    def fork(self, parent_id: spec.RequestId, child_id: spec.RequestId) -> None:
        raise NotImplementedError(f"{self.engine} has no block-level fork (capability fork=False)")

    def close(self) -> None:
        self.requests.clear()
