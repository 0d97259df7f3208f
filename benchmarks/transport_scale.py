"""The transport at swarm sizes one machine cannot host (1,000 and 10,000 peers): bytes per peer and step, delivery
and age at use, with churn and with a swarm that starts at once, from the protocol's own message counts and the
per-message costs measured on loopback (no fitted curves).

What is counted, per peer and step of ``--step`` seconds (each network byte once):

- announcements: the peers of a reader's topic (:func:`swarm.levels.topic_level_for`: about ``topic_peers``) each
  announce one record per step; a subscriber's bytes per announcement are measured by
  ``benchmarks.transport_gossip_cost`` at that topic size (GossipSub's duplicates included);
- records: J groups a step, fetched from their publishers, at the bytes per record and request measured by
  ``benchmarks.swarm_transport`` (``--rpc-bytes``);
- the index: an entry stored every ``announce_interval`` at the levels :func:`swarm.levels.write_levels_for` gives,
  and ``index_shards_per_poll`` shards read every ``index_refresh_interval``. The find requests one lookup makes
  come from hivemind's own search (``hivemind.dht.traverse.traverse_dht``, beam ``dht_lookup_beam``) run over
  Kademlia routing tables of N random node ids (buckets of ``dht_bucket_size``), each request priced at the bytes
  per find answer measured on loopback, the shard values at the measured bytes per index entry;
- DHT upkeep (pings) at the rate per second measured on loopback; TLS and RPC framing at the ratio of network bytes
  to RPC bytes measured there.

Delivery and age at use: a Monte Carlo of one reader's topic (publishers out of phase, a one-way delay and a link
rate, the announcement's latency measured on loopback added), the reader refilling ``refill_lead`` before each step
with the freshest record announced. Churn: each peer leaves after an exponential lifetime (``--lifetime``) and is
replaced; a departed publisher's last record may be chosen until it missed two announcements, and its fetch fails
over to a hedge. A swarm that starts at once: every peer's first index write, at the levels its DHT-based prior
estimate of N gives (:func:`swarm.levels.size_from_distances` on the distances to its nearest node ids) against
every level from 0 (the former first write), with the bytes of the shards it lands in.

    python -m benchmarks.transport_scale --sizes 64 1000 10000
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS, percentile, record_lines, run_record, write_report

BITS = 160


# ------------------------------------------------------------------------------------------------ Kademlia lookups


def routing_tables(ids: list[int], bucket: int, rng: random.Random) -> dict[int, list[int]]:
    """A Kademlia routing table per node: for every prefix depth, up to ``bucket`` random nodes that share exactly
    that many leading bits with it (as hivemind's buckets hold them once a node has met the swarm)."""
    ordered = sorted(ids)
    tables: dict[int, list[int]] = {}
    for node in ids:
        table: list[int] = []
        for depth in range(BITS):
            width = 1 << (BITS - depth - 1)
            low = ((node >> (BITS - depth)) << (BITS - depth)) | (
                (~node >> (BITS - depth - 1) & 1) << (BITS - depth - 1)
            )
            start, end = bisect.bisect_left(ordered, low), bisect.bisect_left(ordered, low + width)
            if end > start:
                table += [ordered[i] for i in rng.sample(range(start, end), min(bucket, end - start))]
            own_low = (node >> (BITS - depth - 1)) << (BITS - depth - 1)
            own = bisect.bisect_left(ordered, own_low + (1 << (BITS - depth - 1))) - bisect.bisect_left(
                ordered, own_low
            )
            if own <= 1:  # nobody else shares this prefix: the deeper buckets are empty
                break
        tables[node] = table
    return tables


def lookup_requests(
    tables: dict[int, list[int]], origin: int, key: int, beam: int, workers: int, answer: int, holders: set[int]
) -> int:
    """Find requests one lookup of ``key`` from ``origin`` makes under hivemind's own search; a request to a node in
    ``holders`` (a fresh copy of the value) ends it, as a read with ``sufficient_expiration_time`` ends."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.traverse import traverse_dht

    requests = 0

    async def get_neighbors(peer: DHTID, queries: Any) -> dict:
        nonlocal requests
        requests += 1
        return {
            q: (
                tuple(DHTID(n) for n in sorted(tables[int(peer)], key=lambda n: n ^ int(q))[:answer]),
                int(peer) in holders,
            )
            for q in queries
        }

    query = DHTID(key)
    initial = [DHTID(n) for n in sorted(tables[origin], key=lambda n: n ^ key)[:beam]]
    asyncio.run(traverse_dht([query], initial, beam, workers, 1, get_neighbors, visited_nodes={query: {DHTID(origin)}}))
    return requests


def lookup_counts(peers: int, samples: int, config: Any, rng: random.Random) -> dict[str, float]:
    """Mean find requests per index read (ends at a replica) and per store traversal (to the beam's nearest), over
    ``samples`` random keys and origins in a swarm of ``peers`` random node ids."""
    ids = [rng.getrandbits(BITS) for _ in range(peers)]
    tables = routing_tables(ids, config.dht_bucket_size, rng)
    reads, stores = [], []
    for _ in range(samples):
        origin, key = rng.choice(ids), rng.getrandbits(BITS)
        replicas = set(sorted(ids, key=lambda n: n ^ key)[: config.dht_num_replicas]) - {origin}
        args = (tables, origin, key, config.dht_lookup_beam, 4, config.dht_bucket_size)
        reads.append(lookup_requests(*args, replicas))
        stores.append(lookup_requests(*args, set()))
    return {"read": statistics.fmean(reads), "store": statistics.fmean(stores)}


# ------------------------------------------------------------------------------------------------ measured costs


def measured_costs(transport: dict[str, Any], gossip: dict[str, Any], reference: int) -> dict[str, Any]:
    """Per-message costs from a ``swarm_transport`` run (its N = ``reference`` row, run with ``--rpc-bytes``) and a
    ``transport_gossip_cost`` run."""
    run = next(r for r in transport["runs"] if r["peers"] == reference)
    rpc, counters, per = run["rpc_bytes_per_peer_step"], run["counters"], run["per_peer_step"]
    finds = rpc.get("rpc_find/calls", 0) or 1
    stores = rpc.get("rpc_store/calls", 0) or 1
    served = rpc.get("rpc_served/calls", 0) or 1
    rpc_total = sum(v for k, v in rpc.items() if not k.endswith("/calls"))
    gossip_by_size = {r["topic_peers"]: r["network_bytes_per_message_per_subscriber"] for r in gossip["runs"]}
    topic = min(gossip_by_size, key=lambda t: abs(t - reference / 2 ** math.ceil(math.log2(max(reference / 8, 1)))))
    gossip_here = per.get("announcements_received", 0) * gossip_by_size[topic]
    network = run["tcp_bytes_per_peer_step"] / 2
    return {
        # a find request and its answer: the neighbours it names and the index values it carries (shards of a few
        # entries at any N: the levels are chosen for that)
        "find_request_bytes": sum(rpc.get(k, 0) for k in ("find/request", "find/nearest peers", "find/index values"))
        / finds,
        "store_request_bytes": (rpc.get("store/index values", 0) + rpc.get("store/rest", 0)) / stores,
        "entry_bytes": counters.get("index_bytes_read", 0) / max(counters.get("index_entries_read", 0), 1),
        "served_request_bytes": rpc.get("served/request", 0) / served,
        "ping_bytes_per_second": rpc.get("ping", 0) / run["interval"],
        "record_bytes": run["published_bytes_per_peer_step"],
        "framing": max(1.0, (network - gossip_here) / rpc_total) if rpc_total else 1.0,
        "gossip_bytes_by_topic_size": gossip_by_size,
        "gossip_latency_s": statistics.median(r["latency_median_s"] for r in gossip["runs"] if r["latency_median_s"]),
        "served_fetch_s": run["record_lookup_seconds"]["median"],
        "reference_peers": reference,
    }


def gossip_bytes(costs: dict[str, Any], topic: float) -> float:
    """A subscriber's bytes per announcement at a topic of ``topic`` peers (measured sizes, linear in between)."""
    sizes = sorted(costs["gossip_bytes_by_topic_size"].items())
    if topic <= sizes[0][0]:
        return sizes[0][1]
    for (t0, b0), (t1, b1) in zip(sizes, sizes[1:], strict=False):
        if topic <= t1:
            return b0 + (b1 - b0) * (topic - t0) / (t1 - t0)
    return sizes[-1][1] * topic / sizes[-1][0]  # beyond what was measured: as many more duplicates (an upper bound)


# ------------------------------------------------------------------------------------------------ the model


def steady_bytes(peers: int, costs: dict[str, Any], config: Any, lookups: dict[str, float], args: Any) -> dict:
    """Network bytes per peer and step by kind, in a swarm of ``peers`` whose estimates of N are right."""
    from swarm.levels import topic_level_for, write_levels_for

    step, framing = args.step, costs["framing"]
    topic = peers / 2 ** topic_level_for(peers, config)
    records = math.ceil(args.j / args.groups_per_record)
    levels = len(write_levels_for(peers, config))
    store = levels * (
        lookups["store"] * costs["find_request_bytes"] + config.dht_num_replicas * costs["store_request_bytes"]
    )
    read = config.index_shards_per_poll * lookups["read"] * costs["find_request_bytes"]
    stale = 1 + config.record_ttl / args.lifetime if args.lifetime else 1.0  # departed peers' entries until expiry
    kinds = {
        "announcements": topic * gossip_bytes(costs, topic),
        "records": records * (costs["record_bytes"] + costs["served_request_bytes"] * framing),
        "index stores": step / config.announce_interval * store * framing,
        "index reads": step / config.index_refresh_interval * read * stale * framing,
        "DHT upkeep": costs["ping_bytes_per_second"] * step * framing,
    }
    if args.lifetime:  # a newcomer per lifetime: its bootstrap lookup, first read and first store
        kinds["joins"] = (
            step / args.lifetime * (lookups["store"] * costs["find_request_bytes"] + read + store) * framing
        )
    payload = costs["record_bytes"] * (1 + records)  # published + fetched, as benchmarks.swarm_transport counts it
    total = sum(kinds.values())
    return {"topic_peers": topic, "bytes": kinds, "total": total, "payload": payload, "ratio": total / payload}


def delivery(topic: int, args: Any, costs: dict[str, Any], lifetime: float | None, rng: random.Random) -> dict:
    """Monte Carlo of one reader in a topic of ``topic`` publishers (itself included) over ``args.mc_steps`` steps."""
    step, delay = args.step, args.one_way_delay
    transfer = costs["record_bytes"] * 8 / args.link_bits_per_second
    fetch = 2 * delay + transfer + costs["served_fetch_s"]
    hedge = max(0.25, 1.5 * fetch)
    lead = max(args.refill_lead, 2 * hedge)
    announce = delay + costs["gossip_latency_s"]
    others = topic - 1
    phase = [rng.uniform(0, step) for _ in range(others)]
    leaves = [rng.expovariate(1 / lifetime) if lifetime else math.inf for _ in range(others)]
    reader_phase = rng.uniform(0, step)
    deliveries, ages, hedges, taken = [], [], 0, 0
    for k in range(2, args.mc_steps):
        take = k * step + reader_phase
        refill = take - lead
        candidates = []  # (created, publisher) of the records known at the refill, newest first
        for i in range(others):
            if leaves[i] < refill - 2 * step - 3:  # missed two announcements: dropped
                phase[i], leaves[i] = rng.uniform(0, step), refill + rng.expovariate(1 / lifetime)  # a newcomer
                continue
            created = refill - announce - ((refill - announce - phase[i]) % (step * rng.uniform(0.95, 1.05)))
            if created <= leaves[i]:
                candidates.append((created, i))
        candidates.sort(reverse=True)
        if not candidates:
            continue
        created, publisher = candidates[0]
        ready = refill + fetch
        if leaves[publisher] < refill and len(candidates) > 1:  # gone: no answer, hedged to the next freshest
            hedges += 1
            created, _ = candidates[1]
            ready = refill + hedge + fetch
        taken += 1
        deliveries.append(ready - created)
        ages.append(max(take, ready) - created)
    return {
        "delivery_median_s": statistics.median(deliveries),
        "delivery_p95_s": percentile(deliveries, 0.95),
        "age_median_s": statistics.median(ages),
        "age_p95_s": percentile(ages, 0.95),
        "fill_rate": taken / (args.mc_steps - 2),
        "hedged_share": hedges / max(taken, 1),
        "lead_s": lead,
    }


def start_at_once(
    peers: int, costs: dict[str, Any], config: Any, lookups: dict[str, float], rng: random.Random
) -> dict:
    """Every peer's first index write when all start together: at the levels of its prior estimate, or (formerly) at
    every level; bytes of the shards it lands in once everyone has written."""
    from swarm.levels import size_from_distances, write_levels_for

    ids = [rng.getrandbits(BITS) for _ in range(peers)]
    priors = []
    for node in rng.sample(ids, min(peers, 200)):  # each peer's prior, from the distances to its nearest ids
        priors.append(size_from_distances([node ^ other for other in ids if other != node], config.dht_bucket_size))
    counts: dict[str, dict[int, float]] = {"prior": {}, "every level": {}}
    levels_of = {
        "prior": [write_levels_for(p, config) for p in priors],
        "every level": [write_levels_for(None, config)],
    }
    for name, ranges in levels_of.items():
        for levels in ranges:
            for level in levels:
                counts[name][level] = counts[name].get(level, 0) + peers / len(ranges)
    out = {"prior_over_true": [p / peers for p in priors if p]}
    for name, per_level in counts.items():
        cost = 0.0
        for levels in levels_of[name]:
            for level in levels:
                # the replicas on a store's way answer with the whole shard: beyond the usual few entries (in the
                # measured find cost), each entry more costs its bytes per replica
                extra = max(0.0, per_level[level] / (config.index_shards << level) - config.index_shard_entries)
                cost += lookups["store"] * costs["find_request_bytes"] + config.dht_num_replicas * (
                    costs["store_request_bytes"] + extra * costs["entry_bytes"]
                )
        cost = cost / len(levels_of[name]) * costs["framing"]
        out[name] = {
            "first_write_bytes": cost,
            "largest_shard_entries": max(v / (config.index_shards << lvl) for lvl, v in per_level.items()),
            "levels_written": statistics.fmean(len(levels) for levels in levels_of[name]),
        }
    return out


# ------------------------------------------------------------------------------------------------ the report


def simulate(peers: int, costs: dict[str, Any], args: Any, rng: random.Random) -> dict[str, Any]:
    """Every figure at one swarm size."""
    from swarm.config import DHTTransportConfig

    config = DHTTransportConfig()
    lookups = lookup_counts(peers, args.lookups, config, rng)
    calm = argparse.Namespace(**{**vars(args), "lifetime": None})
    topic = max(2, round(steady_bytes(peers, costs, config, lookups, calm)["topic_peers"]))
    return {
        "peers": peers,
        "find_requests_per_lookup": lookups,
        "steady": steady_bytes(peers, costs, config, lookups, calm),
        "churn": steady_bytes(peers, costs, config, lookups, args),
        "delivery": delivery(topic, args, costs, None, rng),
        "delivery_churn": delivery(topic, args, costs, args.lifetime, rng),
        "start_at_once": start_at_once(peers, costs, config, lookups, rng),
    }


def model_check(transport: dict[str, Any], costs: dict[str, Any], args: Any, rng: random.Random) -> dict[str, Any]:
    """The model at the loopback run's own N and step, beside what that run measured (network bytes per peer-step
    over the payload): how far the model's accounting is from the real one where both exist."""
    from swarm.config import DHTTransportConfig

    run = next(r for r in transport["runs"] if r["peers"] == args.reference)
    config = DHTTransportConfig()
    at_reference = argparse.Namespace(**{**vars(args), "step": run["interval"], "lifetime": None})
    lookups = lookup_counts(args.reference, args.lookups, config, rng)
    model = steady_bytes(args.reference, costs, config, lookups, at_reference)
    return {
        "peers": args.reference,
        "step": run["interval"],
        "model": model["ratio"],
        "measured": run["network_to_payload"],
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Simulate each size and write transport_scale.{json,md}."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.transport_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 1000, 10000], help="swarm sizes")
    parser.add_argument("--step", type=float, default=30.0, help="seconds of every peer's step")
    parser.add_argument("--j", type=int, default=4, help="external groups a peer takes per step")
    parser.add_argument("--groups-per-record", type=int, default=4, help="groups a peer publishes per step")
    parser.add_argument("--lifetime", type=float, default=3600.0, help="mean seconds before a peer leaves (churn)")
    parser.add_argument("--one-way-delay", type=float, default=0.1, help="seconds between two peers")
    parser.add_argument("--link-bits-per-second", type=float, default=10e6, help="a peer's link rate")
    parser.add_argument("--refill-lead", type=float, default=1.0, help="DHTTransportConfig.refill_lead")
    parser.add_argument("--lookups", type=int, default=200, help="lookups simulated per size")
    parser.add_argument("--mc-steps", type=int, default=20000, help="steps of the delivery Monte Carlo")
    parser.add_argument("--reference", type=int, default=64, help="the loopback run's N that gives the costs")
    parser.add_argument("--transport", default=str(RESULTS / "swarm_transport.json"), help="a swarm_transport run")
    parser.add_argument("--gossip", default=str(RESULTS / "transport_gossip_cost.json"), help="a gossip cost run")
    parser.add_argument("--results-dir", default=str(RESULTS), help="where the outputs go")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    transport = json.loads(Path(args.transport).read_text())
    costs = measured_costs(transport, json.loads(Path(args.gossip).read_text()), args.reference)
    rng = random.Random(args.seed)
    runs = []
    for peers in args.sizes:
        print(f"transport_scale: N={peers} ...", flush=True)
        runs.append(simulate(peers, costs, args, rng))
    report = {
        **run_record(),
        "settings": vars(args),
        "costs": costs,
        "check": model_check(transport, costs, args, rng),
        "runs": runs,
    }
    write_report(Path(args.results_dir), "transport_scale", report, report_lines(report))
    return report


def report_lines(report: dict[str, Any]) -> list[str]:
    """The markdown page of a run."""
    s, c = argparse.Namespace(**report["settings"]), report["costs"]
    lines = [
        "# The transport at 1,000 and 10,000 peers (protocol message counts x measured costs)",
        "",
        *record_lines(report),
        f"Setup: steps of {s.step:g} s, J = {s.j} groups taken and one record of {s.groups_per_record} groups "
        f"published per step; costs per message from the loopback runs {Path(s.transport).name} (N = "
        f"{s.reference}) and {Path(s.gossip).name}; {s.lookups} lookups per size under hivemind's search; one-way "
        f"delay {s.one_way_delay * 1e3:.0f} ms, links of {s.link_bits_per_second / 1e6:g} Mbit/s; churn: every peer "
        f"leaves after a mean {s.lifetime / 3600:g} h and is replaced.",
        "",
        "## Bytes per peer per step (network, each byte once)",
        "",
        "| N | topic peers | announcements KB | records KB | index stores KB | index reads KB | DHT upkeep KB "
        "| total KB | / payload | with churn: total KB, / payload | find requests per read / store |",
        "|---" * 11 + "|",
    ]
    for r in report["runs"]:
        b, churn = r["steady"]["bytes"], r["churn"]
        lines.append(
            f"| {r['peers']} | {r['steady']['topic_peers']:.1f} | {b['announcements'] / 1e3:.1f} "
            f"| {b['records'] / 1e3:.1f} | {b['index stores'] / 1e3:.1f} | {b['index reads'] / 1e3:.1f} "
            f"| {b['DHT upkeep'] / 1e3:.1f} | {r['steady']['total'] / 1e3:.1f} | {r['steady']['ratio']:.2f}x "
            f"| {churn['total'] / 1e3:.1f}, {churn['ratio']:.2f}x "
            f"| {r['find_requests_per_lookup']['read']:.1f} / {r['find_requests_per_lookup']['store']:.1f} |"
        )
    check = report["check"]
    lines += [
        "",
        f"Check against the loopback run itself (N = {check['peers']}, its {check['step']:g} s step): the model gives "
        f"{check['model']:.2f}x the payload, the run measured {check['measured']:.2f}x.",
        "",
        "## Delivery and age at use (one reader's topic, Monte Carlo)",
        "",
        "| N | delivery s median / p95 | / step | age at use s median / p95 | / step | fill rate "
        "| with churn: delivery p95, age p95 s, fill rate, hedged share |",
        "|---" * 7 + "|",
    ]
    for r in report["runs"]:
        d, dc = r["delivery"], r["delivery_churn"]
        lines.append(
            f"| {r['peers']} | {d['delivery_median_s']:.1f} / {d['delivery_p95_s']:.1f} "
            f"| {d['delivery_median_s'] / s.step:.2f} / {d['delivery_p95_s'] / s.step:.2f} "
            f"| {d['age_median_s']:.1f} / {d['age_p95_s']:.1f} "
            f"| {d['age_median_s'] / s.step:.2f} / {d['age_p95_s'] / s.step:.2f} | {d['fill_rate']:.2f} "
            f"| {dc['delivery_p95_s']:.1f}, {dc['age_p95_s']:.1f}, {dc['fill_rate']:.2f}, {dc['hedged_share']:.3f} |"
        )
    lines += [
        "",
        "## A swarm that starts at once: every peer's first index write",
        "",
        "| N | prior / true N (10th, 50th, 90th pct) | levels written: prior / every level "
        "| largest shard entries: prior / every level | first write KB: prior / every level |",
        "|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        st = r["start_at_once"]
        ratios = sorted(st["prior_over_true"])
        pct = " / ".join(f"{percentile(ratios, q):.2f}" for q in (0.1, 0.5, 0.9))
        p, e = st["prior"], st["every level"]
        lines.append(
            f"| {r['peers']} | {pct} | {p['levels_written']:.1f} / {e['levels_written']:.0f} "
            f"| {p['largest_shard_entries']:.0f} / {e['largest_shard_entries']:.0f} "
            f"| {p['first_write_bytes'] / 1e3:.1f} / {e['first_write_bytes'] / 1e3:.1f} |"
        )
    lines += [
        "",
        f"Measured costs used: find request and answer {c['find_request_bytes']:.0f} B, store request "
        f"{c['store_request_bytes']:.0f} B, index entry {c['entry_bytes']:.0f} B, record {c['record_bytes'] / 1e3:.1f}"
        f" KB, DHT upkeep {c['ping_bytes_per_second']:.0f} B/s, framing x{c['framing']:.2f}, a subscriber's bytes per "
        "announcement by topic size "
        + ", ".join(f"{t}: {b:.0f} B" for t, b in sorted(c["gossip_bytes_by_topic_size"].items()))
        + f", announcement latency {c['gossip_latency_s'] * 1e3:.1f} ms, "
        f"served fetch {c['served_fetch_s'] * 1e3:.0f} ms (loopback).",
        "",
        "Assumptions: every peer's estimate of N is right in the steady state (the DHT prior alone is within the "
        "percentiles shown; the index estimate is better), so a topic holds N / 2**level peers and the index entry "
        "goes to the levels for N; routing tables are full (every bucket holds its share of random ids); a lookup's "
        "find answers are priced alike at every N (as measured: ten neighbours and the values of shards of a few "
        "entries) and a read ends at the first replica it asks; "
        "GossipSub's duplicates per subscriber are those measured at that topic size (the topics stay at most "
        "topic_peers large at any N, so no extrapolation is needed); the index entries of departed peers stay until "
        "their ttl, making index reads longer by record_ttl / lifetime; a newcomer's join costs a lookup, a read and a "
        "store; every record is fetched from its publisher over a link of the rate given, with the loopback fetch time "
        "added. Not modelled: loss and retransmission, NAT traversal and relays, CPU, the transient while estimates "
        "converge after a start at once (the DHT prior is used from the first write), hostile peers.",
    ]
    return lines


if __name__ == "__main__":
    main()
