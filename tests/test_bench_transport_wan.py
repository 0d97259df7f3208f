"""benchmarks/transport_wan.py's analysis on a made-up run: windows, delivered share, fill rate, dropout recovery."""

from __future__ import annotations

from benchmarks.transport_wan import dropout_stats, switch_delta, window_stats


def made_up_run() -> dict:
    """Two publishers (host 1 is cut from t=100 to t=150) and one observer; every group created at whole seconds."""
    counters = [[0.0, {}], [100.0, {}], [150.0, {"publish_failures": 2, "rejoins": 1}], [200.0, {}]]
    counters[3][1] = counters[2][1]
    publishers = [
        {
            "role": "publisher",
            "host": host,
            "published": [[f"h{host}-{t}", float(t)] for t in range(0, 200, 10)],
            "steps": [[float(t), 4 if host == 0 or not 100 <= t < 150 else 0] for t in range(0, 200, 10)],
            "snapshots": counters if host == 1 else [[0.0, {}], [200.0, {}]],
            "healthy": True,
        }
        for host in (0, 1)
    ]
    # the observer sees every group 2 s after its creation, except host 1's: those of the cut 5 s after the
    # restore, the later ones 8 s after their creation
    latencies = {}
    for p in publishers:
        for gid, t in p["published"]:
            if p["host"] == 1 and t >= 100:
                latencies[gid] = (155.0 - t) if t < 150 else 8.0
            else:
                latencies[gid] = 2.0
    observer = {"role": "observer", "host": 2, "latencies": latencies, "snapshots": [[0.0, {}]], "healthy": True}
    events = {"wan": 0.0, "no delay": 50.0, "wan + dropout": 80.0, "cut": 100.0, "restore": 150.0, "end": 230.0}
    return {"results": [*publishers, observer], "events": events, "dropout_host": 1}


def test_window_figures_and_dropout_recovery() -> None:
    run = made_up_run()
    before = window_stats(run, 0.0, 100.0, j=4)
    assert before["groups_published"] == 20 and before["delivered_share"] == 1.0
    assert before["latency_median_s"] == 2.0 and before["fill_rate"] == 1.0 and before["failures"] == 0

    d = dropout_stats(run, j=4)
    assert d["others_during_cut"]["fill_rate"] == 1.0 and d["others_during_cut"]["latency_median_s"] == 2.0
    assert d["cut_host_during_cut"]["fill_rate"] == 0.0
    assert d["cut_host_during_cut"]["failures"] == 2
    assert d["first_sighting_after_restore_s"] == 5.0  # the groups held back by the cut
    assert d["first_new_group_seen_after_restore_s"] == 8.0  # the first one published after the restore
    assert d["cut_host_fetches_again_after_s"] == 0.0
    assert d["cut_host_counters"]["rejoins"] == 1


def test_switch_delta_is_per_phase() -> None:
    def stats(uptime: float, tx: int, cpu: float, n: int, late_ms: float) -> dict:
        port = {"tx": tx, "lost": 0, "queue_drops": 0, "down_drops": 0, "kernel_drops": 0}
        lateness = {"n": n, "sum_ms": late_ms, "over_5ms": 0, "over_20ms": 0}
        return {"uptime_s": uptime, "cpu_s": cpu, "ports": {"port0": port}, "lateness": lateness}

    sw = {"a": stats(10.0, 1000, 1.0, 1000, 500.0), "b": stats(20.0, 3000, 2.0, 3000, 700.0)}
    delta = switch_delta(sw, "a", "b")
    assert delta["frames_per_s"] == 200.0 and delta["cpu_share"] == 0.1 and delta["mean_lateness_ms"] == 0.1
