"""What a swarm's DHT node takes from other peers before any validator sees it, decoded typed: hivemind's serializer,
replaced on the node's protocol.

hivemind's DHT protocol unpacks some of a peer's bytes with its generic ``MSGPackSerializer`` before the record
validator (:mod:`swarm.validation`) is asked: a *dictionary* value (the values of one key under several subkeys) in
a store request, and in a lookup's answer, is unpacked whole, then each of its items is validated; a subkey is
unpacked once its record passed. A few MiB of empty arrays there cost seconds of garbage collection, on the event
loop. :class:`TypedDHTSerializer` decodes the same bytes typed, as the only values a swarm's DHT holds: a subkey or a
value is one byte string (an owner marker, a signed record or index entry), a dictionary is hivemind's
``DictionaryDHTValue`` of at most :data:`MAX_DICTIONARY_ITEMS` such items. A swarm's peer sets it as its node's
protocol's ``serializer`` (:class:`swarm.peer.DHTPeer`), which hivemind reads at each request. Packing is hivemind's
own.

A value stored without a dictionary reaches the validator as the bytes that arrived; the protobuf messages around
values are protobuf's, typed. What hivemind still unpacks generically: whatever arrives while
:meth:`~hivemind.dht.node.DHTNode.create` runs, before there is a node to give this serializer to (its bootstrap, a
second or so: an initial peer's answers to the first lookup, and a dictionary stored at this peer meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from hivemind.dht.storage import DictionaryDHTValue
from hivemind.p2p.p2p_daemon_bindings.control import DEFAULT_MAX_MSG_SIZE
from hivemind.utils.serializer import MSGPackSerializer
from msgspec import Meta
from msgspec.msgpack import Decoder, Ext

from swarm.records import _FINITE, RecordRejected, check_size, decode_typed
from swarm.validation import MAX_SUBKEY_BYTES

MAX_DICTIONARY_ITEMS = 4096
"""Subkeys in one dictionary value taken from a peer: an index shard holds about ``index_shard_entries`` at the level
a reader reads (level 0 lists every peer of a swarm too small for level 1), an honest records key one."""

_DICTIONARY_CODE = 0x50  # hivemind's ext type code of DictionaryDHTValue
_SIGNATURE_BYTES = 4096  # what a signature adds to a value, with room


class TypedDHTSerializer:
    """hivemind's ``MSGPackSerializer`` for a swarm's DHT node, whose ``loads`` decodes typed (see the module
    docstring) and refuses anything else, counted, with :class:`~swarm.records.RecordRejected`.

    Args:
        max_value_bytes: the largest application value (the swarm's ``max_record_bytes``); its signature is added.
        on_reject: called with ``(reason, detail)`` for each refusal.
        max_items: the most items a dictionary may hold (default :data:`MAX_DICTIONARY_ITEMS`; a swarm's peer gives
            its ``dht_key_subkeys``, the most its own storage answers with): a larger one is refused whole before any
            item is checked.
    """

    dumps = staticmethod(MSGPackSerializer.dumps)

    def __init__(
        self, max_value_bytes: int, on_reject: Callable[[str, str], None], max_items: int = MAX_DICTIONARY_ITEMS
    ):
        self._on_reject = on_reject
        self._max_value_bytes = max_value_bytes + _SIGNATURE_BYTES
        value = Annotated[bytes, Meta(max_length=self._max_value_bytes)]
        subkey = Annotated[bytes, Meta(max_length=MAX_SUBKEY_BYTES)]
        items = Annotated[list[tuple[subkey, value, _FINITE]], Meta(max_length=max_items)]
        self._value = Decoder(value | Ext)
        # DictionaryDHTValue.packb: [maxsize (inf: unbounded), latest expiration time, [[subkey, value, expiration]]]
        self._dictionary = Decoder(tuple[int | float, float, items])

    def loads(self, buf: bytes) -> bytes | DictionaryDHTValue:
        """A byte string or a dictionary of them, decoded typed from ``buf``; raises
        :class:`~swarm.records.RecordRejected` (counted) for anything else."""
        try:
            check_size(buf, DEFAULT_MAX_MSG_SIZE, "DHT value")
            value = decode_typed(buf, self._value, "DHT value")
            if not isinstance(value, Ext):
                return value
            if value.code != _DICTIONARY_CODE:
                raise RecordRejected("schema", f"DHT value of ext type {value.code}, not a dictionary")
            _, _, items = decode_typed(value.data, self._dictionary, "DHT dictionary")
        except RecordRejected as e:
            self._on_reject(e.reason, e.detail)
            raise
        # The sender's maxsize is not taken: every honest dictionary is unbounded, a hostile one would evict.
        with DictionaryDHTValue().freeze() as dictionary:
            for subkey, item, expiration_time in items:
                dictionary.store(subkey, item, expiration_time)
        return dictionary
