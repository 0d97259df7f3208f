"""The WAN transport benchmark's report: transport_wan.json, .md and .png (for `benchmarks.transport_wan`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, pyplot, record_lines, write_report


def fmt(value: Any, spec: str = "{:.2f}") -> str:
    """``value`` formatted, or ``-`` when there is none."""
    return "-" if value is None else spec.format(value)


def write_outputs(report: dict[str, Any], out: Path = RESULTS) -> None:
    """transport_wan.json, .md and .png (delivery latency of every group over time) in ``out``."""
    a, run = report["analysis"], report["run"]
    cap, d = run["capacity"], a["dropout"]
    links = run["links"]
    lines = [
        "# Swarm transport over WAN-like links (hivemind DHT, namespace hosts, userspace switch)",
        "",
        *record_lines(report),
        f"Setup: {report['setup']}",
        "",
        "## Delivery, age at use and fill rate per condition",
        "",
        f"| condition | groups published | delivery s median / p95 | delivered share | fill rate (J) "
        f"| age at use s median / p95 (step {report['settings']['interval']:g} s) | failures |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, c in a["conditions"].items():
        lines.append(
            f"| {name} | {c['groups_published']} | {fmt(c['latency_median_s'])} / {fmt(c['latency_p95_s'])} "
            f"| {fmt(c['delivered_share'])} | {fmt(c['fill_rate'])} "
            f"| {fmt(c.get('age_median_s'), '{:.1f}')} / {fmt(c.get('age_p95_s'), '{:.1f}')} | {c['failures']} |"
        )
    dur, before, own, back = (
        d["others_during_cut"],
        d["others_before_cut"],
        d["cut_host_during_cut"],
        d["cut_host_after_restore"],
    )
    lines += [
        "",
        f"## Dropout: host {d['host']}'s link cut for {d['cut_seconds']:.0f} s, then restored",
        "",
        "| who, when | groups published | delivery s median / p95 | delivered share | fill rate (J) | failures |",
        "|---|---|---|---|---|---|",
    ]
    for label, c in [
        ("other publishers, before the cut", before),
        ("other publishers, during the cut", dur),
        ("cut host, during the cut", own),
        ("cut host, after the restore", back),
    ]:
        lines.append(
            f"| {label} | {c['groups_published']} | {fmt(c['latency_median_s'])} / {fmt(c['latency_p95_s'])} "
            f"| {fmt(c['delivered_share'])} | {fmt(c['fill_rate'])} | {c['failures']} |"
        )
    counters = d["cut_host_counters"]
    lines += [
        "",
        f"- After the restore, an observer saw a group of the cut host after "
        f"{fmt(d['first_sighting_after_restore_s'], '{:.1f}')} s (any group) and a group it published after the "
        f"restore after {fmt(d['first_new_group_seen_after_restore_s'], '{:.1f}')} s; the cut host's own fetch "
        f"returned groups again {fmt(d['cut_host_fetches_again_after_s'], '{:.1f}')} s after the restore.",
        f"- Cut host from the cut to the end: {counters.get('publish_failures', 0)} publish failures, "
        f"{counters.get('fetch_failures', 0)} fetch failures, {counters.get('rejoin_attempts', 0)} rejoin attempts, "
        f"{counters.get('rejoins', 0)} rejoins.",
        f"- Every peer healthy at the end: {a['all_healthy']}; peers joined (under WAN links) in "
        f"{run['startup_seconds']:.0f} s.",
        "",
        "## Links",
        "",
        "| host | role | one-way delay ms | loss per direction | Mbit/s |",
        "|---|---|---|---|---|",
    ]
    roles = {r["host"]: r["role"] for r in run["results"]}
    for i, link in enumerate(links):
        lines.append(
            f"| {i} | {roles.get(i, '?')}{' (bootstrap)' if i == 0 else ''}"
            f"{' (cut)' if i == d['host'] else ''} | {link['delay_ms']:.0f} | {link['loss']:.2f} "
            f"| {link['rate_mbit']:.1f} |"
        )
    tot, late = a["switch_totals"], a["switch_lateness"]
    sw = a["switch_during"]
    lines += [
        "",
        "## The switch and its limits",
        "",
        '- `tc netem` is not available in this kernel ("Specified qdisc kind is unknown"), so the links are made by '
        "a userspace switch (testbed/wan_switch.py): a Python process in the hub namespace reads every frame from an "
        "AF_PACKET socket on each hub-side veth port, forwards it by learned MAC and applies per link: one-way "
        "delay, 1 % random loss per direction, a bandwidth limit (serialisation delay per byte with a 250 ms tail-"
        "drop queue) and an up/down switch, in both directions, so a round trip between hosts A and B takes at least "
        "2 x (delay_A + delay_B). Checksum and segmentation offloads are turned off on the veths (a packet socket "
        "re-sends frames as they are).",
        f"- Its own capacity on this machine (TCP bulk transfer between two hosts, perfect links, before the swarm "
        f"started): {cap['mbit_per_s']:.0f} Mbit/s, {cap['frames_per_s']:.0f} frames/s forwarded, "
        f"{cap['switch_cpu_s'] / cap['seconds']:.0%} of a core. The WAN links (10-20 Mbit/s each) stay below it "
        "only while few hosts send at once; above it frames queue in the switch (its lateness) or in the kernel.",
        "- While the swarm ran (per phase: frames forwarded per second, share of a core, mean lateness of a frame "
        "behind its due time, share of frames more than 5 / 20 ms late, frames lost on purpose, bandwidth-queue "
        "drops): "
        + "; ".join(
            f"{name}: {x['frames_per_s']:.0f}/s, {x['cpu_share']:.0%}, {fmt(x['mean_lateness_ms'], '{:.1f}')} ms, "
            f"{fmt(x['share_late_over_5ms'], '{:.1%}')} / {fmt(x['share_late_over_20ms'], '{:.1%}')}, {x['lost']}, "
            f"{x['queue_drops']}"
            for name, x in sw.items()
        )
        + ". Lateness is the switch's own added delay (CPU contention: it runs at nice -10 but still waits for a core "
        "now and then); it is also most of what the `no delay` condition adds besides hivemind. A late switch also "
        "reads a burst of frames at once and may drop some of them from a bandwidth queue that the real spacing "
        "would have spared. Whole run, capacity "
        f"test included: {tot['tx']} frames sent, largest lateness {late['max_ms']:.0f} ms, "
        f"{tot['kernel_drops']} frames dropped by the kernel (socket buffer full), {tot['oversize']} oversize "
        "frames.",
        *[
            f"- **{name}: the switch itself was late** ({x['share_late_over_20ms']:.0%} of frames more than 20 ms "
            f"behind their due time, {x['queue_drops']} bandwidth-queue drops): figures of this phase measure the "
            "overloaded machine and its switch as much as the links; compare them with care."
            for name, x in sw.items()
            if (x["share_late_over_20ms"] or 0) > 0.05
        ],
        f"- The machine has 2 CPU cores for hivemind's Python, {len(links)} p2pd daemons and the switch; whatever "
        "else ran beside them is said with the result (README, commit message).",
        "",
        "## Notes",
        "",
        *report["notes"],
    ]
    if run["warnings"]:
        lines += ["", "Most frequent warnings in the workers' logs (count, message with numbers blanked):", ""]
        lines += [f"- {n} x `{message}`" for message, n in run["warnings"]]
    write_report(out, "transport_wan", report, lines)

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ev = run["events"]
    go = ev["wan"]
    created = {gid: (t, r["host"]) for r in run["results"] if r["role"] == "publisher" for gid, t in r["published"]}
    for host in sorted({h for _, h in created.values()}):
        points = [
            (created[gid][0] - go, latency)
            for o in run["results"]
            if o["role"] == "observer"
            for gid, latency in o["latencies"].items()
            if gid in created and created[gid][1] == host
        ]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.scatter(xs, ys, s=6, label=f"host {host} ({links[host]['delay_ms']:.0f} ms)")
    for name in ("no delay", "wan + dropout", "cut", "restore"):
        ax.axvline(ev[name] - go, color="grey", linestyle="--", linewidth=0.8)
        ax.text(ev[name] - go, ax.get_ylim()[1] * 0.95, f" {name}", fontsize=8, va="top")
    ax.set_yscale("log")
    ax.set_xlabel("group created at (s since start)")
    ax.set_ylabel("delivery latency to an observer (s)")
    ax.set_title("Delivery latency of every group seen by the observers")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "transport_wan.png", dpi=120)
    plt.close(fig)
