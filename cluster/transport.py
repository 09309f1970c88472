"""How event batches travel from the replicas to the router's indexer.

- :class:`InProcess` (default): a queue in this process.
- :class:`ZmqTransport` (``--transport zmq``): real ZeroMQ PUB/SUB over TCP on loopback, as vLLM
  publishes its KV events (``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``): each replica
  binds a PUB socket on ``tcp://127.0.0.1:<random port>`` and sends each batch as a three-part
  message ``[topic, seq as 8 bytes big-endian, payload]``; the router's one SUB socket connects to
  every publisher. The topic is the replica's name; the payload is the batch's JSON form
  (:func:`pagedprefix.spec.events.batch_to_json`; vLLM packs msgpack, the framing is the same).

Both are drained by the router before each decision (:meth:`drain`): every batch sent so far is
returned, so the indexer sees exactly what it would in process and the replay stays deterministic.
Within one replica ZeroMQ keeps the order; across replicas it may differ, which the indexer's
per-source state does not care about. A ZeroMQ subscriber that does not get every batch sent within
``timeout`` seconds raises :class:`TransportError` (no wait is unbounded). Sockets and the context
are closed by :meth:`close` (``linger=0``), on every exit path of the replay.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any, Protocol

from pagedprefix.spec.events import EventBatch, batch_from_json, batch_to_json

TRANSPORTS: tuple[str, ...] = ("inprocess", "zmq")
ZMQ_HINT = "--transport zmq needs pyzmq (the cluster extra): pip install 'pagedprefix[cluster]'"
PROBE_TOPIC = b"\x00probe"


class TransportError(RuntimeError):
    """Batches sent were not received in time (or a message could not be read)."""


class Transport(Protocol):
    def send(self, source: str, batch: EventBatch) -> None: ...

    def drain(self) -> list[tuple[str, EventBatch]]: ...

    def close(self) -> None: ...


class InProcess:
    """Batches in a list, handed over in the order sent."""

    def __init__(self, sources: list[str]) -> None:
        self.queue: list[tuple[str, EventBatch]] = []

    def send(self, source: str, batch: EventBatch) -> None:
        self.queue.append((source, batch))

    def drain(self) -> list[tuple[str, EventBatch]]:
        out, self.queue = self.queue, []
        return out

    def close(self) -> None:
        self.queue.clear()


def zmq_available() -> bool:
    """Whether pyzmq can be imported."""
    try:
        import zmq  # noqa: F401
    except ImportError:
        return False
    return True


class ZmqTransport:
    """PUB sockets per replica, one SUB socket for the router (module docstring)."""

    def __init__(self, sources: list[str], timeout: float = 10.0) -> None:
        """Bind the publishers, connect the subscriber, and wait (at most ``timeout`` seconds) until
        every publisher's probe arrives, so that no batch is lost to ZeroMQ's slow-joiner effect.
        Raises ``ImportError`` without pyzmq, :class:`TransportError` when the probes do not arrive."""
        import zmq

        self.zmq: Any = zmq
        self.timeout = timeout
        self.ctx = zmq.Context()
        self.pubs: dict[str, Any] = {}
        self.sent: Counter[str] = Counter()
        self.received: Counter[str] = Counter()
        try:
            self.sub = self.ctx.socket(zmq.SUB)
            self.sub.setsockopt(zmq.LINGER, 0)
            self.sub.setsockopt(zmq.RCVHWM, 0)
            self.sub.setsockopt(zmq.SUBSCRIBE, b"")
            for name in sources:
                pub = self.ctx.socket(zmq.PUB)
                pub.setsockopt(zmq.LINGER, 0)
                pub.setsockopt(zmq.SNDHWM, 0)  # never drop: losses are injected on purpose only
                port = pub.bind_to_random_port("tcp://127.0.0.1")
                self.pubs[name] = pub
                self.sub.connect(f"tcp://127.0.0.1:{port}")
            self._join()
        except BaseException:
            self.close()
            raise

    def _join(self) -> None:
        """Probe every publisher until the subscriber hears it (the connection is then up)."""
        waiting = set(self.pubs)
        deadline = time.monotonic() + self.timeout
        while waiting:
            if time.monotonic() > deadline:
                raise TransportError(f"ZeroMQ subscriber did not hear {sorted(waiting)} "
                                     f"within {self.timeout} s")
            for name in waiting:
                self.pubs[name].send_multipart([PROBE_TOPIC, name.encode()])
            while self.sub.poll(20):
                topic, body = self.sub.recv_multipart()[:2]
                if topic == PROBE_TOPIC:
                    waiting.discard(body.decode())

    def send(self, source: str, batch: EventBatch) -> None:
        payload = json.dumps(batch_to_json(batch)).encode()
        self.pubs[source].send_multipart([source.encode(), batch.seq.to_bytes(8, "big"), payload])
        self.sent[source] += 1

    def _receive(self, wait_ms: int) -> tuple[str, EventBatch] | None:
        if not self.sub.poll(wait_ms):
            return None
        parts = self.sub.recv_multipart()
        if parts[0] == PROBE_TOPIC:
            return None
        try:
            topic, seq, payload = parts
            batch = batch_from_json(json.loads(payload))
        except ValueError as exc:
            raise TransportError(f"unreadable event message: {exc}") from None
        if int.from_bytes(seq, "big") != batch.seq:
            raise TransportError(f"message seq {int.from_bytes(seq, 'big')} != batch seq {batch.seq}")
        source = topic.decode()
        self.received[source] += 1
        return source, batch

    def drain(self) -> list[tuple[str, EventBatch]]:
        """Every batch sent and not yet received (waiting at most ``timeout`` seconds for them)."""
        out: list[tuple[str, EventBatch]] = []
        deadline = time.monotonic() + self.timeout
        while self.received != self.sent:
            if time.monotonic() > deadline:
                missing = self.sent - self.received
                raise TransportError(f"ZeroMQ: {sum(missing.values())} batch(es) not received within "
                                     f"{self.timeout} s")
            got = self._receive(50)
            if got is not None:
                out.append(got)
        return out

    def close(self) -> None:
        for pub in self.pubs.values():
            pub.close(linger=0)
        sub = getattr(self, "sub", None)
        if sub is not None:
            sub.close(linger=0)
        self.ctx.term()


def open_transport(name: str, sources: list[str]) -> Transport:
    """The transport ``name`` (:data:`TRANSPORTS`) for ``sources``. Raises ``ValueError`` for an
    unknown name, ``ImportError`` when pyzmq is missing."""
    if name == "inprocess":
        return InProcess(sources)
    if name == "zmq":
        return ZmqTransport(sources)
    raise ValueError(f"unknown transport {name!r}; choose from {TRANSPORTS}")
