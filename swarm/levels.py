"""The swarm's layout by size: which index levels a reader reads and a publisher writes, and which announcement
topics a peer joins, from its estimate of the swarm's size N.

The index (:func:`swarm.validation.index_keys`) has levels: level ``l`` lists the peers over ``index_shards * 2**l``
shards, so a reader reads the level whose shards hold about ``index_shard_entries`` entries and a publisher writes a
window of levels around it (:func:`write_levels_for`). Announcements (:mod:`swarm.announcements`) go by GossipSub on
topics split the same way: level ``t`` has ``2**t`` topics, and peer ``p``'s home topic there is the hash of ``p``
modulo ``2**t`` (:func:`swarm.validation.index_shard_of` with one shard), so a topic holds about N / 2**t peers and
the level is the one where that is at most ``topic_peers`` (:func:`topic_level_for`). A peer subscribes to its home
topic at its level and publishes to its home topics one level below and above it too, so peers whose estimates of N
differ up to twofold still hear each other.
"""

from __future__ import annotations

import math

from swarm.config import DHTTransportConfig
from swarm.validation import index_shard_of

TOPIC_MAX_LEVEL = 16
"""The highest topic level: 65536 topics."""


def read_level_for(estimate: float | None, config: DHTTransportConfig) -> int:
    """The index level a reader reads when it estimates ``estimate`` peers (``None``: no estimate yet): see
    :meth:`SwarmReader.read_level`."""
    if not config.index_shards_per_poll:
        return 0
    if estimate is None:
        return config.index_max_level // 2
    per_shard_at_level_0 = estimate / (config.index_shards * config.index_shard_entries)
    level = round(math.log2(per_shard_at_level_0)) if per_shard_at_level_0 > 0 else 0
    return min(max(level, 0), config.index_max_level)


def shards_per_read(estimate: float | None, level: int, config: DHTTransportConfig) -> int:
    """How many shards of ``level`` an index read reads: ``index_shards_per_poll``, or as many more as hold
    ``index_shards_per_poll * index_shard_entries`` entries by ``estimate`` where the level's shards hold fewer
    than that (level 0 of a swarm smaller than ``index_shards * index_shard_entries``: a read of two near-empty
    shards would list too few peers to choose fresh records from); every shard with ``index_shards_per_poll`` 0."""
    shards = config.index_shards << level
    if not config.index_shards_per_poll:
        return shards
    if estimate is None:  # the first read: a probe of index_shards_per_poll shards
        return min(config.index_shards_per_poll, shards)
    per_shard = estimate / shards
    spread = round(config.index_shard_entries / per_shard) if per_shard > 0 else shards
    return min(config.index_shards_per_poll * max(1, spread), shards)


def write_levels_for(estimate: float | None, config: DHTTransportConfig) -> range:
    """The index levels a publisher writes to when its peer estimates ``estimate`` peers (``None``: no estimate
    yet, every level): from one below to one above the level a reader of that estimate reads, so that readers
    estimating from half to twice as many find it, and a reader probing every third level (:func:`probe_levels`)
    does too. Three levels, whose shards hold about ``index_shard_entries`` entries: a store's cost is flat in N."""
    if estimate is None:
        return range(config.index_max_level + 1)
    level = read_level_for(estimate, config)
    return range(max(0, level - 1), min(level + 1, config.index_max_level) + 1)


def probe_levels(config: DHTTransportConfig) -> list[int]:
    """The levels a reader probes in turn while its reads find nothing: the middle one (its first read), level 0,
    then every third level and the top. A writer's levels span at least three (:func:`write_levels_for`), so
    one of these lies among them whatever the swarm's size."""
    top = config.index_max_level
    order = [top // 2, 0, *range(2, top + 1, 3), top]
    return list(dict.fromkeys(level for level in order if level <= top))


def topic_level_for(estimate: float | None, config: DHTTransportConfig) -> int:
    """The topic level of a peer estimating ``estimate`` peers: the lowest whose ``2**level`` topics hold at most
    ``topic_peers`` peers each (0 without an estimate: a new swarm has one topic)."""
    if estimate is None or estimate <= config.topic_peers:
        return 0
    return min(math.ceil(math.log2(estimate / config.topic_peers)), TOPIC_MAX_LEVEL)


def topic_name(swarm_name: str, level: int, shard: int) -> str:
    """The GossipSub topic of shard ``shard`` of topic level ``level``."""
    return f"{swarm_name}/announce/L{level}/{shard}"


def home_topic_shard(peer: str, level: int) -> int:
    """The shard of ``level`` that is peer ``peer``'s home topic."""
    return index_shard_of(peer, 1, level)


def publish_topics(peer: str, level: int, config: DHTTransportConfig) -> list[str]:
    """The topics peer ``peer`` publishes its announcements on at topic level ``level``: its home topic there and one
    level below and above (readers estimating half or twice as many peers)."""
    levels = [lvl for lvl in (level - 1, level, level + 1) if 0 <= lvl <= TOPIC_MAX_LEVEL]
    return [topic_name(config.swarm_name, lvl, home_topic_shard(peer, lvl)) for lvl in levels]


def subscribed_shards(peer: str, level: int, config: DHTTransportConfig) -> list[int]:
    """The shards of topic level ``level`` peer ``peer`` subscribes to: its home topic's and the next
    ``subscribe_topics - 1`` (every shard of the level with ``subscribe_topics`` 0)."""
    shards = 1 << level
    count = shards if config.subscribe_topics == 0 else min(config.subscribe_topics, shards)
    home = home_topic_shard(peer, level)
    return [(home + i) % shards for i in range(count)]


def subscribe_topics(peer: str, level: int, config: DHTTransportConfig) -> list[str]:
    """The topics peer ``peer`` subscribes to at topic level ``level`` (:func:`subscribed_shards`)."""
    return [topic_name(config.swarm_name, level, shard) for shard in subscribed_shards(peer, level, config)]


def topic_index_shards(topic_shard: int, topic_level: int, index_level: int, config: DHTTransportConfig) -> list[int]:
    """The shards of index level ``index_level`` whose entries are peers of topic ``topic_shard`` of
    ``topic_level``: every index shard congruent to it when index shards are finer than topics, else the one index
    shard holding the topic."""
    index_count, topic_count = config.index_shards << index_level, 1 << topic_level
    if index_count % topic_count == 0:
        return list(range(topic_shard, index_count, topic_count))
    return [topic_shard % index_count]


def size_from_distances(distances: list[int], nearest: int, bits: int = 160) -> float | None:
    """The number of peers in a DHT, estimated from the XOR distances from one node to the others it knows: the i-th
    nearest of N uniformly random ids is about i / N of the id space away, fitted by least squares over the
    ``nearest`` nearest known (a node knows its nearest neighbours best); ``None`` with fewer than two.

    A node that knows fewer than ``nearest`` others (its routing table's bucket size) has heard of the whole DHT:
    a larger one fills a bucket at the join's lookup. Its estimate is then at most twice the nodes it knows, itself
    included: from two or three distances alone the fit can say a hundred peers where there are three (two close ids),
    and two peers of a new swarm, each subscribed to a topic level of a hundred, would not hear each other."""
    scaled = [d / float(1 << bits) for d in sorted(distances)[:nearest] if d > 0]
    if len(scaled) < 2:
        return None
    ranks = range(1, len(scaled) + 1)
    estimate = sum(i * i for i in ranks) / sum(i * d for i, d in zip(ranks, scaled, strict=False))
    if len(distances) < nearest:
        estimate = min(estimate, 2.0 * (len(distances) + 1))
    return estimate
