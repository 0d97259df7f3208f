"""benchmarks.flood in a tiny mode: a real training node, honest peer and hostile peer process on 127.0.0.1 for a few
seconds; the report has its figures and targets, the hostile peer really flooded and bombed the victim, and every
p2pd is gone at the end. No timing is asserted: the figures are the benchmark's, not the test's."""

from __future__ import annotations

import json

from benchmarks import flood
from swarm.daemon import is_p2pd


def test_the_flood_benchmark_reports_both_conditions_and_the_attack_really_happened(tmp_path, smollm_tokenizer_dir):
    tiny = ["--steps", "2", "--rounds", "1", "--attack-seconds", "8", "--bomb-interval", "1", "--idle-seconds", "2",
            "--storm-rate", "250", "--min-window-seconds", "4"]  # fmt: skip
    data = flood.main([*tiny, "--tokenizer", str(smollm_tokenizer_dir), "--out", str(tmp_path)])
    assert json.loads((tmp_path / "flood.json").read_text())["targets"].keys() == data["targets"].keys()
    page = (tmp_path / "flood.md").read_text()
    assert "## Targets" in page and "Beside this run: not recorded" in page and data["run"]["git_commit"] in page
    assert len(data["targets"]) == 4 and all(isinstance(t["pass"], bool) for t in data["targets"].values())
    clean, attack = data["conditions"]["clean"], data["conditions"]["attack"]
    for condition in (clean, attack):
        assert condition["steps"] == 2
        for key in ("honest_reached_per_step", "honest_trained_per_step", "step_time_median_s", "loop_stall_max_s",
                    "reference_loop_stall_max_s", "collector_pause_max_s", "rss_peak_mb"):  # fmt: skip
            assert condition[key] >= 0, key
        assert condition["rounds"][0]["loop_stall"]["transport"]["wakes"] > 0  # the watch ran on the transport loop
        assert condition["rounds"][0]["loop_stall"]["collector"]["collections"] > 0  # and saw the collector's pauses
        assert not any(is_p2pd(pid) for r in condition["rounds"] for pid in r["p2pd_pids"])
    for condition in data["without_training"].values():  # the loops watched again with no training
        assert condition["steps"] == [] and condition["loop_stall"]["transport"]["wakes"] > 0
    assert "## The same without training" in page
    # who used the cores: the training thread worked in each step; the hostile peer's processes only under attack
    hostile = "hostile peer (process and p2pds)"
    assert clean["step_thread_cpu_median_s"] > 0 and attack["step_thread_cpu_median_s"] > 0
    assert clean["cpu_cores"][hostile] == 0 and attack["cpu_cores"][hostile] > 0
    assert attack["cpu_cores"]["victim's p2pd"] > 0 and "## Who used the cores" in page
    # the hostile peer flooded: forged stores by the hundred, bombs, inflated claims, fresh identities (the window
    # lasts at least 4 s however fast two steps are)...
    sent = attack["attacker_sent"]
    assert sent["forged_store_values"] >= 500 and sent["bombs"] >= 2 and sent["bombs/store_record"] >= 1
    assert sent["inflated_records"] >= 1 and sent["fresh_identities"] >= 1 and sent["forged_announcements"] >= 1
    assert sent["crowd_records"] >= 1 and sent["crowd_groups"] == 32 * sent["crowd_records"]
    assert clean["others_reached_per_step"] == 0  # only the honest peer publishes when nobody attacks
    # ...and the victim refused it, by reason: the first forged values verified, then the forger rested (its stores,
    # the store-path bombs among them, refused unverified); the clean victim refused nothing
    rejects = attack["rejects"]
    assert rejects["bad_signature"] >= 32 and rejects["sender_rested"] >= 100 and not clean["rejects"]
    assert rejects["bad_signature"] + rejects["sender_rested"] >= sent["forged_store_values"] // 2


def test_a_process_that_ended_inside_the_cpu_window_counts_zero_not_its_past_as_negative():
    """The hostile peer's p2pds may end inside the measured window: the role's CPU share stays at least 0 (it was
    read as -0.136 cores under load when the ended process's past CPU was subtracted)."""
    import os
    import subprocess
    import sys

    work_then_wait = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ninput()"
    busy = subprocess.Popen([sys.executable, "-c", work_then_wait], stdin=subprocess.PIPE)
    try:
        while flood.cpu_readings([busy.pid])[busy.pid] < 0.25:  # it has a past worth subtracting
            pass
        readings = flood.cpu_readings([busy.pid, os.getpid(), None])
        assert set(readings) == {busy.pid, os.getpid()}
    finally:
        busy.communicate(b"\n", timeout=30)  # it ends and is reaped: its CPU can no longer be read
    spent = sum(range(10_000_000))  # this process works on
    assert spent > 0 and flood.cpu_since({busy.pid: readings[busy.pid]}) == 0.0
    assert flood.cpu_since(readings) > 0.0
