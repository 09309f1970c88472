"""The cluster replay: routers, one replica equals the replay, prefix-aware routing finds the holder,
faults (lost batches, restarts) and what they cost, events over real ZMQ PUB/SUB equal in-process,
and the replay command's cluster mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import broken_indexers
import pytest
from pagedprefix.cluster._interim_events import EventingEngine
from pagedprefix.cluster.replay import ClusterOptions, run_cluster, run_with_twin
from pagedprefix.cluster.router import ReplicaView, choose
from pagedprefix.replay import ReplayConfig, load_factory, load_trace, parse_lines, run_replay
from pagedprefix.replay.sim import Executor
from pagedprefix.spec import CacheConfig
from pagedprefix.spec.events import replay_events

IMPL = load_factory("impl")
SLICE = load_trace("conversation", limit=150).requests
UNBOUNDED = ReplayConfig(num_blocks=None, max_running=16, step_ms=200.0, max_output=64)
TESTS = str(Path(__file__).parent)


def needs_zmq() -> None:
    if os.environ.get("PAGEDPREFIX_REQUIRE_CLUSTER") != "1":
        pytest.importorskip("zmq")


def test_routers_choose_by_their_rule() -> None:
    views = [ReplicaView(0, 100, 2), ReplicaView(320, 500, 1), ReplicaView(None, 50, 3),
             ReplicaView(0, 50, 1)]
    assert [choose("round_robin", views, k) for k in range(5)] == [0, 1, 2, 3, 0]
    assert choose("least_loaded", views, 0) == 3  # 50 blocks, then fewer requests
    assert choose("prefix_aware", views, 0, lam=0.0) == 1  # the most cached tokens
    assert choose("prefix_aware", views, 0, lam=1.0) == 3  # 320 - 500 < 0 - 50; out-of-sync counts 0
    assert choose("prefix_aware", views, 0, lam=0.5) == 1  # 320 - 250 = 70 > -25
    with pytest.raises(ValueError):
        choose("nope", views, 0)


def test_one_replica_is_the_replay() -> None:
    for config in (UNBOUNDED, ReplayConfig(num_blocks=2000, max_running=8, step_ms=50.0, max_output=100)):
        single = run_replay(SLICE, config, IMPL)
        cluster = run_cluster(SLICE, config, ClusterOptions(replicas=1, router="prefix_aware"), IMPL)
        assert cluster.hits == single.hits
        assert (cluster.token_hit_rate, cluster.evictions, cluster.preemptions, cluster.rejected) == (
            single.token_hit_rate, single.evictions, single.preemptions, single.rejected)
    assert single.evictions and single.evictions > 10_000  # the second config is under eviction pressure


def test_the_derived_event_stream_reconstructs_the_engine_index() -> None:
    """cluster/_interim_events.py (engines without an event queue): its stream, replayed, is the
    engine's real index under eviction pressure and copy-on-write."""
    engines: list[EventingEngine] = []
    events: list[object] = []

    def factory(cache_config):  # type: ignore[no-untyped-def]
        engine = EventingEngine(IMPL(cache_config), cache_config)
        engines.append(engine)
        return engine

    class Recording(Executor):
        def _after(self) -> None:
            super()._after()
            events.extend(self.engine.take_events())  # type: ignore[attr-defined]

    config = ReplayConfig(num_blocks=1500, max_running=8, max_output=40, samples=2)
    result = run_replay(SLICE[:80], config, factory, executor=Recording)
    assert result.evictions and result.evictions > 1000 and result.cow_copies > 0
    engine = engines[0]
    real = {}
    for b in range(1500):
        key = engine.inner.block_hash(b)
        if key is not None:
            real[(0, key)] = real.get((0, key), 0) + 1
    assert replay_events(events) == engine.cached_keys() == real  # type: ignore[arg-type]


def test_a_replica_drives_the_engines_own_event_queue() -> None:
    """The built-in engines publish their own events (create(config, events=True)): no wrapper."""
    from pagedprefix.cluster.replay import Replica, takes_events

    assert takes_events(IMPL) and not takes_events(lambda config: IMPL(config))
    replica = Replica("r0", IMPL, CacheConfig(block_size=16, num_blocks=64), SLICE[:2],
                      ReplayConfig(num_blocks=64), [0, 0])
    assert not isinstance(replica.engine, EventingEngine)
    assert replica.engine.take_events() == []
    wrapped = Replica("r1", lambda config: IMPL(config), CacheConfig(block_size=16, num_blocks=64),
                      SLICE[:2], ReplayConfig(num_blocks=64), [0, 0])
    assert isinstance(wrapped.engine, EventingEngine)


def shared_prefix_trace():  # type: ignore[no-untyped-def]
    lines = [
        {"timestamp": 0, "input_length": 2048, "output_length": 4, "hash_ids": [10, 11, 12, 13]},
        {"timestamp": 0, "input_length": 2048, "output_length": 4, "hash_ids": [1, 2, 3, 4]},
        {"timestamp": 0, "input_length": 2048, "output_length": 4, "hash_ids": [20, 21, 22, 23]},
        {"timestamp": 0, "input_length": 2048, "output_length": 4, "hash_ids": [30, 31, 32, 33]},
        {"timestamp": 60000, "input_length": 2500, "output_length": 4, "hash_ids": [1, 2, 3, 4, 5]},
    ]
    return parse_lines([json.dumps(x) for x in lines], strict=True).requests


@pytest.mark.parametrize("transport", ["inprocess", pytest.param("zmq", marks=pytest.mark.cluster)])
def test_prefix_aware_sends_a_repeated_prefix_to_the_replica_that_holds_it(transport: str) -> None:
    if transport == "zmq":
        needs_zmq()
    reqs = shared_prefix_trace()
    aware = run_cluster(reqs, UNBOUNDED, ClusterOptions(4, "prefix_aware", transport=transport), IMPL)
    assert aware.routes == [0, 1, 2, 3, 1]  # the repeat goes where [1, 2, 3, 4] was computed
    assert aware.hits == [0, 0, 0, 0, 2048]
    blind = run_cluster(reqs, UNBOUNDED, ClusterOptions(4, "round_robin"), IMPL)
    assert blind.routes == [0, 1, 2, 3, 0] and blind.hits[4] == 0


def test_lost_batches_are_resynced_and_cost_no_hits_with_the_reference() -> None:
    reqs = load_trace("conversation", limit=400).requests  # long enough for conversations to return
    options = ClusterOptions(4, "prefix_aware", drop_events=0.3, fault_seed=1)
    clean = run_cluster(reqs, UNBOUNDED, replace(options, drop_events=0.0), IMPL)
    lossy = run_with_twin(reqs, UNBOUNDED, options, IMPL)
    assert lossy.batches_dropped > 0.2 * lossy.batches_published
    # A run of losses is one gap, seen by the next batch and resynced before the next decision.
    assert 20 <= lossy.resyncs <= lossy.batches_dropped
    assert lossy.oracle_token_hit_rate == clean.token_hit_rate  # the oracle is lossless by definition
    assert lossy.hit_rate_lost is not None and abs(lossy.hit_rate_lost) < 0.01
    # An indexer that ignores gaps never resyncs: it goes stale and routes on it.
    broken = run_cluster(reqs, UNBOUNDED, options, IMPL, indexer_factory=broken_indexers.ignores_gaps)
    assert broken.resyncs == 0
    assert lossy.stale_decisions == 0 and broken.stale_decisions and broken.misroutes
    assert broken.token_hit_rate < lossy.token_hit_rate - 0.02


def test_a_loss_on_a_replica_that_goes_idle_is_never_seen_without_a_heartbeat() -> None:
    clean = run_cluster(SLICE, UNBOUNDED, ClusterOptions(8, "prefix_aware"), IMPL)
    options = ClusterOptions(8, "prefix_aware", drop_events=0.3, fault_seed=0)
    starved = run_cluster(SLICE, UNBOUNDED, options, IMPL)
    # r4's only batch is lost and r4 goes idle: it is never credited again, so it never gets work,
    # so it never publishes the batch that would show the gap.
    assert starved.requests_per_replica.split("/")[4] == "1"
    assert starved.stale_decisions and starved.stale_decisions > 100
    beating = run_cluster(SLICE, UNBOUNDED, replace(options, heartbeat=True), IMPL)
    assert beating.routes == clean.routes and beating.stale_decisions == 0
    assert beating.batches_published > clean.batches_published  # the empty batches


def test_a_restart_leaves_stale_credit_until_the_new_instance_publishes() -> None:
    options = ClusterOptions(4, "prefix_aware", restarts=((1, 60), (2, 100)))
    result = run_with_twin(SLICE, UNBOUNDED, options, IMPL)
    assert result.resyncs >= 2  # each restart is seen when its batch 0 arrives, and resynced
    assert result.stale_decisions and result.stale_decisions > 0
    assert result.oracle_token_hit_rate is not None and result.hit_rate_lost is not None
    assert result.completed == len(SLICE)  # requests running at a restart are admitted again


@pytest.mark.cluster
@pytest.mark.parametrize("options", [
    ClusterOptions(4, "prefix_aware"),
    ClusterOptions(3, "prefix_aware", drop_events=0.2, restarts=((0, 70),)),
    ClusterOptions(2, "least_loaded", drop_events=0.1),
])
@pytest.mark.parametrize("transport", ["zmq", "zmq-tcp"])
def test_zmq_pub_sub_gives_the_in_process_results(options: ClusterOptions, transport: str) -> None:
    needs_zmq()
    here = run_cluster(SLICE, UNBOUNDED, options, IMPL)
    wire = run_cluster(SLICE, UNBOUNDED, replace(options, transport=transport), IMPL)
    assert wire.hits == here.hits and wire.routes == here.routes
    strip = {"wall_s", "transport"}
    assert {k: v for k, v in wire.row().items() if k not in strip} == {
        k: v for k, v in here.row().items() if k not in strip}
    assert wire.batches_published > 100


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    argv = [sys.executable, "-m", "pagedprefix", "replay", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)


def test_replay_command_cluster_mode_writes_rows(tmp_path: Path) -> None:
    out = tmp_path / "rows.csv"
    proc = run_cli("--limit", "100", "--num-blocks", "unbounded,4000", "--max-output", "32",
                   "--replicas", "2", "--router", "prefix_aware", "--drop-events", "0.1", "--csv", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "cluster replay" in proc.stdout and "prefix_aware" in proc.stdout
    lines = out.read_text().splitlines()
    header = lines[0].split(",")
    assert len(lines) == 3 and "hit_rate_lost" in header and "load_imbalance" in header
    row = dict(zip(header, lines[1].split(",")))
    assert row["replicas"] == "2" and row["router"] == "prefix_aware" and float(row["token_hit_rate"]) > 0.02


@pytest.mark.parametrize("args, phrase", [
    (["--replicas", "2", "--router", "nope"], "unknown router 'nope'"),
    (["--replicas", "2", "--restart-replica", "x"], "expected REPLICA@REQUEST"),
    (["--replicas", "2", "--restart-replica", "5@10"], "the replica must be in [0, 2)"),
    (["--replicas", "2", "--check-spec"], "--check-spec runs one engine"),
    (["--replicas", "2", "--transport", "pigeon"], "unknown transport 'pigeon'"),
    (["--replicas", "2", "--indexer", "no_such_module_xyz:f"], "cannot import"),
    (["--drop-events", "1.5"], "--drop-events"),
])
def test_replay_command_cluster_errors_are_one_line(args: list[str], phrase: str) -> None:
    proc = run_cli("--limit", "5", *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pagedprefix replay: error:"), proc.stderr
    assert phrase in lines[0] and "Traceback" not in proc.stderr
