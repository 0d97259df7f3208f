"""The transport benchmark's report: swarm_transport.json, .md (one row per N) and .png, with the notes that say
what the figures support (for `benchmarks.swarm_transport`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, pyplot, record_lines, write_report


def _pair(d: dict[str, Any] | None, fmt: str = "{:.3f}", low: str = "median", high: str = "p95") -> str:
    if not d or d.get(low) is None:
        return "-"
    return f"{fmt.format(d[low])} / {fmt.format(d[high])}"


def _ratio(d: dict[str, Any] | None, step: float, low: str = "median", high: str = "p95") -> str:
    """A median / p95 pair as fractions of the step."""
    if not d or d.get(low) is None or not step:
        return "-"
    return f"{d[low] / step:.2f} / {d[high] / step:.2f}"


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _levels(run: dict[str, Any]) -> str:
    """'3: 60, 4: 4 (3: 2)': peers per announcement topic level at the end, the observers' in brackets."""
    peers, observers = run.get("topic_levels"), run.get("observer_topic_levels")
    if not peers:
        return "-"

    def counts(levels: dict[str, int]) -> str:
        return ", ".join(f"{level}: {count}" for level, count in levels.items())

    return counts(peers) + (f" ({counts(observers)})" if observers else "")


def write_outputs(report: dict[str, Any], out: Path = RESULTS) -> None:
    """swarm_transport.json, .md (two tables, one row per N) and .png (latencies and per-step costs) in ``out``."""
    rows = report["runs"]
    lines = [
        "# Swarm transport benchmark (hivemind DHT, loopback)",
        "",
        *record_lines(report),
        f"Setup: {report['setup']}",
        "",
        "## Cost per peer per step",
        "",
        "| N | interval s | measured s | steps/peer | CPU s/peer/step python + p2pd | swarm CPU cores "
        "| published + fetched KB/peer/step | p2pd I/O KB/peer/step | p2pd I/O / payload "
        "| TCP KB/peer/step | network / payload | python MB/peer | p2pd MB/peer |",
        "|---" * 13 + "|",
    ]
    for r in rows:
        lines.append(
            f"| {r['peers']} | {r['interval']:.1f} | {r['duration']:.0f} | {r['steps_per_peer']:.1f} "
            f"| {r['python_cpu_seconds_per_peer_step']:.3f} + {r['p2pd_cpu_seconds_per_peer_step']:.3f} "
            f"| {r['swarm_cpu_cores']:.2f} "
            f"| {r['published_bytes_per_peer_step'] / 1e3:.1f} + {r['fetched_bytes_per_peer_step'] / 1e3:.1f} "
            f"| {r['p2pd_io_bytes_per_peer_step'] / 1e3:.1f} | {_num(r['p2pd_io_to_payload'], '{:.1f}x')} "
            f"| {r['tcp_bytes_per_peer_step'] / 1e3:.1f} | {_num(r['network_to_payload'], '{:.1f}x')} "
            f"| {r['python_rss_mb_per_peer']:.0f} | {_num(r['p2pd_rss_mb_per_peer'], '{:.0f}')} |"
        )
    lines += [
        "",
        "## Latency and delivery",
        "",
        "| N | observed delivery s median / p95 (max) | delivered share | reader delivery s median / p95 "
        "| fill rate (J) | group age at fetch s median / p95 | publish() ms median / p95 | fetch() ms median / p95 "
        "| store s median / p95 | record lookup s median / p95 | index read s median / p95 | failures |",
        "|---" * 12 + "|",
    ]
    for r in rows:
        c, d = r["counters"], r.get("observed_delivery") or {}
        failures = c.get("publish_failures", 0) + c.get("fetch_failures", 0) + c.get("publish_dropped", 0)
        observed = _pair(d, "{:.1f}", "latency_median_s", "latency_p95_s")
        if d.get("latency_max_s") is not None:
            observed += f" ({d['latency_max_s']:.1f})"
        lines.append(
            f"| {r['peers']} | {observed} | {_num(d.get('delivered_share'))} "
            f"| {_pair(r.get('delivery_seconds'), '{:.1f}')} | {_num(r['fill_rate'])} "
            f"| {_pair(r['group_age_at_fetch_seconds'], '{:.1f}')} | {_pair(r['publish_call_ms'])} "
            f"| {_pair(r['fetch_call_ms'])} | {_pair(r['store_seconds'])} | {_pair(r['record_lookup_seconds'])} "
            f"| {_pair(r['index_read_seconds'])} | {failures} |"
        )
    lines += [
        "",
        "## Delivery and age at use against the step",
        "",
        "| N | step s | reader delivery s median / p95 | / step | observed delivery s median / p95 | / step "
        "| age at use s median / p95 | / step | announcements received / sent per peer-step "
        "| index reads / stores per peer-step | hedged fetches per peer-step | topic level: peers (observers) "
        "| topic level changes per peer-step |",
        "|---" * 13 + "|",
    ]
    for r in rows:
        step, per = r["interval"], r.get("per_peer_step") or {}
        reader, age = r.get("delivery_seconds") or {}, r.get("group_age_at_fetch_seconds") or {}
        observed = r.get("observed_delivery") or {}
        lines.append(
            f"| {r['peers']} | {step:.1f} | {_pair(reader, '{:.1f}')} | {_ratio(reader, step)} "
            f"| {_pair(observed, '{:.1f}', 'latency_median_s', 'latency_p95_s')} "
            f"| {_ratio(observed, step, 'latency_median_s', 'latency_p95_s')} "
            f"| {_pair(age, '{:.1f}')} | {_ratio(age, step)} "
            f"| {per.get('announcements_received', 0):.1f} / {per.get('announcements_sent', 0):.1f} "
            f"| {per.get('index_reads', 0):.2f} / {per.get('index_stores', 0):.2f} "
            f"| {per.get('hedged_fetches', 0):.2f} | {_levels(r)} | {per.get('topic_level_changes', 0):.2f} |"
        )
    kinds = sorted({k for r in rows for k in r.get("rpc_bytes_per_peer_step", {}) if not k.endswith("/calls")})
    if kinds:  # --rpc-bytes: where the bytes go, as the DHT servers among the peers saw them
        lines += [
            "",
            "## RPC bytes, KB per peer per step (--rpc-bytes; protobuf sizes, before TLS/yamux framing)",
            "",
            "| N | " + " | ".join(kinds) + " | total | find / store / ping / served calls |",
            "|---" * (len(kinds) + 3) + "|",
        ]
        for r in rows:
            rpc = r.get("rpc_bytes_per_peer_step", {})
            calls = " / ".join(f"{rpc.get(f'rpc_{name}/calls', 0):.1f}" for name in ("find", "store", "ping", "served"))
            total = sum(rpc.get(k, 0) for k in kinds)
            cells = " | ".join(f"{rpc.get(k, 0) / 1e3:.1f}" for k in kinds)
            lines.append(f"| {r['peers']} | {cells} | {total / 1e3:.1f} | {calls} |")
    lines += ["", *report["notes"]]
    write_report(out, "swarm_transport", report, lines)

    plt = pyplot()
    ns = [r["peers"] for r in rows]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
    for key, label in [
        ("record_lookup_seconds", "record lookup"),
        ("index_read_seconds", "index read"),
        ("store_seconds", "store"),
    ]:
        ax1.plot(ns, [r[key]["median"] for r in rows], "o-", label=f"{label} median")
        ax1.plot(ns, [r[key]["p95"] for r in rows], "x--", label=f"{label} p95")
    ax1.set_ylabel("seconds (background thread)")
    ax1.set_title(f"Background DHT operations (J={report['j']})")
    delivery = [r.get("observed_delivery") or {} for r in rows]
    for key, label in [("latency_median_s", "median"), ("latency_p95_s", "p95")]:
        ax2.plot(ns, [d.get(key) for d in delivery], "o-", label=f"observed delivery {label}")
    ax2.plot(ns, [r["interval"] for r in rows], "k:", label="step interval")
    ax2.set_ylabel("seconds")
    ax2.set_title("Delivery latency (creation to first fetch by an observer)")
    ax3.plot(ns, [r["python_cpu_seconds_per_peer_step"] * 1e3 for r in rows], "o-", label="CPU ms python")
    ax3.plot(ns, [r["p2pd_cpu_seconds_per_peer_step"] * 1e3 for r in rows], "o-", label="CPU ms p2pd")
    ax3.plot(ns, [r["p2pd_io_bytes_per_peer_step"] / 1e3 for r in rows], "s--", label="p2pd I/O KB")
    ax3.plot(ns, [r["tcp_bytes_per_peer_step"] / 1e3 for r in rows], "s--", label="TCP KB sent + received")
    ax3.set_ylabel("per peer per step")
    ax3.set_title("Cost per peer per step")
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("peers N")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "swarm_transport.png", dpi=120)
    plt.close(fig)


NOTES = [
    "- Load per peer held constant: a step lasts max(interval, N x per-peer seconds) (column 'interval s'), so the",
    "  swarm makes the same number of steps per second at every N and each peer does the same work per step",
    "  (publish one record, fetch J groups). Costs per peer per step are therefore comparable across N.",
    "- CPU s/peer/step: CPU seconds over the measured time divided by the steps actually done; Python is the",
    "  workers' (a worker's Python is shared by its peers, so its total is divided by their steps), p2pd the",
    "  daemons'. It includes the background work that runs per second, not per step (polls every 1 s, the",
    "  neighbour check every 10 s, libp2p keep-alives): a longer interval adds that much per step. swarm CPU cores:",
    "  all peers' CPU seconds over the measured seconds (the observers' excluded).",
    "- p2pd I/O: bytes the peers' p2pd read + wrote in system calls (TCP to other peers plus the unix socket to",
    "  their Python), less twice the TCP bytes exchanged with the observers (serving an observer's lookup), over the",
    "  steps done; / payload: over the bytes the peers published + fetched. TCP: bytes sent + received on the peers'",
    "  TCP sockets to other peers (ss -tinp at the start and the end; observer sockets excluded). network / payload:",
    "  half of it (each byte is sent by one peer and received by another) over the payload. A record served by",
    "  its publisher (serve_records, the default) crosses the network once per fetching peer, so with published =",
    "  fetched the floor is 1 / 2 = 0.5x before TLS/yamux framing, RPC envelopes, index reads and stores, and",
    "  lookups' neighbour lists; stored in the DHT (serve_records=False) it is also sent to dht_num_replicas = 2",
    "  replicas (the publisher may be one), a floor of (2 + 1) / 2 = 1.5x. p2pd I/O counts each byte again on the",
    "  unix socket (about twice the TCP bytes).",
    "- RPC bytes (--rpc-bytes): the protobuf sizes of the find/store/ping requests the peers' DHT servers answered",
    "  and of their answers, by kind (a value of 8 KB or more is a record, a smaller one an index shard; 'nearest",
    "  peers' is the rest of a find answer, mostly the neighbours it names per key), and of the records the peers",
    "  fetched from their publishers ('served', counted at the fetching peer: key and answer); observers'",
    "  requests are left out. 'ping' includes the routing-table updates hivemind makes locally on every request",
    "  (no network). Framing (TLS, yamux, the unix socket) comes on top, so the total is below the TCP figure.",
    "- Observed delivery: 1-2 observer peers in their own process (client mode, not listed: they neither store",
    "  records nor change the swarm; subscribed to every announcement topic of their level) call fetch() every",
    "  0.25 s; a group's latency is the first fetch that returned it minus its creation time at the publisher (one",
    "  machine's clock; an upper bound by 0.25 s). Only groups created at least the delivery window before the end",
    "  count, so late groups are not censored; delivered share = share of those groups an observer saw, mean over",
    "  observers. Reader delivery: the reader's own 'delivery' timing at the consuming peers (record creation to",
    "  their cache). Age at use: at each consuming peer's fetch(J), now minus the creation of each group returned,",
    "  after its first two steps (as the fill rate: before them nothing was published, and the pace is unknown).",
    "- What bounds delivery (swarm/gossip.py, swarm/reader.py): a publisher announces each record on GossipSub as",
    "  soon as it serves it; every peer of its announcement topic (about topic_peers = 8 publishers each: 1 topic",
    "  up to N = 8, 8 at N = 64) hears it within a few round trips. A consuming peer learns the pace of its fetch()",
    "  calls and fetches the freshest records announced a lead time (refill_lead = 1 s, or twice the hedge time)",
    "  before its next call, so its delivery is the age of the freshest record at that moment plus a fetch, and its",
    "  age at use adds the lead. The index is read every index_refresh_interval (60 s), more often only while no",
    "  announcement arrives. Observers take everything their topics announce as it comes.",
    "- publish()/fetch(): time the caller spends (never on the network). store / record lookup / index read:",
    "  the background thread's operations (store: the index entries, plus the records with serve_records=False;",
    "  record lookup: all records one poll fetches, from their publishers or by DHT lookups). fill rate: groups",
    "  fetch(J) returned / J after the first steps.",
]
