"""The event transport (issue 18, rule 7): events on the wire are not an open door.

Default session (no pyzmq needed): every malformed multipart message is a ``TransportError`` and
nothing else (empty frames, wrong frame count, bad UTF-8 topic, invalid JSON, deep nesting,
oversize, a sequence frame that disagrees), fuzzed with Hypothesis; the depth scan agrees with
the parser. ``cluster`` session (real ZeroMQ): IPC endpoints in a private 0700 directory removed at
close; over TCP, CURVE keeps out a subscriber without the keys and one with a foreign client key;
a duplicated, replayed or injected message is caught by its sequence number, while a restart's
numbers going back and a deliberate loss's gap pass through to the indexer.
"""

from __future__ import annotations

import json
import os
import stat
import time
from typing import Any

import pytest
from hostile import CALLS, hostile_settings, report
from hypothesis import given
from hypothesis import strategies as st
from pagedprefix.cluster.transport import (
    MAX_JSON_DEPTH,
    MAX_MESSAGE_BYTES,
    TransportError,
    decode_message,
    json_depth,
)
from pagedprefix.spec.events import AllBlocksCleared, BlockRemoved, EventBatch, batch_to_json

BATCH = EventBatch(3, (BlockRemoved((b"\x01" * 32,), 0), AllBlocksCleared()))
PAYLOAD = json.dumps(batch_to_json(BATCH)).encode()
GOOD = [b"r0", (3).to_bytes(8, "big"), PAYLOAD]


def needs_zmq() -> Any:
    if os.environ.get("PAGEDPREFIX_REQUIRE_CLUSTER") != "1":
        pytest.importorskip("zmq")
    import zmq

    return zmq


def test_a_well_formed_message_decodes() -> None:
    assert decode_message(GOOD) == ("r0", 3, BATCH)


@pytest.mark.parametrize("parts, phrase", [
    ([], "3 frames, got 0"),
    (GOOD[:2], "3 frames, got 2"),
    ([*GOOD, b"x"], "3 frames, got 4"),
    ([b"", GOOD[1], GOOD[2]], "empty frame"),
    ([GOOD[0], b"", GOOD[2]], "empty frame"),
    ([GOOD[0], GOOD[1], b""], "empty frame"),
    ([GOOD[0], b"\x00" * 7, GOOD[2]], "7 bytes, not 8"),
    ([b"\xff\xfer0", GOOD[1], GOOD[2]], "is not UTF-8"),
    ([GOOD[0], GOOD[1], b"{not json"], "unreadable event batch: JSONDecodeError"),
    ([GOOD[0], GOOD[1], b'"\xff\xfe"'], "unreadable event batch"),  # bad UTF-8 in the payload
    ([GOOD[0], GOOD[1], b"[" * 200_000], f"nests deeper than {MAX_JSON_DEPTH}"),
    ([GOOD[0], GOOD[1], b'{"a":' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1)],
     "nests deeper"),
    ([GOOD[0], GOOD[1], b" " * MAX_MESSAGE_BYTES], "at most"),
    ([GOOD[0], (4).to_bytes(8, "big"), PAYLOAD], "message seq 4 != batch seq 3"),
    ([GOOD[0], GOOD[1], b'{"seq": 3}'], "unreadable event batch"),
    ([GOOD[0], GOOD[1], b'{"seq": 3, "events": [{"type": "Nope"}]}'], "unreadable event batch"),
    ([GOOD[0], GOOD[1], b'{"seq": 3, "events": [{"type": "BlockRemoved", "block_hashes": [5]}]}'],
     "unreadable event batch"),
    ([GOOD[0], GOOD[1], b"[]"], "unreadable event batch"),
    ([GOOD[0], GOOD[1], b"1e999999"], "unreadable event batch"),
])
def test_every_malformed_message_is_a_transport_error(parts: list[bytes], phrase: str) -> None:
    with pytest.raises(TransportError, match=phrase.replace("[", r"\[")):
        decode_message(parts)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30,
)


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


@hostile_settings()
@given(value=JSON)
def test_the_depth_scan_agrees_with_the_parser(value: Any) -> None:
    CALLS["transport.depth"] += 1
    text = json.dumps(value).encode()
    assert json_depth(text) == min(depth(value), json_depth(text))  # it may stop early past the limit
    if depth(value) <= MAX_JSON_DEPTH:
        assert json_depth(text) == depth(value)


def mutate(data: st.DataObject, frame: bytes) -> bytes:
    kind = data.draw(st.sampled_from(["keep", "flip", "cut", "insert", "random"]))
    if kind == "keep" or not frame:
        return frame
    if kind == "random":
        return data.draw(st.binary(max_size=80))
    at = data.draw(st.integers(0, len(frame) - 1))
    if kind == "flip":
        return frame[:at] + bytes([frame[at] ^ data.draw(st.integers(1, 255))]) + frame[at + 1:]
    if kind == "cut":
        return frame[:at]
    return frame[:at] + data.draw(st.sampled_from([b"[", b"{", b'"', b"\\", b"\xff", b"\x00", b"]]"])) * \
        data.draw(st.integers(1, 100)) + frame[at:]


@hostile_settings()
@given(data=st.data())
def test_fuzzed_frames_decode_or_raise_transport_error_only(data: st.DataObject) -> None:
    n = data.draw(st.sampled_from([3, 3, 3, 0, 1, 2, 4]))
    parts = [mutate(data, f) for f in (GOOD * 2)[:n]]
    CALLS["transport.frames"] += 1
    try:
        source, seq, batch = decode_message(parts)
    except TransportError:
        return
    assert isinstance(source, str) and seq == batch.seq and isinstance(batch, EventBatch)


# ----- real ZeroMQ ---------------------------------------------------------------------------------


@pytest.mark.cluster
def test_ipc_is_the_default_in_a_private_directory_removed_at_close() -> None:
    needs_zmq()
    from pagedprefix.cluster.transport import ZmqTransport, open_transport

    t = open_transport("zmq", ["r0", "r1"])
    assert isinstance(t, ZmqTransport)
    try:
        assert t.directory is not None
        directory = t.directory
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert all(e.startswith(f"ipc://{directory}/") for e in t.endpoints.values())
        t.send("r0", BATCH)
        assert t.drain() == [("r0", BATCH)]
    finally:
        t.close()
    assert not os.path.exists(directory)


@pytest.mark.cluster
def test_tcp_uses_curve_and_keeps_out_who_lacks_the_keys() -> None:
    zmq = needs_zmq()
    from pagedprefix.cluster.transport import ZmqTransport

    t = ZmqTransport(["r0"], timeout=10, tcp=True)
    ctx = zmq.Context()
    spies = []
    try:
        plain = ctx.socket(zmq.SUB)  # no CURVE at all
        foreign = ctx.socket(zmq.SUB)  # the right server key, a client key the ZAP handler does not admit
        foreign.curve_publickey, foreign.curve_secretkey = zmq.curve_keypair()
        foreign.curve_serverkey = t.server_key
        for spy in (plain, foreign):
            spies.append(spy)
            spy.setsockopt(zmq.SUBSCRIBE, b"")
            spy.connect(t.endpoints["r0"])
        time.sleep(0.5)
        for seq in range(5):
            t.send("r0", EventBatch(seq, ()))
        assert [b.seq for _, b in t.drain()] == [0, 1, 2, 3, 4]  # the router hears everything
        assert plain.poll(500) == 0 and foreign.poll(500) == 0  # the spies hear nothing
    finally:
        for spy in spies:
            spy.close(0)
        ctx.term()
        t.close()


@pytest.mark.cluster
def test_duplicated_replayed_and_injected_messages_are_caught_by_their_sequence_number() -> None:
    zmq = needs_zmq()
    from pagedprefix.cluster.transport import ZmqTransport

    t = ZmqTransport(["r0", "r1"], timeout=5)
    try:
        assert t.sub.getsockopt(zmq.MAXMSGSIZE) == MAX_MESSAGE_BYTES
        for seq in (0, 1):
            t.send("r0", EventBatch(seq, ()))
        t.send("r0", EventBatch(0, ()))  # a restart: the new instance counts from 0
        t.send("r0", EventBatch(5, ()))  # batches 1-4 of the new instance were dropped (never sent)
        assert [b.seq for _, b in t.drain()] == [0, 1, 0, 5]  # both pass, for the indexer to judge
        old = [b"r0", (1).to_bytes(8, "big"), json.dumps({"seq": 1, "events": []}).encode()]
        with pytest.raises(TransportError, match="nothing is in flight from it"):
            t.accept(old)  # a replay of an old message
        t.send("r0", EventBatch(6, ()))
        with pytest.raises(TransportError, match="seq 1 arrived where seq 6 was sent next"):
            t.accept(old)
        with pytest.raises(TransportError, match="not a publisher here"):
            t.accept([b"r9", (6).to_bytes(8, "big"), b'{"seq": 6, "events": []}'])
    finally:
        t.close()


@pytest.mark.cluster
def test_a_replay_from_a_rogue_publisher_fails_the_drain() -> None:
    zmq = needs_zmq()
    from pagedprefix.cluster.transport import ZmqTransport

    t = ZmqTransport(["r0"], timeout=5)
    ctx = zmq.Context()
    rogue = ctx.socket(zmq.PUB)
    try:
        port = rogue.bind_to_random_port("tcp://127.0.0.1")
        t.sub.connect(f"tcp://127.0.0.1:{port}")  # as if the rogue had got the subscriber to connect
        time.sleep(0.5)
        t.send("r0", EventBatch(0, ()))
        rogue.send_multipart([b"r0", (0).to_bytes(8, "big"), b'{"seq": 0, "events": []}'])  # a copy
        time.sleep(0.3)
        with pytest.raises(TransportError, match="duplicated, replayed or injected"):
            for _ in range(3):
                t.drain()
                time.sleep(0.2)
    finally:
        rogue.close(0)
        ctx.term()
        t.close()


def test_print_counts() -> None:
    """Last in the module: how many messages the fuzz tests decoded."""
    report("transport")
