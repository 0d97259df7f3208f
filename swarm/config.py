"""Settings of one peer's DHT transport, each documented once (its help), and the multiaddr check they use."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

from swarm.field_docs import document_fields
from swarm.records import RecordLimits

MULTIADDR_FORM = "/ip4/1.2.3.4/tcp/31337/p2p/Qm..."
"""The shape of a joinable multiaddr, shown in error messages."""

_SECTIONS = {
    "Swarm membership": (
        "swarm_name", "initial_peers", "rejoin_peers", "host_maddrs", "announce_maddrs", "identity_path",
        "signing_key_path", "check_identity_free", "client_mode", "use_relay", "use_auto_relay", "nat_traversal",
        "join_timeout",
        "wait_timeout",
        "dht_cache_nearest", "dht_cache_locally", "dht_num_replicas", "dht_record_lookup_workers", "dht_lookup_beam",
        "dht_bucket_size",
    ),
    "Closed swarm": (
        "membership_path", "membership_operator",
    ),
    "Records": (
        "model_name", "serve_records", "limits", "record_ttl", "index_shards", "index_max_level", "index_records",
        "max_pending_publishes", "store_timeout", "announce", "announce_interval",
    ),
    "Announcements": (
        "gossip", "topic_peers", "subscribe_topics", "departed_after_missed",
    ),
    "Fetching": (
        "prefetch_groups", "max_cached_groups", "max_cached_chars", "refill_lead", "poll_interval",
        "index_refresh_interval", "index_min_interval", "index_shards_per_poll", "index_shard_entries",
        "index_staleness", "rejoin_interval", "rejoin_max_interval", "fetch_timeout", "clock_skew_tolerance",
    ),
    "An open swarm's bounds": (
        "refill_sender_share", "refill_unjudged_share", "refill_group_bytes", "max_unknown_senders",
        "index_only_sender_share", "max_senders_per_host", "fetch_heard_within", "fetch_retry_after",
        "store_budget_bytes", "store_budget_values", "store_budget_host_peers", "dht_storage_bytes",
        "dht_storage_values", "dht_key_subkeys", "find_budget_bytes",
    ),
    "Process hygiene": (
        "state_dir", "health_interval", "check_reachability",
    ),
}  # fmt: skip


@document_fields(_SECTIONS)
@dataclass
class DHTTransportConfig:
    """Settings of a :class:`~swarm.dht.DHTTransport`, one peer's transport over the hivemind DHT."""

    swarm_name: str = field(
        default="sapo",
        metadata={"help": "Prefix of every DHT key; peers with different names ignore each other's records."},
    )
    initial_peers: list[str] = field(
        default_factory=list,
        metadata={
            "help": f"Multiaddrs of peers to join, e.g. `{MULTIADDR_FORM}` (a peer prints its own on start). Empty: "
            "start a new swarm."
        },
    )
    rejoin_peers: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Multiaddrs (with `/p2p/`) this peer dials whenever it has no DHT neighbour, besides the initial "
            "peers and the peers it met. A peer that started alone because no initial peer answered passes them "
            "here, so that it joins them once one comes up."
        },
    )
    host_maddrs: list[str] = field(
        default_factory=lambda: ["/ip4/127.0.0.1/tcp/0"],
        metadata={
            "help": "Multiaddrs to listen on. The default accepts peers of this machine only; use "
            "`/ip4/0.0.0.0/tcp/31337` to accept peers from other machines."
        },
    )
    announce_maddrs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Multiaddrs other peers should dial (e.g. a public IP behind port forwarding); explicit ports "
            "only. None: the addresses listened on."
        },
    )
    identity_path: str | None = field(
        default=None,
        metadata={
            "help": "File with the libp2p identity (created if missing) so that the peer id survives restarts. The "
            "record signing key is kept next to it (see signing_key_path). None: a fresh identity."
        },
    )
    signing_key_path: str | None = field(
        default=None,
        metadata={
            "help": "PEM file (mode 0600) of the RSA key that signs records; other peers see this peer as a "
            "fingerprint of it. None: identity_path + '.signing.pem', or a fresh key without identity_path."
        },
    )
    check_identity_free: bool = field(
        default=True,
        metadata={"help": "When joining with an existing identity file, check first that no other peer uses it."},
    )
    client_mode: bool = field(
        default=False,
        metadata={
            "help": "Do not serve DHT requests (for peers others cannot dial); the peer still publishes and fetches. "
            "A peer that finds itself unreachable switches to it by itself (check_reachability)."
        },
    )
    use_relay: bool = field(
        default=True, metadata={"help": "Allow reaching peers behind NAT through libp2p circuit relays."}
    )
    use_auto_relay: bool = field(
        default=False, metadata={"help": "Look for relays to become reachable when this peer is behind NAT."}
    )
    nat_traversal: bool | None = field(
        default=None,
        metadata={
            "help": "Ask the local router to forward a port to this peer (UPnP, NAT-PMP: multicast and gateway "
            "requests) and let peers tell it whether it is reachable (libp2p AutoNAT). None: on unless every "
            "host_maddrs address is a loopback one, so that a peer of this machine only sends nothing off it."
        },
    )
    join_timeout: float = field(
        default=30.0,
        metadata={"help": "Seconds allowed for starting the daemon and contacting the initial peers."},
    )
    wait_timeout: float = field(
        default=3.0,
        metadata={"help": "Seconds hivemind waits for one RPC answer before it deems the peer unresponsive."},
    )
    dht_cache_nearest: int = field(
        default=0,
        metadata={
            "help": "hivemind's `cache_nearest`: after a lookup finds a value, how many of the nodes nearest the key "
            "that lacked it are sent a copy (hivemind's default: 1). Each copy of a record costs a whole record's "
            "bytes, and a record is fetched once per reader: 0 sends none."
        },
    )
    dht_cache_locally: bool = field(
        default=False,
        metadata={
            "help": "hivemind's `cache_locally`: keep a copy of every value this peer looked up (hivemind's default: "
            "True). hivemind answers other peers' lookups from that cache too, so with it every peer that read an "
            "index shard hands the whole shard to every lookup and store passing by (most of the index bytes at "
            "N = 32); a record is fetched once and an index shard is wanted fresh, so nothing is gained by keeping "
            "them."
        },
    )
    dht_num_replicas: int = field(
        default=2,
        metadata={
            "help": "hivemind's `num_replicas`: how many nodes nearest a key store each record and index entry "
            "(hivemind's default: 5). Every replica receives a whole record, so a publisher sends this many copies; "
            "2 keeps a record readable when one of its holders leaves within the record ttl."
        },
    )
    dht_record_lookup_workers: int = field(
        default=1,
        metadata={
            "help": "hivemind's `num_workers` for record lookups: find RPCs in flight at once (hivemind's default: 4). "
            "Each replica among them answers with the whole record and the lookup keeps one; 1 asks one node at a "
            "time (a hop more of latency when a node is slow, one copy of the record on the wire)."
        },
    )
    dht_lookup_beam: int = field(
        default=8,
        metadata={
            "help": "hivemind's `beam_size` for this peer's lookups and stores: the nodes nearest a key a lookup keeps "
            "asking. hivemind's default (its bucket size, 20) makes a store or an unfinished lookup ask nearly every "
            "node of a swarm of a few dozen, each answering with 20 neighbours per key and any value it holds: a cost "
            "per step that grows with N. A few more than `dht_num_replicas` finds the replicas in O(log N) hops."
        },
    )
    dht_bucket_size: int = field(
        default=10,
        metadata={
            "help": "hivemind's `bucket_size` (Kademlia's k): the routing table's bucket size, and how many neighbours "
            "of each key a node names in every lookup answer (hivemind's default: 20, about 2 KB per key and answer; "
            "10 halves that, and the neighbours named were the largest cost left at N = 32)."
        },
    )
    membership_path: str | None = field(
        default=None,
        metadata={
            "help": "A membership file signed by the swarm's operator (`python -m swarm.membership sign`): the swarm "
            "is closed to its members, whose announcements, index entries and records alone are accepted (others' "
            "are counted as rejected/not_member), and a peer not listed refuses to start. None: an open swarm."
        },
    )
    membership_operator: str | None = field(
        default=None,
        metadata={
            "help": "The id of the operator key that must have signed membership_path (`python -m swarm.membership "
            "id --key OPERATOR.pem` prints it); required with membership_path."
        },
    )
    model_name: str = field(default="", metadata={"help": "Model name this peer advertises in the index."})
    serve_records: bool = field(
        default=True,
        metadata={
            "help": "Serve this peer's records from its own p2pd (swarm.served): its index entry names its libp2p "
            "id, a reader fetches each record in one request from it, and only the index is stored in the DHT. "
            "A record then lives as long as its publisher. False (and always in client_mode, whose peers others "
            "cannot dial): records are stored in the DHT on dht_num_replicas peers and found by a lookup, which "
            "sends dht_num_replicas copies and costs each reader a lookup's hops (about 2x the bytes per step "
            "at N = 64)."
        },
    )
    limits: RecordLimits = field(
        default_factory=RecordLimits,
        metadata={"help": "Size limits enforced on published and received records (swarm.records.RecordLimits)."},
    )
    record_ttl: float = field(
        default=600.0,
        metadata={
            "help": "Seconds a published record (and index entry) lives in the DHT. Records stored here to live "
            "longer (by more than a minute plus the clock tolerance) are refused as `ttl_too_long`, so every peer of "
            "a swarm should use the same value."
        },
    )
    index_shards: int = field(
        default=8,
        metadata={
            "help": "Number of index keys of the index's level 0 (level l has index_shards * 2**l); every peer of a "
            "swarm must use the same value."
        },
    )
    index_max_level: int = field(
        default=10,
        metadata={
            "help": "Highest level of the index. Each level lists the peers again over twice as many shards as the "
            "level below, so that a reader finds a level whose shards hold about index_shard_entries entries up to "
            "N = index_shards * 2**index_max_level * index_shard_entries peers; a publisher writes its entry to "
            "O(log N) levels. Every peer of a swarm must use the same value (the validator recognises index keys "
            "by it)."
        },
    )
    index_records: int = field(
        default=8,
        metadata={"help": "Record references a peer keeps in its index entry (at most limits.max_index_records)."},
    )
    max_pending_publishes: int = field(
        default=16,
        metadata={
            "help": "Records waiting to be stored; when full, the oldest is dropped (counted as publish_dropped)."
        },
    )
    store_timeout: float = field(
        default=30.0, metadata={"help": "Seconds one background store may take before it counts as a failure."}
    )
    announce: bool = field(
        default=True,
        metadata={
            "help": "Announce this peer and store its index entry on joining and every announce_interval seconds, so "
            "that others list it before its first records. A peer that only relays (a bootstrap peer) or watches "
            "sets False and stays unlisted."
        },
    )
    announce_interval: float = field(
        default=60.0,
        metadata={
            "help": "Seconds between two stores of this peer's index entry (listing its newest records, for late "
            "joiners and peers()); with gossip, a peer that published nothing for this long also announces that it is "
            "still here. Without gossip the entry is stored at every publication too."
        },
    )
    gossip: bool = field(
        default=True,
        metadata={
            "help": "Announce each new record at once by GossipSub (p2pd's pubsub, swarm.gossip) on this peer's "
            "announcement topics, and take the announcements of the peers of its topic, so that readers learn of "
            "fresh records within a round trip instead of at their next index read. False: records are found "
            "through the index alone (read every index_min_interval while no record is known to fetch)."
        },
    )
    topic_peers: int = field(
        default=8,
        metadata={
            "help": "Peers per announcement topic: a swarm of N peers has 2**level topics with level the lowest that "
            "puts at most this many in each (swarm.levels). A peer hears the announcements of its topic's peers, "
            "each several times over GossipSub's mesh (its duplicates), so its cost per step grows with this; "
            "every peer of a swarm should use the same value."
        },
    )
    subscribe_topics: int = field(
        default=1,
        metadata={
            "help": "Announcement topics of its level this peer subscribes to: its home topic and the next ones "
            "(more senders to choose from, at the cost of each topic's announcements); 0: every topic of the level "
            "(a peer that watches the whole swarm)."
        },
    )
    departed_after_missed: int = field(
        default=2,
        metadata={
            "help": "A peer that missed this many of its announcements (silent for that many times its usual gap "
            "between them, at most announce_interval) is taken as departed: its records are no longer chosen and it "
            "is not listed, without waiting for its entry to expire. It is back when it is heard from again."
        },
    )
    prefetch_groups: int = field(
        default=16,
        metadata={
            "help": "Groups of other peers the background poller keeps cached for fetch(); about twice the external "
            "groups taken per step."
        },
    )
    max_cached_groups: int = field(
        default=256, metadata={"help": "Cap of the fetch cache; the oldest groups are dropped beyond it."}
    )
    max_cached_chars: int = field(
        default=32 * 2**20,
        metadata={
            "help": "Cap of the fetch cache's text (prompts and completions, in characters): beyond it the oldest "
            "groups of the sender holding the most text are dropped, as beyond `max_cached_groups` those of the sender "
            "holding the most groups. A group may hold 64 completions of 32,768 characters: counted in groups alone, "
            "the cache could hold half a gigabyte of one sender's text. Default 32 Mi characters (an honest group of "
            "8 completions holds a few thousand)."
        },
    )
    refill_lead: float = field(
        default=1.0,
        metadata={
            "help": "Once the reader knows the pace of fetch() calls, it fetches the freshest records for the next "
            "call this many seconds before it is due (or twice the hedge time of a fetch, if longer), so that the "
            "groups taken are as young as the fetch allows."
        },
    )
    poll_interval: float = field(default=1.0, metadata={"help": "Seconds between two background polls."})
    index_refresh_interval: float = field(
        default=60.0,
        metadata={
            "help": "Read the index at least this often, even when the cache is full (keeps peers() current). "
            "Otherwise it is read only when the cache needs groups: a read while the cache is full fetches nothing, "
            "so it costs index bytes without making the groups taken any fresher."
        },
    )
    index_min_interval: float = field(
        default=2.0,
        metadata={"help": "Read the index at most this often; in between, the poller fetches records it knows of."},
    )
    index_shards_per_poll: int = field(
        default=2,
        metadata={
            "help": "Index shards read per index read, in rotation, at the level the reader chooses (0: every shard "
            "of level 0, the whole index at every read: for small swarms and tests)."
        },
    )
    index_shard_entries: int = field(
        default=2,
        metadata={
            "help": "Index entries a reader wants per shard it reads: it estimates the swarm's size N from the "
            "entries its recent reads found and reads the level whose shards hold about this many, so an index read "
            "costs about index_shards_per_poll * index_shard_entries entries at any N."
        },
    )
    index_staleness: float = field(
        default=5.0,
        metadata={
            "help": "A copy of an index shard updated less than this many seconds ago ends the lookup; older copies "
            "(e.g. this peer's own cache) make hivemind search further replicas."
        },
    )
    rejoin_interval: float = field(
        default=10.0,
        metadata={
            "help": "Seconds between two checks of this peer's DHT neighbours. When none of those listed is "
            "connected they are pinged, and those gone are dropped (hivemind drops one only when a request to it "
            "fails). A peer that has lost all of them (its link was down, or every neighbour left) dials and pings "
            "the peers it knew, initial peers included, to rejoin (counted as rejoin_attempts and rejoins). After a "
            "failed attempt the wait doubles, up to rejoin_max_interval."
        },
    )
    rejoin_max_interval: float = field(
        default=60.0,
        metadata={
            "help": "Longest wait, in seconds, between two attempts of a peer alone to rejoin (the backoff's cap)."
        },
    )
    fetch_timeout: float = field(default=20.0, metadata={"help": "Seconds one background lookup may take."})
    clock_skew_tolerance: float = field(
        default=3.0,
        metadata={"help": "Seconds a record may be dated in the future; later ones are rejected as clock_skew."},
    )
    refill_sender_share: float = field(
        default=0.5,
        metadata={
            "help": "The share of a refill's groups one sender's records may cover (at least one group; swarm.refill): "
            "a record is counted with the groups it claims, at most this share of the refill for its sender, so a "
            "sender claiming many groups does not end the refill before other senders' records are fetched. "
            "Groups still wanted once every sender had its share go to senders judged good, beyond it."
        },
    )
    refill_unjudged_share: float = field(
        default=0.25,
        metadata={
            "help": "The share of a refill's groups that the senders not yet judged good (the node's verdicts on their "
            "groups, swarm.senders) cover together while a sender judged good offers a record (at least one group, "
            "never all): fresh identities cost nothing to make, so a thousand of them take no more than one. It is "
            "reserved for them, so that a newcomer is fetched, judged and earns a share of its own."
        },
    )
    refill_group_bytes: int = field(
        default=256 * 2**10,
        metadata={
            "help": "Bytes a record may take per group it is counted for in a refill (swarm.refill): a record counts "
            "for its claimed groups or its size over this, whichever is more, so a sender's large records cover its "
            "share sooner and one sender costs the refills before a take about its share of the take times this, "
            "not that many records of 3 MiB. A size is announced (a record of another size is refused) or estimated "
            "from the sender's records fetched. Default 256 KiB (a group of 8 completions of 1,024 characters "
            "takes about 8.5 KB; of 28,000 characters, about 224 KB)."
        },
    )
    max_unknown_senders: int = field(
        default=256,
        metadata={
            "help": "Senders not judged good that the reader keeps in its book (about 2 KB each). A new one beyond it "
            "evicts the least useful (counted as evicted_senders): one that stands badly, then one never judged, the "
            "one heard from longest ago first. Senders judged good are kept while they are heard from."
        },
    )
    index_only_sender_share: float = field(
        default=0.5,
        metadata={
            "help": "The part of max_unknown_senders (rounded down) kept for senders known from index entries alone, "
            "the rest for announced ones (a libp2p host published their announcement; one first found in the index "
            "is announced once it announces). Anyone may write index entries under fresh keys with no host vouching "
            "for them, and a peer that does not announce, or announces on topics this peer does not listen to, is "
            "known from the index alone. Either kind may use the other's free places; a new sender beyond "
            "max_unknown_senders evicts the least useful of the kind over its part. So index-only identities never "
            "evict an announced sender while the announced are within their part, nor announced identities an "
            "index-only one within its part. 0: index-only senders only use places the announced leave free; 1: "
            "the reverse."
        },
    )
    max_senders_per_host: int = field(
        default=4,
        metadata={
            "help": "Identities (record keys) one libp2p host may make known by announcements (a peer announces one); "
            "a further one is refused as rejected/too_many_identities while the others are in the book. 0: no cap."
        },
    )
    fetch_heard_within: float = field(
        default=10.0,
        metadata={
            "help": "Seconds after which a heard record that the next refill would fetch is fetched at once, rather "
            "than just before the caller's next fetch(): a served record lives only while its publisher serves it. "
            "Records heard and never fetched are counted as heard_never_fetched."
        },
    )
    fetch_retry_after: float = field(
        default=1.0,
        metadata={
            "help": "Seconds before a host serving a sender judged good is asked again after a failed request, "
            "doubling with each failure in a row up to 30 s (a host not judged good waits 30 s); also the first rest "
            "of a sender after a strike (a record refused or never served), doubling with each of its recent strikes."
        },
    )
    store_budget_bytes: int = field(
        default=16 * 2**20,
        metadata={
            "help": "Value bytes one libp2p peer's store requests may hold within 10 s (swarm.store_gate); a request "
            "beyond it is refused unverified (rejected/store_budget) and the peer rests as one whose stores are "
            "mostly refused does (30 s, doubling). Every valid value stored here is kept until it expires (about 11 "
            "minutes), so without it one peer storing well-signed records under fresh keys makes this node hold what "
            "its bandwidth carries. An honest peer stores here, within 10 s, one copy of each record it publishes "
            "(in client mode or without serve_records: one a training step, one record per step), its index entry "
            "(under 1 KiB on each of at most index_max_level + 1 levels, every announce_interval), with hivemind's "
            "cache_nearest one copy of each record it looked up (a few a step), and once, when it meets this node, "
            "the values it holds that this node should hold (one request, under hivemind's 4 MiB message cap). "
            "Records are at most limits.max_record_bytes (3 MiB) and usually tens of KiB: 16 MiB is five full-size "
            "records every 10 s, several times what a peer that publishes and reads a record a second stores."
        },
    )
    store_budget_values: int = field(
        default=1024,
        metadata={
            "help": "Values one libp2p peer's store requests may hold within 10 s, with store_budget_bytes; beyond "
            "it the peer rests the same way. Each value costs this node a signature check (0.1-0.3 ms) before it is "
            "kept; an honest peer stores a few records and index levels a step, or a handoff of what it holds "
            "for this node: 1024 is far above either and costs at most a few percent of a core."
        },
    )
    store_budget_host_peers: int = field(
        default=4,
        metadata={
            "help": "How many peers' budgets (store_budget_bytes and store_budget_values each, per 10 s) the libp2p "
            "peers of one host share (a host: the IPv4 address their connections come from, or the IPv6 /64; "
            "swarm.peer_hosts). Beyond it the host's stores are refused unverified (rejected/store_host_budget) until "
            "its 10 s window ends; no peer rests for it. A libp2p identity costs a key, so without it one machine "
            "taking a fresh identity for each budget's worth makes this node verify and keep what its bandwidth "
            "carries. Honest peers behind one NAT (or reaching this node through one relay) share it: 4 is room for "
            "several publishers' stores, a hoarder among them takes it from them for this node (not for the swarm). "
            "Peers of this machine (loopback: a swarm run on one machine) keep their own budgets only."
        },
    )
    dht_storage_bytes: int = field(
        default=256 * 2**20,
        metadata={
            "help": "Bytes of values this peer's DHT storage holds at most, and its cache the same: the bound on "
            "what the swarm's stores make it keep, whatever their number of senders (fresh libp2p identities are "
            "free, so a budget per sender bounds one identity only). When full (in bytes, or in keys: "
            "dht_storage_values), of the host whose stores hold the most (an IPv4 address, an IPv6 /64), the peer "
            "whose stores hold the most loses its value that expires first, again and again, so a hoarder, however "
            "many identities it takes on one host, evicts its own values before other hosts' small index entries. "
            "With serve_records the DHT holds index entries (KiBs); a client-mode publisher's records live here for "
            "record_ttl: 256 MiB holds a full-size record every 10 s of one publisher for 10 minutes, or typical "
            "records of dozens."
        },
    )
    dht_storage_values: int = field(
        default=16384,
        metadata={
            "help": "Keys this peer's DHT storage (and its cache) holds at most; beyond it, of the host whose stores "
            "hold the most values, the peer whose stores do loses its value that expires first (as for "
            "dht_storage_bytes): bounds hivemind's own bookkeeping (a few hundred bytes a key), which "
            "dht_storage_bytes does not count."
        },
    )
    dht_key_subkeys: int = field(
        default=1024,
        metadata={
            "help": "Subkeys one key's dictionary (an index shard: one entry a peer) holds at most in this peer's DHT "
            "storage, and in its cache: a store beyond it trims the key to 7/8 of it, the host holding the most of "
            "the key's subkeys (a peer of this machine, on loopback, alone) losing, of its peer holding the most, "
            "the subkey that expires first (dht_subkeys_trimmed). This peer also refuses, whole and before checking "
            "any entry, a dictionary of more items from another peer (no honest holder answers with more). 1024 is "
            "room for eight million peers at the index's top level (N / 8192 entries a shard; docs/trust.md, Index "
            "reads), about 0.8 MB of index entries an answer."
        },
    )
    find_budget_bytes: int = field(
        default=64 * 2**20,
        metadata={
            "help": "Value bytes this peer's answers to one libp2p peer's find requests may hold within 10 s "
            "(swarm.find_gate); a request arriving once they did is refused (rejected/find_budget) and the peer rests "
            "(30 s, doubling), as does one naming more than 4096 keys within 10 s; an answer holds at most what is "
            "left of it. A find request names at most 64 keys, each answered once, and an answer holds values only "
            "up to p2pd's 4 MiB message cap: without these one small request naming a large value many times made "
            "this node build hundreds of MiB. An honest reader fetches each record it wants once, from whichever "
            "peer holds it (records are at most limits.max_record_bytes, 3 MiB, and usually tens of KiB), and its "
            "index reads are a few KiB: 64 MiB is twenty full-size records from this node every 10 s."
        },
    )
    state_dir: str | None = field(
        default=None,
        metadata={
            "help": "Directory for a small state file with the p2pd pid and socket paths, so that the next start "
            "with the same directory removes what a killed (kill -9) process left behind."
        },
    )
    health_interval: float = field(default=1.0, metadata={"help": "Seconds between two checks that p2pd is alive."})
    check_reachability: bool = field(
        default=True,
        metadata={
            "help": "After joining, ask a few peers to dial this peer's addresses (swarm.reachability); if they "
            "cannot, switch to client mode (records stored in the DHT, no DHT service to others) and log why, "
            "instead of costing every peer that dials it a timeout. Skipped in client mode."
        },
    )

    def __post_init__(self) -> None:
        if isinstance(self.initial_peers, str):
            self.initial_peers = [self.initial_peers]
        if isinstance(self.rejoin_peers, str):
            self.rejoin_peers = [self.rejoin_peers]
        if not 1 <= self.index_records <= self.limits.max_index_records:
            raise ValueError(
                f"index_records={self.index_records}: it must be in [1, {self.limits.max_index_records}] "
                "(limits.max_index_records)"
            )
        for name in ("index_shards", "index_shard_entries", "prefetch_groups", "max_cached_groups",
                     "max_pending_publishes", "dht_num_replicas", "dht_record_lookup_workers",
                     "dht_lookup_beam", "dht_bucket_size", "topic_peers", "departed_after_missed",
                     "max_unknown_senders", "store_budget_bytes", "store_budget_values", "store_budget_host_peers",
                     "dht_storage_bytes", "dht_storage_values", "dht_key_subkeys", "find_budget_bytes",
                     "refill_group_bytes"):  # fmt: skip
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: it must be a positive number")
        for name in ("refill_sender_share", "refill_unjudged_share"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}={getattr(self, name)}: it must be in (0, 1]")
        if not 0 <= self.index_only_sender_share <= 1:
            raise ValueError(f"index_only_sender_share={self.index_only_sender_share}: it must be in [0, 1]")
        for name in ("fetch_heard_within", "fetch_retry_after"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)}: it must be a positive number of seconds")
        if self.max_senders_per_host < 0:
            raise ValueError(f"max_senders_per_host={self.max_senders_per_host}: it must be 0 (no cap) or more")
        if not 0 <= self.index_max_level <= 16:
            raise ValueError(f"index_max_level={self.index_max_level}: it must be in [0, 16]")
        if self.subscribe_topics < 0:
            raise ValueError(f"subscribe_topics={self.subscribe_topics}: it must be 0 (every topic) or more")
        if self.membership_path is not None and not self.membership_operator:
            raise ValueError(
                f"membership_path={self.membership_path!r} needs membership_operator: the id of the key that signed "
                "it (`python -m swarm.membership id --key OPERATOR.pem` prints it)"
            )

    def signing_key_file(self) -> str | None:
        """Where the record signing key lives: signing_key_path, else next to identity_path, else nowhere (fresh)."""
        if self.signing_key_path is not None:
            return self.signing_key_path
        return None if self.identity_path is None else self.identity_path + ".signing.pem"


def validate_multiaddr(addr: str, require_peer_id: bool) -> Multiaddr:
    """Parse a multiaddr, raising ``ValueError`` that names it and shows the expected form."""
    try:
        maddr = Multiaddr(str(addr))
        if require_peer_id:
            PeerID.from_base58(maddr["p2p"])
        return maddr
    except Exception as e:
        expected = MULTIADDR_FORM if require_peer_id else "/ip4/1.2.3.4/tcp/31337"
        raise ValueError(f"malformed multiaddr {addr!r} ({e}); expected the form {expected}") from None


def multiaddr_host(maddr: Multiaddr) -> str | None:
    """The host of ``maddr``: its IP address or DNS name (``/ip4/``, ``/ip6/``, ``/dns*/``); None without one."""
    protocols = {p.name for p in maddr.protocols()}
    return next((maddr[p] for p in ("ip4", "ip6", "dns", "dns4", "dns6") if p in protocols), None)


def is_loopback_host(host: str | None) -> bool:
    """Whether ``host`` (:func:`multiaddr_host`) is this machine's loopback: a loopback address, or ``localhost``."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except (TypeError, ValueError):
        return host == "localhost"


def nat_options(host_maddrs: list[str], nat_traversal: bool | None = None) -> dict[str, bool]:
    """hivemind ``P2P.create``'s ``nat_port_map`` and ``auto_nat`` for a daemon listening on ``host_maddrs``: both
    ``nat_traversal``, or by default on unless every listen address is loopback (hivemind's default, on, makes even a
    daemon of this machine only send UPnP multicast and NAT-PMP requests to the network's gateway)."""
    if nat_traversal is None:
        nat_traversal = not all(is_loopback_host(multiaddr_host(Multiaddr(str(addr)))) for addr in host_maddrs)
    return {"nat_port_map": nat_traversal, "auto_nat": nat_traversal}


def validate_addresses(config: DHTTransportConfig) -> None:
    """Check every multiaddr of ``config`` (initial peers need a ``/p2p/`` peer id); ValueError names the bad one."""
    for addr in [*config.initial_peers, *config.rejoin_peers]:
        validate_multiaddr(addr, require_peer_id=True)
    for addr in list(config.host_maddrs) + list(config.announce_maddrs or []):
        validate_multiaddr(addr, require_peer_id=False)
