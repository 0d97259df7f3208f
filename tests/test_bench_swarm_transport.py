"""benchmarks/swarm_transport.py: the load-scaled interval, the TCP accounting, and one short real run of 2 peers
and an observer whose figures land in the report."""

from __future__ import annotations

import argparse

from benchmarks import swarm_transport


def _args(**overrides: object) -> argparse.Namespace:
    base = {"interval": 3.0, "per_peer_seconds": 0.375, "fixed_interval": False, "duration": 60.0}
    return argparse.Namespace(**{**base, "delivery_window": 45.0, "min_steps": 6, **overrides})


def test_interval_scales_with_the_swarm_unless_fixed():
    args = _args()
    assert [swarm_transport.interval_for(n, args) for n in (2, 8, 32, 64)] == [3.0, 3.0, 12.0, 24.0]
    assert swarm_transport.interval_for(64, _args(fixed_interval=True)) == 3.0
    assert swarm_transport.duration_for(3.0, args) == 63.0 and swarm_transport.duration_for(24.0, args) == 189.0


def test_tcp_traffic_splits_peer_and_observer_sockets():
    peer, observer = 10, 20
    before = {("a:1", "b:2"): {"pid": peer, "sent": 100, "received": 50}}
    after = {
        ("a:1", "b:2"): {"pid": peer, "sent": 300, "received": 150},  # +300 between peers
        ("a:3", "o:9"): {"pid": peer, "sent": 40, "received": 2},  # new socket to the observer
        ("o:9", "a:3"): {"pid": observer, "sent": 2, "received": 40},  # the observer's end: not a peer's
    }
    traffic = swarm_transport.tcp_traffic(before, after, {observer})
    assert traffic == {"peers": 300, "observers": 42, "sockets_closed": 0}


def test_two_peers_and_an_observer_report_costs_and_delivery(tmp_path):
    report = swarm_transport.main(
        ["--sizes", "2", "--duration", "8", "--min-steps", "1", "--delivery-window", "3", "--observers", "1"]
        + ["--rpc-bytes", "--results-dir", str(tmp_path)]
    )
    (run,) = report["runs"]
    assert run["peers"] == 2 and run["steps"] > 0 and run["all_healthy"]
    assert run["python_cpu_seconds_per_peer_step"] > 0 and run["p2pd_io_bytes_per_peer_step"] > 0
    assert run["observed_delivery"]["observers"] == 1 and run["observed_delivery"]["published"] > 0
    assert (tmp_path / "swarm_transport.md").exists() and (tmp_path / "swarm_transport.png").exists()
    # records are served by their publishers: a peer's requests to the other carry about one copy of what it
    # fetched, no record goes to a DHT replica, and the observer's requests are not counted
    rpc = run["rpc_bytes_per_peer_step"]
    fetched = run["fetched_bytes_per_peer_step"]
    assert 0.5 * fetched < rpc["served/record values"] < 1.5 * fetched, (rpc, fetched)
    assert rpc["store/record values"] == 0 and rpc["rpc_served/calls"] > 0
    assert "RPC bytes, KB per peer per step" in (tmp_path / "swarm_transport.md").read_text()
    # records reach the readers by announcements: the peers announce and hear each other's
    per_step = run["per_peer_step"]
    assert per_step["announcements_sent"] > 0 and per_step["announcements_received"] > 0
    # two peers and the observer share the one topic of a small swarm, and the report says so
    assert run["topic_levels"] == {"0": 2} and run["observer_topic_levels"] == {"0": 1}
    assert len(run["estimated_peers"]) == 2
    assert "| 0: 2 (0: 1) | 0.00 |" in (tmp_path / "swarm_transport.md").read_text()
    assert "Delivery and age at use against the step" in (tmp_path / "swarm_transport.md").read_text()
    # a report written again from the run's JSON keeps its figures and takes this version's notes
    again = swarm_transport.main(["--rewrite-report", str(tmp_path / "swarm_transport.json"), "--results-dir",
                                  str(tmp_path / "again")])  # fmt: skip
    assert again["runs"] == report["runs"] and again["notes"][-1] == swarm_transport.NOTES[-1]
    assert (tmp_path / "again" / "swarm_transport.md").read_text().count("| 2 |") == 4  # one row per table
