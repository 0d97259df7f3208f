"""benchmarks.transport_scale: Kademlia tables and hivemind's lookups over them, the per-peer byte model and the
report, on small swarms and made-up measured costs."""

from __future__ import annotations

import argparse
import json
import random

from benchmarks import transport_scale
from swarm.config import DHTTransportConfig

COSTS = {
    "find_request_bytes": 1000.0,
    "store_request_bytes": 600.0,
    "entry_bytes": 330.0,
    "served_request_bytes": 40.0,
    "ping_bytes_per_second": 60.0,
    "record_bytes": 48000.0,
    "framing": 1.5,
    "gossip_bytes_by_topic_size": {2: 450.0, 4: 1700.0, 8: 4800.0, 16: 7700.0},
    "gossip_latency_s": 0.002,
    "served_fetch_s": 0.02,
    "reference_peers": 64,
}


def _args(**overrides: object) -> argparse.Namespace:
    base = dict(step=30.0, j=4, groups_per_record=4, lifetime=3600.0, one_way_delay=0.1, link_bits_per_second=10e6,
                refill_lead=1.0, mc_steps=3000)  # fmt: skip
    return argparse.Namespace(**{**base, **overrides})


def test_a_routing_table_holds_each_nodes_nearest_neighbour_and_a_lookup_takes_few_requests():
    rng = random.Random(0)
    ids = [rng.getrandbits(160) for _ in range(300)]
    tables = transport_scale.routing_tables(ids, 10, rng)
    for node in ids[:50]:
        nearest = min((other for other in ids if other != node), key=lambda other: other ^ node)
        assert nearest in tables[node]  # the deepest bucket: a node knows its nearest neighbours
        assert len(tables[node]) <= 10 * 20
    config = DHTTransportConfig()
    small = transport_scale.lookup_counts(64, 40, config, random.Random(1))
    large = transport_scale.lookup_counts(2000, 40, config, random.Random(1))
    assert 1 <= small["read"] <= large["read"] < 30  # grows with log N, not N
    assert small["store"] <= large["store"] < 40


def test_bytes_per_peer_step_stay_flat_because_topics_and_index_reads_stay_small():
    config = DHTTransportConfig()
    lookups = {"read": 6.0, "store": 10.0}
    figures = [transport_scale.steady_bytes(n, COSTS, config, lookups, _args(lifetime=None)) for n in (64, 1000, 10**5)]
    assert all(f["topic_peers"] <= config.topic_peers for f in figures)
    bound = config.topic_peers * COSTS["gossip_bytes_by_topic_size"][config.topic_peers]
    assert all(f["bytes"]["announcements"] <= bound for f in figures)  # a topic's announcements, whatever N
    churn = transport_scale.steady_bytes(1000, COSTS, config, lookups, _args())
    assert churn["total"] > figures[1]["total"] and "joins" in churn["bytes"]


def test_the_freshest_record_reaches_a_reader_within_a_step_and_a_departed_publisher_is_hedged():
    rng = random.Random(2)
    calm = transport_scale.delivery(8, _args(), COSTS, None, rng)
    assert calm["fill_rate"] == 1.0 and calm["age_p95_s"] < 30.0 and calm["hedged_share"] == 0
    assert calm["age_median_s"] >= calm["lead_s"]  # a group waits in the cache for the lead time at least
    churn = transport_scale.delivery(8, _args(lifetime=300.0), COSTS, 300.0, rng)
    assert churn["hedged_share"] > 0 and churn["fill_rate"] > 0.95


def test_a_swarm_that_starts_at_once_writes_a_few_small_shards_not_level_0(tmp_path):
    config = DHTTransportConfig()
    start = transport_scale.start_at_once(2000, COSTS, config, {"read": 6.0, "store": 10.0}, random.Random(3))
    prior, every = start["prior"], start["every level"]
    assert prior["levels_written"] < every["levels_written"] == config.index_max_level + 1
    assert prior["largest_shard_entries"] < 20 < every["largest_shard_entries"]  # level 0 holds N / 8 entries
    assert prior["first_write_bytes"] < every["first_write_bytes"]


def test_the_report_is_written_from_measured_runs(tmp_path):
    transport = {
        "runs": [
            {
                "peers": 64, "interval": 48.0, "tcp_bytes_per_peer_step": 400000, "network_to_payload": 2.0,
                "published_bytes_per_peer_step": 48000, "record_lookup_seconds": {"median": 0.02},
                "counters": {"index_bytes_read": 3300, "index_entries_read": 10},
                "per_peer_step": {"announcements_received": 7.0},
                "rpc_bytes_per_peer_step": {"find/request": 500, "find/nearest peers": 9000, "rpc_find/calls": 9,
                                            "store/index values": 600, "store/rest": 600, "rpc_store/calls": 2,
                                            "served/request": 40, "served/record values": 58000, "rpc_served/calls": 1,
                                            "ping": 3000},
            }
        ]
    }  # fmt: skip
    gossip = {
        "runs": [
            {"topic_peers": t, "network_bytes_per_message_per_subscriber": b, "latency_median_s": 0.002}
            for t, b in COSTS["gossip_bytes_by_topic_size"].items()
        ]
    }
    (tmp_path / "t.json").write_text(json.dumps(transport))
    (tmp_path / "g.json").write_text(json.dumps(gossip))
    report = transport_scale.main(
        ["--sizes", "64", "500", "--lookups", "10", "--mc-steps", "500", "--transport", str(tmp_path / "t.json")]
        + ["--gossip", str(tmp_path / "g.json"), "--results-dir", str(tmp_path)]
    )
    assert [r["peers"] for r in report["runs"]] == [64, 500]
    page = (tmp_path / "transport_scale.md").read_text()
    assert page.count("| 500 |") == 3 and "Assumptions" in page
    assert report["check"]["measured"] == 2.0 and report["check"]["model"] > 0  # the model beside the run it uses
