"""The bridge to hivemind's internals: every private name of hivemind (and of its p2pd client) the swarm relies on.

hivemind 1.1.12 (`pyproject.toml` pins it) has no public way to do the few things below; the rest of `swarm` calls
these functions, so that a hivemind upgrade is this module's work (`tests/test_swarm_hivemind_bridge.py` finds a
private hivemind name anywhere else). What each is relied on for:

- `P2P._client` (the daemon's `p2pclient.Client`), its `connect(peer_id, addrs)`: dials a peer through the daemon, with
  no DHT lookup (:func:`connect`); its `control.daemon_connector.open_connection()`: a fresh connection to the daemon's
  control socket, on which a pubsub request is sent (:func:`open_control_connection`).
- `P2P._client.control._read_task`, `_write_task`: the control client's connection tasks, cancelled by `shutdown`
  without being awaited (:func:`release_loop_resources`).
- `P2P._child` (the daemon's `asyncio.subprocess.Process`, None when it was not started here): its pid and exit code
  (:func:`daemon_process`), and asyncio's `Process._transport`, which `shutdown` leaves open
  (:func:`release_loop_resources`).
- `P2P._client_listen_maddr`: the Unix socket the daemon answers this client on (`daemon_listen_maddr`, the other one,
  is public) (:func:`daemon_sockets`).
- `P2P._make_process_args(*args, **kwargs) -> list[str]`: builds the daemon's command line, a flag per keyword;
  :class:`PubsubP2P` adds ``-pubsub``.
- `RSAPrivateKey._private_key` (the `cryptography` key it signs with): the class can only generate a key, so a key
  loaded from a file (or made by a test) is wrapped by setting it (:func:`signing_key`).
- `ServicerBase._get_handle_name(namespace, method_name) -> str`: the protocol name a DHT node's `rpc_store` handler is
  registered under (``"DHTProtocol.rpc_store"``), to be replaced by a gated one (:func:`gate_store_handler`); and its
  `rpc_find` handler's (``"DHTProtocol.rpc_find"``), replaced by a bounded one (:func:`gate_find_handler`); and its
  `rpc_ping` handler's (``"DHTProtocol.rpc_ping"``), replaced by a gated one (:func:`gate_ping_handler`).
- `DHTProtocol.update_routing_table(node_id, peer_id, responded)` (public name, its workings relied on): called by
  every request this node answers and every answer it gets, with the node id the request or answer claims; when that
  id is not in the routing table it loops over every key in `storage` to `call_store` to the newcomer what it should
  hold, then `routing_table.add_or_update_node`, which returns a neighbour to `call_ping` when the bucket is full.
  :func:`bound_routing_updates` sets an instance attribute of that name (hivemind calls it through `self`), rebuilt
  from those public parts (`routing_table` and its `in`, `get`, `del`, `get_nearest_neighbors`, `num_replicas`,
  `node_id`), with hivemind's own method, given no node id, for an answer that did not come (it drops the node the
  table maps to that libp2p peer). It also reads `RoutingTable.buckets`, `get_bucket_index(node_id)` and a bucket's
  `replacement_nodes` (the ids met while the bucket was full, oldest first, never trimmed by hivemind) and `size`,
  to keep at most a bucket's size of them.
- `DHTProtocol.rpc_find` (public name, its workings relied on): what :func:`gated_find` answers in its place, rebuilt
  from its public parts (`storage`, `cache`, `routing_table.get_nearest_neighbors`, `bucket_size`, `node_info`,
  `serializer`, `rpc_ping`): a result per key of the request, in order (`DHTProtocol.call_find` asserts that the
  results align with its keys), the fresher of the storage's and the cache's item, a dictionary value serialized.
- `DHTProtocol.call_find(peer_id, keys)` (public name, its workings relied on): every find of this node's lookups
  (`DHTNode._call_find_with_blacklist` calls it through `self.protocol`), returning for each key
  `(value or None, {node id: libp2p peer id})`, the neighbours the answer named, which hivemind's lookup then asks.
  :func:`bound_find_answers` sets an instance attribute of that name that calls hivemind's method and keeps, of each
  key's neighbours, what :func:`swarm.lookup_guard.one_id_per_peer` keeps; it reads `routing_table.get(peer_id=...)`,
  `node_id` and `p2p.peer_id`.
- `DHTNode.blacklist` (public name, private workings): a `Blacklist` whose `ban_counter` (a `Counter` by libp2p
  `PeerID`: the failures in a row of each peer a lookup tried, doubling its next ban) gains an entry for every peer
  that did not answer and loses it only when that peer answers later, and whose `banned_peers` (a `TimedStorage` of
  the bans running) hivemind reads with `in`; :func:`trim_ban_counts` drops entries of `ban_counter`.
- `RSASignatureValidator._serialize_record(record) -> bytes`: the bytes an owner signature signs (the record's key,
  subkey, value and expiration as hivemind serializes them) (:func:`signed_bytes`).
- `DHTProtocol.storage` and `.cache` (public names, private workings): `DHTProtocol.create` builds them as
  `DHTLocalStorage()` without a bound, and its `TimedStorage` base evicts, when over its `maxsize` of keys, the entries
  that expire first (its `expiration_heap`, `key_to_heap`, `data`); :func:`bound_storage` replaces both with a
  :class:`BoundedStorage`, bounded in keys and in bytes by whoever stored most, which calls
  `TimedStorage._remove_outdated()` (drops the expired entries) before it evicts, so that the expired go first; and
  `DictionaryDHTValue` (a `TimedStorage` too) through its `data` (subkey -> value and expiration), `_remove_outdated()`
  and `del`, to bound the subkeys of one key's dictionary (:meth:`BoundedStorage.trim_key`). hivemind's lookups merge
  other nodes' answers into the very dictionary object the storage or cache holds (`_SearchState.add_candidate`
  takes this node's own item first), so a dictionary may grow without a store: :func:`gated_find` trims a key's
  dictionaries before it answers for them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import P2P
from hivemind.p2p.p2p_daemon_bindings.control import DEFAULT_MAX_MSG_SIZE
from hivemind.proto import dht_pb2
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import TimedStorage

from swarm.lookup_guard import one_id_per_peer
from swarm.storage_eviction import Storer, Unit, evict_by_host_then_peer, subkeys_that_fit, trim_subkeys

__all__ = [
    "BoundedStorage",
    "PubsubP2P",
    "bound_storage",
    "connect",
    "daemon_process",
    "daemon_sockets",
    "bound_find_answers",
    "bound_routing_updates",
    "gate_find_handler",
    "gate_ping_handler",
    "gate_store_handler",
    "gated_find",
    "open_control_connection",
    "release_loop_resources",
    "signed_bytes",
    "signing_key",
    "trim_ban_counts",
]

TESTED_HIVEMIND = "1.1.12"
"""The hivemind version this bridge is tested with."""


class PubsubP2P(P2P):
    """hivemind's :class:`~hivemind.p2p.P2P` whose ``p2pd`` runs libp2p pubsub with the GossipSub router
    (:mod:`swarm.pubsub` speaks its requests).

    Created like :class:`~hivemind.p2p.P2P` (``await PubsubP2P.create(...)``); everything else is unchanged.
    """

    @staticmethod
    def _make_process_args(*args: Any, **kwargs: Any) -> list[str]:
        # hivemind builds the daemon's command line here; pubsub is one more of its flags
        return P2P._make_process_args(*args, **kwargs, pubsub=True)


async def connect(p2p: P2P, peer_id: Any, addrs: list[Any]) -> None:
    """Dial ``peer_id`` at ``addrs`` (multiaddrs; none: the addresses the daemon knows) through ``p2p``'s daemon."""
    await p2p._client.connect(peer_id, addrs)


async def open_control_connection(p2p: P2P) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A new connection to ``p2p``'s daemon control socket (one request per connection, as the daemon expects)."""
    return await p2p._client.control.daemon_connector.open_connection()


def daemon_process(p2p: P2P) -> asyncio.subprocess.Process | None:
    """The ``p2pd`` process ``p2p`` started (its ``pid``, ``returncode``); None when it runs on another's daemon."""
    return p2p._child


def daemon_sockets(p2p: P2P) -> list[str]:
    """The Unix socket files of ``p2p``: the daemon's control socket and the one its client listens on."""
    return [p2p.daemon_listen_maddr["unix"], p2p._client_listen_maddr["unix"]]


async def release_loop_resources(p2p: Any, timeout: float = 2.0) -> None:
    """After ``p2p.shutdown()``: wait (up to ``timeout`` seconds) for the control client's connection tasks hivemind
    cancelled without awaiting, and close the daemon's subprocess transport it leaves open; left to the garbage
    collector after the loop closed, both raise "Event loop is closed". Anything missing is skipped."""
    control = getattr(getattr(p2p, "_client", None), "control", None)  # p2pclient.Client -> ControlClient
    pending = [task for task in (getattr(control, "_read_task", None), getattr(control, "_write_task", None)) if task]
    if pending:
        await asyncio.wait(pending, timeout=timeout)
    transport = getattr(getattr(p2p, "_child", None), "_transport", None)
    if transport is not None:
        transport.close()


async def gate_store_handler(node: Any, wrap: Any) -> None:
    """Replace the store handler of ``node`` (a server-mode ``DHTNode``) with ``wrap(rpc_store, refuse_all)``, where
    ``refuse_all(request)`` answers a store request "not stored" for each of its values (see
    :meth:`swarm.store_gate.StoreGate.wrap`). A client-mode node answers no requests: nothing to replace."""
    protocol = node.protocol

    def refuse_all(request: Any) -> Any:
        return dht_pb2.StoreResponse(store_ok=[False] * len(request.keys), peer=protocol.node_info)

    await _replace_handler(protocol, "rpc_store", wrap(protocol.rpc_store, refuse_all), dht_pb2.StoreRequest)


async def _replace_handler(protocol: Any, method: str, handler: Any, request_type: Any) -> None:
    """Answer ``protocol``'s requests for ``method`` (``"rpc_store"``, ...) with ``handler`` instead of hivemind's; a
    client-mode protocol answers no requests: nothing to replace."""
    if protocol.client_mode:
        return
    name = type(protocol)._get_handle_name(None, method)
    await protocol.p2p.remove_protobuf_handler(name)
    await protocol.p2p.add_protobuf_handler(name, handler, request_type)


MAX_MESSAGE_BYTES = DEFAULT_MAX_MSG_SIZE
"""The largest message p2pd carries (4 MiB): an answer beyond it is not sent, its caller gets an error instead."""

NEIGHBOUR_BYTES = 96
"""Room kept in a find answer for one neighbour of one key (a node id, a libp2p id and their framing: about 70
bytes)."""


async def gate_find_handler(node: Any, wrap: Any) -> None:
    """Replace the find handler of ``node`` (a server-mode ``DHTNode``) with :func:`gated_find` of ``wrap`` (see
    :meth:`swarm.find_gate.FindGate.wrap`). A client-mode node answers no requests: nothing to replace."""
    protocol = node.protocol
    await _replace_handler(protocol, "rpc_find", gated_find(protocol, wrap), dht_pb2.FindRequest)


def gated_find(protocol: Any, wrap: Any) -> Any:
    """A find handler of ``protocol`` (a ``DHTProtocol``): ``wrap(answer, refuse)``, where ``refuse(request)`` is an
    answer without results (which hivemind's caller reads as no answer) and ``answer(request, context, room)`` answers
    as hivemind's ``rpc_find`` does (a result per key, in order: the value held under it, if any, and its nearest
    neighbours), except that a key named again, or one that is no DHT id, is answered empty (no value, no neighbours),
    and that values are added
    only while their bytes stay within ``room`` and within p2pd's message cap with room for every key's neighbours;
    past it a key is answered with its neighbours only, as if no value were held here. It returns the answer and the
    value bytes it holds."""

    async def answer(request: Any, context: Any, room: int) -> tuple[Any, int]:
        if request.peer.node_id:  # as hivemind: the asker joins the routing table
            asyncio.create_task(protocol.rpc_ping(dht_pb2.PingRequest(peer=request.peer), context))
        keys = len(request.keys)
        room = min(room, MAX_MESSAGE_BYTES - 4096 - keys * protocol.bucket_size * NEIGHBOUR_BYTES)
        response = dht_pb2.FindResponse(results=[], peer=protocol.node_info)
        asker = DHTID.from_bytes(request.peer.node_id)
        # every key read before anything is built: a key hivemind cannot read (it raises) after a large value would
        # leave that value built and its bytes uncharged
        parsed = [_dht_id(raw) for raw in request.keys]
        seen: set[bytes] = set()
        held = 0
        for raw, key in zip(request.keys, parsed, strict=True):
            if raw in seen or key is None:
                response.results.append(dht_pb2.FindResult(type=dht_pb2.NOT_FOUND))
                continue
            seen.add(raw)
            item = _found(protocol, key, room - held)
            held += len(item.value)
            for node_id, peer_id in protocol.routing_table.get_nearest_neighbors(
                key, k=protocol.bucket_size, exclude=asker
            ):
                item.nearest_node_ids.append(node_id.to_bytes())
                item.nearest_peer_ids.append(peer_id.to_bytes())
            response.results.append(item)
        return response, held

    def refuse(request: Any) -> Any:
        return dht_pb2.FindResponse(results=[], peer=protocol.node_info)

    return wrap(answer, refuse)


def _dht_id(raw: bytes) -> DHTID | None:
    """The DHT id of a requested key, or None when it is none (hivemind asserts on an id out of its range)."""
    try:
        return DHTID.from_bytes(raw)
    except (AssertionError, ValueError, TypeError):
        return None


def _found(protocol: Any, key: DHTID, room: int) -> Any:
    """The result for ``key`` without its neighbours: the fresher of the storage's and the cache's item if its bytes
    fit in ``room``, else not found; of a dictionary that does not fit, the part that does (:func:`_fitting_part`).
    Answered not found, a dictionary of an owner's record and a few subkeys of megabytes that others stored under its
    key (any peer may sign a subkey of its own under any key) made the owner's record unreadable, and the owner struck
    as one that never served what it announced."""
    holders = [storage for storage in (protocol.storage, protocol.cache) if isinstance(storage, BoundedStorage)]
    for storage in holders:  # a lookup's merge may have grown a dictionary held here
        storage.trim_key(key)
    item, holder = protocol.storage.get(key), protocol.storage
    cached = protocol.cache.get(key)
    if cached is not None and (item is None or cached.expiration_time > item.expiration_time):
        item, holder = cached, protocol.cache
    if item is None:
        return dht_pb2.FindResult(type=dht_pb2.NOT_FOUND)
    if isinstance(item.value, DictionaryDHTValue):
        value = _fitting_part(item.value, key, holder, room, protocol.serializer.dumps)
        if value is None:
            return dht_pb2.FindResult(type=dht_pb2.NOT_FOUND)
        return dht_pb2.FindResult(type=dht_pb2.FOUND_DICTIONARY, value=value, expiration_time=item.expiration_time)
    if _value_bytes(item.value) > room:
        return dht_pb2.FindResult(type=dht_pb2.NOT_FOUND)
    return dht_pb2.FindResult(type=dht_pb2.FOUND_REGULAR, value=item.value, expiration_time=item.expiration_time)


_ENTRY_BYTES = 32
"""What serializing one subkey adds to its subkey's and value's bytes, at most (msgpack headers and an expiration)."""


def _fitting_part(
    dictionary: DictionaryDHTValue, key: DHTID, holder: Any, room: int, dumps: Callable[[Any], bytes]
) -> bytes | None:
    """``dictionary`` serialized if it fits in ``room``; else its subkeys that do, chosen by who stored them
    (:func:`swarm.storage_eviction.subkeys_that_fit`: the hosts holding the fewest of its bytes first); None when not
    one fits. The bytes of its entries are summed before anything is serialized."""
    entries = list(dictionary.data.items())  # a copy: hivemind's reads remove the expired
    sizes = {subkey: _value_bytes(subkey) + _value_bytes(sub.value) + _ENTRY_BYTES for subkey, sub in entries}
    if sum(sizes.values()) + _ENTRY_BYTES <= room:
        value = dumps(dictionary)
        if len(value) <= room:
            return value
    stored_by = holder.storer_of if isinstance(holder, BoundedStorage) else (lambda key, subkey: None)
    chosen = set(subkeys_that_fit(sizes, lambda subkey: stored_by(key, subkey), room - _ENTRY_BYTES))
    if not chosen:
        return None
    with DictionaryDHTValue(dictionary.maxsize).freeze() as part:
        for subkey, sub in entries:
            if subkey in chosen:
                part.store(subkey, sub.value, sub.expiration_time)
    value = dumps(part)
    return value if len(value) <= room else None


async def gate_ping_handler(node: Any, wrap: Any) -> None:
    """Replace the ping handler of ``node`` (a server-mode ``DHTNode``) with ``wrap(rpc_ping, refuse)``, where
    ``refuse(request)`` answers as hivemind does a ping that names no node: this node's id and time, "not available",
    nothing looked at (see :meth:`swarm.ping_gate.PingGate.wrap`). A client-mode node answers no requests: nothing to
    replace. The store and find handlers' own routing updates call ``rpc_ping`` directly, not through the handler."""
    protocol = node.protocol

    def refuse(request: Any) -> Any:
        return dht_pb2.PingResponse(peer=protocol.node_info, dht_time=get_dht_time(), available=False)

    await _replace_handler(protocol, "rpc_ping", wrap(protocol.rpc_ping, refuse), dht_pb2.PingRequest)


def bound_routing_updates(node: Any, guard: Any) -> None:
    """Bound the routing-table updates of ``node`` (a ``DHTNode``) by ``guard`` (a
    :class:`swarm.ping_gate.RoutingGuard`): a libp2p peer goes under the first node id it claimed
    (``guard.node_id``), never one the table maps to another peer, and holds one place (its former id's goes when it
    takes a new one); a peer whose id did not fit tries again only when ``guard.may_join``; a bucket keeps at most its
    size of replacement ids (the oldest go); a newcomer is sent the stored values it should hold only when something
    is stored and ``guard.may_copy_out`` (hivemind: at every update naming an id not in the table, a loop over every
    key stored here); an answer that did not come drops the node the table maps to its libp2p peer, not an id a
    request named. Otherwise as hivemind's ``update_routing_table``."""
    protocol = node.protocol
    table = protocol.routing_table
    hivemind_update = functools.partial(type(protocol).update_routing_table, protocol)

    async def update_routing_table(node_id: Any, peer_id: Any, responded: bool = True) -> None:
        if not responded:  # an answer that did not come: hivemind drops the node the table maps to that peer, never
            await hivemind_update(None, peer_id, responded=False)  # an id a request named (anyone's)
            return
        if node_id is None:
            return
        peer = peer_id.to_base58()
        node_id = DHTID.from_bytes(guard.node_id(peer, node_id.to_bytes()))
        holder = table.get(node_id=node_id)
        if holder is not None and holder != peer_id:  # another peer's id: not taken over
            guard.counters.add("routing_ids_ignored")
            return
        if not guard.may_join(peer):  # its id did not fit a moment ago (each try pings a neighbour)
            return
        previous = table.get(peer_id=peer_id)
        if previous is not None and previous != node_id:  # the peer's new id (its former one's time ended): one place
            del table[previous]
        if node_id not in table and protocol.storage and guard.may_copy_out(peer):
            _copy_out(protocol, node_id, peer_id)
        maybe_node_to_ping = table.add_or_update_node(node_id, peer_id)
        bucket = table.buckets[table.get_bucket_index(node_id)]
        while len(bucket.replacement_nodes) > bucket.size:  # hivemind keeps every id met while a bucket is full
            del table[next(iter(bucket.replacement_nodes))]
        if maybe_node_to_ping is not None:  # the bucket is full: ping its least recently seen node, to make room
            guard.join_refused(peer)
            asyncio.create_task(protocol.call_ping(maybe_node_to_ping[1]))

    protocol.update_routing_table = update_routing_table


def _copy_out(protocol: Any, node_id: Any, peer_id: Any) -> None:
    """hivemind's copy to a newcomer ``node_id`` (at ``peer_id``) of the values stored here that it is now among the
    nearest to and this node was the nearest to."""
    data_to_send = []
    for key, item in list(protocol.storage.items()):
        neighbors = protocol.routing_table.get_nearest_neighbors(key, protocol.num_replicas, exclude=protocol.node_id)
        if neighbors:
            nearest_distance = neighbors[0][0].xor_distance(key)
            farthest_distance = neighbors[-1][0].xor_distance(key)
            new_node_should_store = node_id.xor_distance(key) < farthest_distance
            this_node_is_responsible = protocol.node_id.xor_distance(key) < nearest_distance
        if not neighbors or (new_node_should_store and this_node_is_responsible):
            data_to_send.append((key, item.value, item.expiration_time))
    if data_to_send:
        asyncio.create_task(protocol.call_store(peer_id, *zip(*data_to_send, strict=True), in_cache=False))


def signing_key(key: Any) -> RSAPrivateKey:
    """hivemind's signing key around ``key``, an RSA private key of `cryptography` (e.g. one loaded from PEM)."""
    wrapped = RSAPrivateKey.__new__(RSAPrivateKey)  # the class only knows how to generate a key
    wrapped._private_key = key
    return wrapped


def signed_bytes(validator: RSASignatureValidator, record: DHTRecord) -> bytes:
    """What hivemind's owner signature of ``record`` signs (``record.value`` without its signature)."""
    return validator._serialize_record(record)


class BoundedStorage(DHTLocalStorage):
    """hivemind's local storage of a DHT node (or its cache), holding at most ``max_values`` keys and about
    ``max_bytes`` bytes of values.

    When it is full, what goes is taken from whoever holds most: each value (a key's, or one subkey's in a key's
    dictionary) is counted to the host and peer whose store request brought it (``storer()`` while it is stored:
    ``(host, libp2p peer)`` of the store request being handled, :func:`swarm.store_gate.current_storer`; None for
    this node's own stores, a lookup's cached results and what was held before), and of the host holding the most
    bytes (past ``max_bytes``) or the most values (past ``max_values`` keys), the peer holding most loses its value
    that expires first, again and again (:func:`swarm.storage_eviction.evict_by_host_then_peer`), until at most 7/8
    of the bound is held (so the next eviction is at least an eighth of the bound away). So a host that stores valid
    records by the megabyte, or under key after key, from one libp2p identity or many, evicts its own, not the small
    index entries and records of other hosts, until it holds no more than they do. A value that is evicted at once
    had its store answered "stored" all the same. Bytes are the values' and subkeys' lengths (Python's own overhead, a
    few hundred bytes a value, is not counted: the keys are bounded by ``max_values``, the subkeys of a key's
    dictionary, each a signed value of hundreds of bytes, by ``max_bytes``). They are counted exactly only now and
    then, so a store stays cheap however much is held: each stored value adds its length to an estimate that never
    falls below what is held (expiries and replaced values are not subtracted), and when the estimate passes
    ``max_bytes`` the values are counted and evicted. hivemind's lookups may also merge subkeys they found into a
    dictionary held here, unseen by the estimate: every 1024 stores count again whatever the estimate says, so what
    such merges add stays in view.

    One key's dictionary (an index shard) holds at most ``max_subkeys`` subkeys (None: no bound): a store that makes it
    hold more trims it to 7/8 of that, the group holding most of the key's subkeys (its host; a loopback peer alone)
    losing, of its peer holding most, the subkey that expires first (:func:`swarm.storage_eviction.trim_subkeys`).
    A reader takes a dictionary of at most its own ``dht_key_subkeys`` items
    (:class:`swarm.dht_values.TypedDHTSerializer`) and refuses a larger one whole, so without the bound one host
    storing entries of thousands of identities under one index key made every honest holder's answer for it
    unreadable. ``on_subkeys_trimmed(n)`` is told of each trim.
    """

    RECOUNT_EVERY = 1024
    """Stores after which the values are counted again whatever the estimate says."""

    def __init__(
        self,
        max_values: int,
        max_bytes: int,
        storer: Callable[[], Storer | None] = lambda: None,
        max_subkeys: int | None = None,
        on_subkeys_trimmed: Callable[[int], None] = lambda n: None,
    ):
        super().__init__(maxsize=None)  # the key bound is kept here, by the rule above, not by hivemind's
        self.max_values = max_values
        self.max_bytes = max_bytes
        self.storer = storer
        self.max_subkeys = max_subkeys
        self.on_subkeys_trimmed = on_subkeys_trimmed
        self.estimate = 0  # bytes held at the last count plus every value stored since: at least what is held
        self.stores_since_count = 0
        self._stored_by: dict[Unit, Storer | None] = {}  # (key, subkey or None) -> (host, peer) that stored it

    def store(self, key: Any, value: Any, expiration_time: float, subkey: Any = None) -> bool:
        """hivemind's store (a subkey: into the key's dictionary), then an eviction if it made the storage too big."""
        if subkey is not None:
            return self.store_subkey(key, subkey, value, expiration_time)
        stored = self._kept(super().store(key, value, expiration_time), _value_bytes(value), (key, None))
        if stored and isinstance(value, DictionaryDHTValue):  # a lookup's merged result, cached whole
            self.trim_key(key)
        return stored

    def store_subkey(self, key: Any, subkey: Any, value: Any, expiration_time: float) -> bool:
        """hivemind's store of one subkey's value, then a trim of the key's dictionary if it holds too many subkeys
        and an eviction if the storage is too big."""
        stored = super().store_subkey(key, subkey, value, expiration_time)
        stored = self._kept(stored, _value_bytes(value) + _value_bytes(subkey), (key, subkey))
        if stored:
            self.trim_key(key)
        return stored

    def trim_key(self, key: Any) -> int:
        """Bound the subkeys of ``key``'s dictionary to ``max_subkeys`` (the rule in the class docstring): the expired
        go first, then, while over, the group holding most loses its subkey that expires first. Returns the subkeys
        removed (0 at once when the key holds no dictionary over the bound)."""
        item = self.data.get(key)
        if self.max_subkeys is None or item is None or not isinstance(item.value, DictionaryDHTValue):
            return 0
        dictionary = item.value
        if len(dictionary.data) <= self.max_subkeys:
            return 0
        dictionary._remove_outdated()
        expirations = {subkey: sub.expiration_time for subkey, sub in dictionary.data.items()}

        def remove(subkey: Any) -> None:
            del dictionary[subkey]
            self._stored_by.pop((key, subkey), None)

        trimmed = trim_subkeys(expirations, lambda subkey: self._stored_by.get((key, subkey)), self.max_subkeys, remove)
        if not dictionary.data:
            del self[key]
        if trimmed:
            self.on_subkeys_trimmed(trimmed)
        return trimmed

    def storer_of(self, key: Any, subkey: Any) -> Storer | None:
        """Who stored ``subkey`` of ``key``'s dictionary here (``(host, libp2p peer)``), None if not known."""
        return self._stored_by.get((key, subkey))

    def adopt(self, storage: TimedStorage) -> None:
        """Take over what ``storage`` holds (a node's storage before this replaced it), within the bounds."""
        for key, item in storage.items():
            TimedStorage.store(self, key, item.value, item.expiration_time)
            self.estimate += _value_bytes(item.value)
        for key in list(self.data):
            self.trim_key(key)
        self._evict_if_over(force=True)

    def nbytes(self) -> int:
        """The bytes of the values (and subkeys) held now, counted; expired entries not yet dropped count too (they
        are still in memory). Safe from another thread than the node's: it reads a copy of each dictionary, taken
        whole under the GIL, and removes nothing."""
        return sum(_value_bytes(item.value) for item in list(self.data.values()))

    def held_by(self) -> dict[str | None, int]:
        """The bytes held, by the libp2p peer that stored them (None: this node, a lookup or unknown). Safe from
        another thread, as :meth:`nbytes` is."""
        return self._held(lambda storer: storer[1])

    def held_by_host(self) -> dict[str | None, int]:
        """The bytes held, by the host that stored them (None: this node, a lookup, or a peer of unknown host). Safe
        from another thread, as :meth:`nbytes` is."""
        return self._held(lambda storer: storer[0])

    def _held(self, name: Callable[[Storer], str | None]) -> dict[str | None, int]:
        stored_by, held = dict(self._stored_by), {}
        for unit, (nbytes, _) in self._units().items():
            who = name(stored_by.get(unit) or (None, None))
            held[who] = held.get(who, 0) + nbytes
        return held

    def _kept(self, stored: bool, nbytes: int, unit: Unit) -> bool:
        if stored:
            self._stored_by[unit] = self.storer()
            self.estimate += nbytes
            self.stores_since_count += 1
            self._evict_if_over()
        return stored

    def _units(self) -> dict[Unit, tuple[int, float]]:
        """Every value held, ``(key, subkey or None)``, with its bytes and expiration time (read from copies of the
        dictionaries, removing nothing)."""
        units: dict[Unit, tuple[int, float]] = {}
        for key, item in list(self.data.items()):
            if isinstance(item.value, DictionaryDHTValue):
                for subkey, sub in list(item.value.data.items()):
                    units[key, subkey] = (_value_bytes(subkey) + _value_bytes(sub.value), sub.expiration_time)
            else:
                units[key, None] = (_value_bytes(item.value), item.expiration_time)
        return units

    def _evict_if_over(self, force: bool = False) -> None:
        over_keys = len(self.data) > self.max_values
        if not (force or over_keys or self.estimate > self.max_bytes or self.stores_since_count >= self.RECOUNT_EVERY):
            return
        self._remove_outdated()  # the expired go first, whoever stored them
        units = self._units()
        self._stored_by = {unit: self._stored_by.get(unit) for unit in units}  # the evicted and expired forgotten
        held = sum(nbytes for nbytes, _ in units.values())
        if held > self.max_bytes:
            bound = self.max_bytes * 7 // 8
            held -= self._evict(units, lambda unit: units[unit][0], lambda gone: held - gone <= bound)
        if len(self.data) > self.max_values:
            units = self._units()
            bound = self.max_values * 7 // 8
            held -= self._evict(units, lambda unit: 1, lambda gone: len(self.data) <= bound)
        self.estimate, self.stores_since_count = held, 0

    def _evict(
        self, units: dict[Unit, tuple[int, float]], size: Callable[[Unit], int], enough: Callable[[int], bool]
    ) -> int:
        """Evict from the largest holder by ``size`` until ``enough`` (:func:`evict_by_host_then_peer`)."""

        def remove(unit: Unit) -> None:
            self._remove(unit)
            del self._stored_by[unit]

        return evict_by_host_then_peer(units, self._stored_by.get, size, enough, remove)

    def _remove(self, unit: Unit) -> None:
        """Remove one value: a key's, or one subkey's from its dictionary (the key with it once it is empty)."""
        key, subkey = unit
        if subkey is None:
            del self[key]
            return
        dictionary = self.data[key].value
        del dictionary[subkey]
        if not dictionary.data:
            del self[key]


def _value_bytes(value: Any) -> int:
    """The bytes of a stored value: a byte string's length, a dictionary's subkeys and values summed (an item of
    another type: a nominal 64)."""
    if isinstance(value, bytes | str):
        return len(value)
    if isinstance(value, DictionaryDHTValue):
        # a copy of its entries, without hivemind's removal of the expired (which would change it from another thread)
        return sum(_value_bytes(subkey) + _value_bytes(item.value) for subkey, item in list(value.data.items()))
    return 64


def bound_storage(
    node: Any,
    max_values: int,
    max_bytes: int,
    storer: Callable[[], Storer | None] = lambda: None,
    max_subkeys: int | None = None,
    on_subkeys_trimmed: Callable[[int], None] = lambda n: None,
) -> None:
    """Replace the local storage and the cache of ``node`` (a ``DHTNode``) with :class:`BoundedStorage` instances of
    ``max_values`` keys and ``max_bytes`` bytes each, and ``max_subkeys`` subkeys a key, keeping what they held;
    ``storer()`` names the host and peer whose store is being handled, ``on_subkeys_trimmed(n)`` is told of each trim
    of a key's dictionary. hivemind builds them unbounded, and bounds only the cache's keys (``cache_size``): a peer
    could otherwise make this node hold every valid value it sends until the value expires."""
    protocol = node.protocol
    for name in ("storage", "cache"):
        bounded = BoundedStorage(max_values, max_bytes, storer, max_subkeys, on_subkeys_trimmed)
        bounded.adopt(getattr(protocol, name))
        setattr(protocol, name, bounded)


def bound_find_answers(node: Any, guard: Any = None, counters: Any = None) -> None:
    """Hold the neighbours every find answer of ``node``'s lookups names (``node``: a ``DHTNode``) to
    :func:`swarm.lookup_guard.one_id_per_peer`: the answering peer naming itself is dropped, and so is this node's own
    libp2p peer (under whatever id: its former one, after a switch of mode), each other libp2p peer is kept once, a
    peer known here goes under the node id it is known by (the id ``guard``, a :class:`swarm.ping_gate.RoutingGuard`,
    holds it under, else the routing table's), which a lookup that asked it has visited already, and a neighbour under
    this node's own id goes (hivemind's store asserts that no search finds it). hivemind's lookup
    asks every node id named nearer the key, so made-up ids mapped to one peer had it asked again and again within one
    lookup. What was ignored or renamed is counted (``lookup_ids_ignored``)."""
    protocol = node.protocol
    hivemind_find = functools.partial(type(protocol).call_find, protocol)
    own = protocol.p2p.peer_id

    def known(peer_id: Any) -> Any:
        claimed = guard.claimed(peer_id.to_base58()) if guard is not None else None
        return DHTID.from_bytes(claimed) if claimed is not None else protocol.routing_table.get(peer_id=peer_id)

    async def call_find(peer: Any, keys: Any) -> Any:
        response = await hivemind_find(peer, keys)
        if not response:
            return response
        ignored = 0
        for key, (value, nearest) in response.items():
            kept, dropped = one_id_per_peer(nearest.items(), known, (peer, own), (protocol.node_id,))
            ignored += dropped
            response[key] = value, dict(kept)
        if ignored and counters is not None:
            counters.add("lookup_ids_ignored", ignored)
        return response

    protocol.call_find = call_find


def trim_ban_counts(node: Any, keep: int) -> int:
    """Keep at most ``keep`` of the failure counts ``node`` (a ``DHTNode``) holds by libp2p peer: those of peers whose
    ban is over go first, then those banned now, the oldest first. Returns how many were dropped. hivemind counts every
    peer a lookup tried that did not answer (its next ban doubles) and forgets a count only when that peer answers, so
    made-up peer ids named in lookup answers each left one for good. A peer whose count was dropped is banned for the
    base time at its next failure; a ban running now runs on. Call it on the node's event loop."""
    blacklist = node.blacklist
    counts = blacklist.ban_counter
    excess = len(counts) - keep
    if excess <= 0:
        return 0
    banned = {peer for peer, _ in blacklist.banned_peers.items()}
    order = [peer for peer in counts if peer not in banned] + [peer for peer in counts if peer in banned]
    for peer in order[:excess]:
        del counts[peer]
    return excess
