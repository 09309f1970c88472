"""Routers of the cluster replay: which replica a request goes to, at its arrival.

A router sees, per replica, only a :class:`ReplicaView`: the longest cached prefix of the request
*as the indexer says* (``None`` when the indexer holds the replica out of sync; the router then
credits it with nothing), the blocks in use (``num_blocks - num_free_blocks``, the load metric a
replica publishes beside its events, as vLLM's KV-cache usage or Dynamo's active blocks), and the
requests queued or running there.

- ``round_robin``: the ``n``-th arrival goes to replica ``n mod R``; it ignores everything else.
- ``least_loaded``: fewest blocks in use; ties: fewest requests, then the lowest index.
- ``prefix_aware``: the highest score ``cached prefix tokens - lam * blocks in use``; ties as
  ``least_loaded``. ``lam`` is tokens of cached prefix worth one block of load: with ``lam = 1`` a
  replica must hold 1000 more cached tokens to win over one with 1000 fewer blocks in use (for a
  16-token block, a cached block is worth 16 blocks of load). ``lam = 0`` is pure prefix affinity
  (it piles a popular prefix onto one replica once load matters); a large ``lam`` is
  ``least_loaded``. The default, :data:`DEFAULT_LAMBDA` = 0.25, was chosen on the Mooncake traces
  (docs/CLUSTER.md section 3: within 0.001 of the unbounded bound on both, where ``least_loaded``
  loses half the hits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ROUTERS: tuple[str, ...] = ("round_robin", "least_loaded", "prefix_aware")
DEFAULT_LAMBDA = 0.25


@dataclass(frozen=True)
class ReplicaView:
    """What a router knows of one replica at a decision."""

    cached_tokens: int | None
    blocks_in_use: int
    requests: int


def _load(view: ReplicaView) -> tuple[int, int]:
    return (view.blocks_in_use, view.requests)


def choose(router: str, views: Sequence[ReplicaView], arrival: int, lam: float = DEFAULT_LAMBDA) -> int:
    """The index of the replica ``router`` sends the ``arrival``-th request to (module docstring).
    Raises ``ValueError`` for an unknown router or no replicas."""
    if not views:
        raise ValueError("no replicas to route to")
    indexes = range(len(views))
    if router == "round_robin":
        return arrival % len(views)
    if router == "least_loaded":
        return min(indexes, key=lambda i: (*_load(views[i]), i))
    if router == "prefix_aware":
        def score(i: int) -> float:
            return (views[i].cached_tokens or 0) - lam * views[i].blocks_in_use

        return min(indexes, key=lambda i: (-score(i), *_load(views[i]), i))
    raise ValueError(f"unknown router {router!r}; choose from {ROUTERS}")
