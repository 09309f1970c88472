"""How event batches travel from the replicas to the router's indexer.

- :class:`InProcess` (default): a queue in this process.
- :class:`ZmqTransport` (``--transport zmq``): real ZeroMQ PUB/SUB, as vLLM publishes its KV
  events (``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``): each replica binds a PUB
  socket and sends each batch as a three-part message ``[topic, seq as 8 bytes big-endian,
  payload]``; the router's one SUB socket connects to every publisher. The topic is the replica's
  name (UTF-8); the payload is the batch's JSON form (:func:`pagedprefix.spec.events.batch_to_json`;
  vLLM packs msgpack, the framing is the same). The endpoints are **IPC sockets** in a fresh private
  directory (``mkdtemp``, mode 0700, removed by :meth:`~ZmqTransport.close`), so no other local user
  can subscribe (block hashes are attack material, docs/SECURITY.md) or connect.
- ``--transport zmq-tcp``: the same over TCP on loopback (``tcp://127.0.0.1:<random port>``), for
  where IPC is not available, always with **CURVE**: every publisher is a CURVE server with a key
  pair made for this transport, the subscriber a CURVE client with its own, and a ZAP handler admits
  that one client key only; the keys never leave this process. Without CURVE in the installed
  libzmq ``zmq-tcp`` is refused (:class:`TransportError`) rather than run unauthenticated.

Both are drained by the router before each decision (:meth:`drain`): every batch sent so far is
returned, so the indexer sees exactly what it would in process and the replay stays deterministic.
Within one replica ZeroMQ keeps the order; across replicas it may differ, which the indexer's
per-source state does not care about. A ZeroMQ subscriber that does not get every batch sent within
``timeout`` seconds raises :class:`TransportError` (no wait is unbounded). Sockets, the
authenticator and the context are closed by :meth:`close` (``linger=0``), on every exit path of the
replay.

**What a received message must be** (:func:`decode_message`; anything else is a
:class:`TransportError`, never another exception): exactly three frames, none empty, at most
:data:`MAX_MESSAGE_BYTES` in all (the SUB socket's ``ZMQ_MAXMSGSIZE`` also disconnects a peer that
sends a larger frame), a UTF-8 topic naming a known replica, an 8-byte sequence number equal to the
payload's ``seq``, and a payload that is a JSON event batch nested at most :data:`MAX_JSON_DEPTH`
deep (checked before parsing, so no ``RecursionError``). Then the **sequence number** must be the one
that replica sent next: the transport records what each publisher sent, in order, and a message
whose number is not the oldest batch of that replica still in flight (a duplicate, a replay of an
old batch, an injected one, or one from an unknown topic) raises :class:`TransportError`. Numbers
going back because a replica restarted (a new instance counts from 0, SEMANTICS.md section 9), and
gaps from batches dropped on purpose (never sent), are what was sent, and so pass: the indexer's
own rules (:mod:`pagedprefix.cluster.indexer`, rules 1 and 2) deal with them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter, deque
from typing import Any, Protocol

from pagedprefix.spec.events import EventBatch, batch_from_json, batch_to_json

TRANSPORTS: tuple[str, ...] = ("inprocess", "zmq", "zmq-tcp")
ZMQ_HINT = "--transport zmq needs pyzmq (the cluster extra): pip install 'pagedprefix[cluster]'"
PROBE_TOPIC = b"\x00probe"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest event message accepted, all frames together (bytes). A batch of one engine step is
far smaller: a 4,096-block allocation's ``BlockStored`` is about 1 MiB of JSON."""
MAX_JSON_DEPTH = 32
"""The deepest nesting of arrays and objects accepted in a payload (an event batch needs 5)."""
SEQ_BYTES = 8
ZAP_DOMAIN = "pagedprefix"
_UNREADABLE = (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError, OverflowError)


class TransportError(RuntimeError):
    """Batches sent were not received in time, or a message is malformed, replayed, duplicated or
    injected (module docstring)."""


def json_depth(payload: bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` in ``payload`` outside strings, found without parsing
    (a scan that stops as soon as :data:`MAX_JSON_DEPTH` is passed)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in payload:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_JSON_DEPTH:
                    return deepest
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def decode_message(parts: list[bytes]) -> tuple[str, int, EventBatch]:
    """``(source, seq, batch)`` of one received event message (module docstring). Raises
    :class:`TransportError` for anything malformed, and for nothing else."""
    if len(parts) != 3:
        raise TransportError(f"an event message has 3 frames, got {len(parts)}")
    topic, seq_frame, payload = parts
    if not topic or not seq_frame or not payload:
        raise TransportError("an event message has an empty frame")
    size = len(topic) + len(seq_frame) + len(payload)
    if size > MAX_MESSAGE_BYTES:
        raise TransportError(f"an event message of {size} bytes (at most {MAX_MESSAGE_BYTES})")
    if len(seq_frame) != SEQ_BYTES:
        raise TransportError(f"the sequence frame has {len(seq_frame)} bytes, not {SEQ_BYTES}")
    try:
        source = topic.decode("utf-8")
    except UnicodeDecodeError:
        raise TransportError(f"the topic {topic[:60]!r} is not UTF-8") from None
    if json_depth(payload) > MAX_JSON_DEPTH:
        raise TransportError(f"the payload nests deeper than {MAX_JSON_DEPTH}")
    try:
        obj = json.loads(payload)
        batch = batch_from_json(obj)
    except _UNREADABLE as exc:
        # ValueError covers bad JSON and bad UTF-8 in the payload; the rest a batch of the wrong shape.
        raise TransportError(f"unreadable event batch: {type(exc).__name__}: {str(exc)[:200]}") from None
    seq = int.from_bytes(seq_frame, "big")
    if seq != batch.seq:
        raise TransportError(f"message seq {seq} != batch seq {batch.seq}")
    return source, seq, batch


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


class _OneClientKey:
    """A ZAP credentials provider that admits one CURVE client key (Z85)."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.key


class ZmqTransport:
    """PUB sockets per replica, one SUB socket for the router (module docstring): over IPC in a
    private directory, or with ``tcp`` over loopback TCP with CURVE."""

    def __init__(self, sources: list[str], timeout: float = 10.0, tcp: bool = False) -> None:
        """Bind the publishers, connect the subscriber, and wait (at most ``timeout`` seconds) until
        every publisher's probe arrives, so that no batch is lost to ZeroMQ's slow-joiner effect.
        Raises ``ImportError`` without pyzmq, :class:`TransportError` when the sockets cannot be set
        up (no CURVE for ``tcp``, a ZeroMQ error) or the probes do not arrive."""
        import zmq

        self.zmq: Any = zmq
        self.timeout = timeout
        self.tcp = tcp
        self.ctx = zmq.Context()
        self.pubs: dict[str, Any] = {}
        self.endpoints: dict[str, str] = {}
        self.sent: Counter[str] = Counter()
        self.received: Counter[str] = Counter()
        self.in_flight: dict[str, deque[int]] = {name: deque() for name in sources}
        self.directory: str | None = None
        self.server_key = b""
        self.auth: Any = None
        self.sub: Any = None
        try:
            self._open(zmq, sources)
            self._join()
        except zmq.ZMQError as exc:
            self.close()
            raise TransportError(f"ZeroMQ: {exc}") from None
        except BaseException:
            self.close()
            raise

    def _open(self, zmq: Any, sources: list[str]) -> None:
        if self.tcp:
            if not zmq.has("curve"):
                raise TransportError("--transport zmq-tcp needs CURVE, which this libzmq lacks; "
                                     "use --transport zmq (IPC)")
            from zmq.auth.thread import ThreadAuthenticator

            server_public, server_secret = zmq.curve_keypair()
            client_public, client_secret = zmq.curve_keypair()
            self.server_key = server_public  # public; the secret keys stay in the sockets
            self.auth = ThreadAuthenticator(self.ctx)
            self.auth.start()
            self.auth.configure_curve_callback(ZAP_DOMAIN, _OneClientKey(client_public))
        else:
            self.directory = tempfile.mkdtemp(prefix="pagedprefix-zmq-")  # mode 0700, ours alone
            os.chmod(self.directory, 0o700)
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        if self.tcp:
            self.sub.curve_publickey, self.sub.curve_secretkey = client_public, client_secret
            self.sub.curve_serverkey = server_public
        for i, name in enumerate(sources):
            pub = self.ctx.socket(zmq.PUB)
            self.pubs[name] = pub
            pub.setsockopt(zmq.LINGER, 0)
            pub.setsockopt(zmq.SNDHWM, 0)  # never drop: losses are injected on purpose only
            if self.tcp:
                pub.curve_server = True
                pub.curve_publickey, pub.curve_secretkey = server_public, server_secret
                pub.zap_domain = ZAP_DOMAIN.encode()
                endpoint = f"tcp://127.0.0.1:{pub.bind_to_random_port('tcp://127.0.0.1')}"
            else:
                endpoint = f"ipc://{self.directory}/{i}"
                pub.bind(endpoint)
            self.endpoints[name] = endpoint
            self.sub.connect(endpoint)

    def _join(self) -> None:
        """Probe every publisher until the subscriber hears it (the connection is then up)."""
        names = {name.encode(): name for name in self.pubs}
        waiting = set(self.pubs)
        deadline = time.monotonic() + self.timeout
        while waiting:
            if time.monotonic() > deadline:
                raise TransportError(f"ZeroMQ subscriber did not hear {sorted(waiting)} "
                                     f"within {self.timeout} s")
            for name in waiting:
                self.pubs[name].send_multipart([PROBE_TOPIC, name.encode()])
            while self.sub.poll(20):
                parts = self.sub.recv_multipart()
                if len(parts) == 2 and parts[0] == PROBE_TOPIC:
                    waiting.discard(names.get(parts[1], ""))
                else:
                    self.accept(parts)  # nothing was sent yet: it raises

    def send(self, source: str, batch: EventBatch) -> None:
        payload = json.dumps(batch_to_json(batch)).encode()
        self.pubs[source].send_multipart([source.encode(), batch.seq.to_bytes(SEQ_BYTES, "big"), payload])
        self.in_flight[source].append(batch.seq)
        self.sent[source] += 1

    def accept(self, parts: list[bytes]) -> tuple[str, EventBatch]:
        """One received event message, decoded (:func:`decode_message`) and checked against what its
        publisher sent (module docstring). Raises :class:`TransportError`."""
        source, seq, batch = decode_message(parts)
        flight = self.in_flight.get(source)
        if flight is None:
            raise TransportError(f"a message from {source[:60]!r}, which is not a publisher here")
        if not flight:
            raise TransportError(f"{source}: batch seq {seq} arrived, but nothing is in flight from it "
                                 f"(duplicated, replayed or injected)")
        if seq != flight[0]:
            raise TransportError(f"{source}: batch seq {seq} arrived where seq {flight[0]} was sent next "
                                 f"(duplicated, replayed or injected)")
        flight.popleft()
        self.received[source] += 1
        return source, batch

    def _receive(self, wait_ms: int) -> tuple[str, EventBatch] | None:
        if not self.sub.poll(wait_ms):
            return None
        parts = self.sub.recv_multipart()
        if len(parts) == 2 and parts[0] == PROBE_TOPIC:
            return None
        return self.accept(parts)

    def drain(self) -> list[tuple[str, EventBatch]]:
        """Every batch sent and not yet received (waiting at most ``timeout`` seconds for them).
        Raises :class:`TransportError` (module docstring)."""
        out: list[tuple[str, EventBatch]] = []
        deadline = time.monotonic() + self.timeout
        while any(self.in_flight.values()):
            if time.monotonic() > deadline:
                missing = sum(len(f) for f in self.in_flight.values())
                raise TransportError(f"ZeroMQ: {missing} batch(es) not received within {self.timeout} s")
            got = self._receive(50)
            if got is not None:
                out.append(got)
        while self.sub.poll(0):  # whatever else has arrived was never sent: it raises
            self._receive(0)
        return out

    def close(self) -> None:
        """Close every socket, the authenticator and the context; remove the IPC directory."""
        for pub in self.pubs.values():
            pub.close(linger=0)
        if self.sub is not None:
            self.sub.close(linger=0)
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
        self.ctx.term()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def open_transport(name: str, sources: list[str]) -> Transport:
    """The transport ``name`` (:data:`TRANSPORTS`) for ``sources``. Raises ``ValueError`` for an
    unknown name, ``ImportError`` when pyzmq is missing, :class:`TransportError`."""
    if name == "inprocess":
        return InProcess(sources)
    if name in ("zmq", "zmq-tcp"):
        return ZmqTransport(sources, tcp=name == "zmq-tcp")
    raise ValueError(f"unknown transport {name!r}; choose from {TRANSPORTS}")
