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
  registered under (``"DHTProtocol.rpc_store"``), to be replaced by a gated one (:func:`gate_store_handler`).
- `RSASignatureValidator._serialize_record(record) -> bytes`: the bytes an owner signature signs (the record's key,
  subkey, value and expiration as hivemind serializes them) (:func:`signed_bytes`).
- `DHTProtocol.storage` and `.cache` (public names, private workings): `DHTProtocol.create` builds them as
  `DHTLocalStorage()` without a bound, and its `TimedStorage` base evicts, when over its `maxsize` of keys, the entries
  that expire first (its `expiration_heap`, `key_to_heap`, `data`); :func:`bound_storage` replaces both with a
  :class:`BoundedStorage`, bounded in keys and in bytes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.storage import DHTLocalStorage, DictionaryDHTValue
from hivemind.dht.validation import DHTRecord
from hivemind.p2p import P2P
from hivemind.proto import dht_pb2
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import TimedStorage

__all__ = [
    "BoundedStorage",
    "PubsubP2P",
    "bound_storage",
    "connect",
    "daemon_process",
    "daemon_sockets",
    "gate_store_handler",
    "open_control_connection",
    "release_loop_resources",
    "signed_bytes",
    "signing_key",
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
    if protocol.client_mode:
        return

    def refuse_all(request: Any) -> Any:
        return dht_pb2.StoreResponse(store_ok=[False] * len(request.keys), peer=protocol.node_info)

    name = type(protocol)._get_handle_name(None, "rpc_store")
    await protocol.p2p.remove_protobuf_handler(name)
    await protocol.p2p.add_protobuf_handler(name, wrap(protocol.rpc_store, refuse_all), dht_pb2.StoreRequest)


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

    What goes when it is full is what hivemind's own ``maxsize`` drops: the entries that expire first (a key with its
    whole dictionary of subkeys), whether or not they came from the peer whose store filled it, and a value that
    expires before everything held may itself go at once (its store was still answered "stored"). Bytes are the
    values' and subkeys' lengths (Python's own overhead per entry, a few hundred bytes, is not counted; ``max_values``
    bounds it). They are counted exactly only now and then, so a store stays cheap however much is held: each stored
    value adds its length to an estimate that never falls below what is held (expiries and replaced values are not
    subtracted), and when the estimate passes ``max_bytes`` the values are counted and the entries that expire first
    evicted until at most 7/8 of ``max_bytes`` remain (so the next count is at least ``max_bytes / 8`` stored bytes
    away). hivemind's lookups may also merge subkeys they found into a dictionary held here, unseen by the estimate:
    every 1024 stores count again whatever the estimate says, so what such merges add stays in view.
    """

    RECOUNT_EVERY = 1024
    """Stores after which the values are counted again whatever the estimate says."""

    def __init__(self, max_values: int, max_bytes: int):
        super().__init__(maxsize=max_values)
        self.max_bytes = max_bytes
        self.estimate = 0  # bytes held at the last count plus every value stored since: at least what is held
        self.stores_since_count = 0

    def store(self, key: Any, value: Any, expiration_time: float, subkey: Any = None) -> bool:
        """hivemind's store (a subkey: into the key's dictionary), then an eviction if it made the storage too big."""
        if subkey is not None:
            return self.store_subkey(key, subkey, value, expiration_time)
        return self._kept(super().store(key, value, expiration_time), _value_bytes(value))

    def store_subkey(self, key: Any, subkey: Any, value: Any, expiration_time: float) -> bool:
        """hivemind's store of one subkey's value, then an eviction if it made the storage too big."""
        stored = super().store_subkey(key, subkey, value, expiration_time)
        return self._kept(stored, _value_bytes(value) + _value_bytes(subkey))

    def adopt(self, storage: TimedStorage) -> None:
        """Take over what ``storage`` holds (a node's storage before this replaced it), within the bounds."""
        for key, item in storage.items():
            TimedStorage.store(self, key, item.value, item.expiration_time)
            self.estimate += _value_bytes(item.value)
        self._evict_if_over(force=True)

    def nbytes(self) -> int:
        """The bytes of the values (and subkeys) held now, counted; expired entries not yet dropped count too (they
        are still in memory). Safe from another thread than the node's: it reads a copy of each dictionary, taken
        whole under the GIL, and removes nothing."""
        return sum(_value_bytes(item.value) for item in list(self.data.values()))

    def _kept(self, stored: bool, nbytes: int) -> bool:
        if stored:
            self.estimate += nbytes
            self.stores_since_count += 1
            self._evict_if_over()
        return stored

    def _evict_if_over(self, force: bool = False) -> None:
        if not force and self.estimate <= self.max_bytes and self.stores_since_count < self.RECOUNT_EVERY:
            return
        sizes = {key: _value_bytes(item.value) for key, item in self.items()}
        held = sum(sizes.values())
        if held > self.max_bytes:
            while held > self.max_bytes * 7 // 8 and self.data:
                key, _ = self.top()  # the entry that expires first, as hivemind's maxsize evicts
                held -= sizes.pop(key, 0)
                del self[key]
        self.estimate, self.stores_since_count = held, 0


def _value_bytes(value: Any) -> int:
    """The bytes of a stored value: a byte string's length, a dictionary's subkeys and values summed (an item of
    another type: a nominal 64)."""
    if isinstance(value, bytes | str):
        return len(value)
    if isinstance(value, DictionaryDHTValue):
        # a copy of its entries, without hivemind's removal of the expired (which would change it from another thread)
        return sum(_value_bytes(subkey) + _value_bytes(item.value) for subkey, item in list(value.data.items()))
    return 64


def bound_storage(node: Any, max_values: int, max_bytes: int) -> None:
    """Replace the local storage and the cache of ``node`` (a ``DHTNode``) with :class:`BoundedStorage` instances of
    ``max_values`` keys and ``max_bytes`` bytes each, keeping what they held. hivemind builds them unbounded, and
    bounds only the cache's keys (``cache_size``): a peer could otherwise make this node hold every valid value it
    sends until the value expires."""
    protocol = node.protocol
    for name in ("storage", "cache"):
        bounded = BoundedStorage(max_values, max_bytes)
        bounded.adopt(getattr(protocol, name))
        setattr(protocol, name, bounded)
