"""The cluster options of ``pagedprefix replay`` (as the command parses them) turned into the
cluster replay's :class:`~pagedprefix.cluster.replay.ClusterOptions`."""

from __future__ import annotations

from pagedprefix.replay.cli import ClusterArgs
from pagedprefix.spec.errors import safe_repr

from .replay import ClusterOptions
from .router import DEFAULT_LAMBDA


def parse_restart(text: str) -> tuple[int, int]:
    """``"1@500"`` -> ``(1, 500)``: replica 1 restarts before request 500 arrives. Raises
    ``ValueError`` for anything else."""
    replica, sep, arrival = text.strip().partition("@")
    if not sep or len(replica) > 9 or len(arrival) > 18 or not _decimal(replica) or not _decimal(arrival):
        raise ValueError(f"--restart-replica {safe_repr(text)}: expected REPLICA@REQUEST, e.g. 1@500")
    return int(replica), int(arrival)


def _decimal(text: str) -> bool:
    """``text`` is a run of ASCII digits (``str.isdigit`` also takes ``²`` and ``①``, which
    ``int()`` refuses)."""
    return text.isascii() and text.isdigit()


def cluster_options(args: ClusterArgs) -> ClusterOptions:
    """The cluster replay's options from the ``replay`` command's. Raises ``ValueError`` or
    :class:`~pagedprefix.spec.InvalidConfig` (a ``ValueError``) for bad ones."""
    options = ClusterOptions(
        replicas=args.replicas,
        router=args.router or "round_robin",
        lam=DEFAULT_LAMBDA if args.router_lambda is None else args.router_lambda,
        drop_events=args.drop_events,
        restarts=tuple(parse_restart(t) for t in args.restart_replica),
        transport=args.transport,
        fault_seed=args.fault_seed,
        heartbeat=args.event_heartbeat,
    )
    options.validate()
    return options
