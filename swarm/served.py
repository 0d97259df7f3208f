"""Records served by their publisher over libp2p: this peer's signed records in memory, and the RPC that fetches one.

Storing a record in the DHT sends it to ``dht_num_replicas`` peers, and reading it back walks a lookup whose every
hop answers with a list of neighbours: at N = 64 that was two thirds of a peer's bytes per step. A publisher that
others can dial keeps its records instead (the few its index entry lists) and answers a request for one with the
bytes a DHT store would have carried, owner signature included; its index entry names its libp2p peer id
(:attr:`swarm.records.IndexEntry.host`). A reader then fetches each record in one request from the peer that made
it and checks it with the validator its DHT runs (:func:`swarm.validation.open_served`). Only the index stays in
the DHT. A record lives as long as its publisher: one that left takes its unread records with it, which costs a
reader the few stale groups it had not fetched yet.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack
import msgspec
from google.protobuf.wrappers_pb2 import BytesValue

from swarm.clock import SYSTEM_CLOCK, Clock
from swarm.records import _TIME, RecordRejected, check_size, decode_typed
from swarm.transport import SwarmCounters
from swarm.validation import open_served, sign_for_serving

RECORD_HANDLER = "sapo_swarm.get_record"
"""The libp2p protocol name a publisher answers record requests under."""

_ENVELOPE_BYTES = 16  # msgpack around a record: an array header, a bin header (5), a float (9)
_MAX_KEY_BYTES = 1024  # a record key asked for (f"{swarm_name}/records/{sender}/{seq}"); a longer one is not served


@dataclass(frozen=True)
class SignedRecord:
    """One record as a DHT store would carry it: serialized and signed (``value``), with its expiration time."""

    value: bytes
    expiration_time: float


class ServedRecords:
    """The records this peer's index entry lists, kept in memory for other peers to fetch (thread-safe).

    Args:
        validator: this peer's DHT validator, which signs what :meth:`serve` keeps as a DHT store would.
        capacity: records kept; the oldest goes first (the index entry lists ``index_records`` of them).
        counters: where requests served (``served_requests``, ``served_misses``) and bytes sent are counted.
        clock: wall time; an expired record is no longer served.
    """

    def __init__(self, validator: Any, capacity: int, counters: SwarmCounters, clock: Clock = SYSTEM_CLOCK):
        self.validator = validator
        self.capacity = capacity
        self.host: str | None = None  # this peer's libp2p id once its p2pd runs; None: nothing is served yet
        self._counters = counters
        self._clock = clock
        self._lock = threading.Lock()
        self._records: collections.OrderedDict[str, SignedRecord] = collections.OrderedDict()

    def serve(self, key: str, subkey: bytes, value: bytes, expiration_time: float) -> None:
        """Sign ``value`` (under ``key`` and the owner ``subkey``) and serve it until ``expiration_time``."""
        signed = sign_for_serving(self.validator, key, subkey, value, expiration_time)
        self.put(key, SignedRecord(signed, expiration_time))

    def put(self, key: str, record: SignedRecord) -> None:
        """Serve ``record`` under ``key`` from now on, dropping the oldest beyond ``capacity``."""
        with self._lock:
            self._records[key] = record
            while len(self._records) > self.capacity:
                self._records.popitem(last=False)

    def get(self, key: str) -> SignedRecord | None:
        """The record under ``key`` unless it expired or was dropped."""
        with self._lock:
            record = self._records.get(key)
        if record is None or record.expiration_time < self._clock.time():
            return None
        return record

    def live(self) -> list[tuple[str, SignedRecord]]:
        """``(key, record)`` of every record served and not expired, oldest first."""
        now = self._clock.time()
        with self._lock:
            return [(key, record) for key, record in self._records.items() if record.expiration_time >= now]

    async def handle(self, request: BytesValue, context: Any = None) -> BytesValue:
        """The RPC handler, ungated: ``request.value`` is a record key; the answer holds the record
        (:func:`encode_answer`), or nothing if this peer does not serve it. A peer's p2pd answers through
        :meth:`swarm.serve_gate.ServeGate.wrap` instead, which bounds what one peer's requests take."""
        return self.answer(self.lookup(request.value))

    def lookup(self, key: bytes) -> SignedRecord | None:
        """The record a request for ``key`` (its bytes as asked) is answered with; None: not served."""
        return None if len(key) > _MAX_KEY_BYTES else self.get(key.decode("utf-8", errors="replace"))

    @staticmethod
    def answer_bytes(record: SignedRecord) -> int:
        """The size of ``record``'s answer at most (:func:`encode_answer`: its value and a few bytes of envelope)."""
        return len(record.value) + _ENVELOPE_BYTES

    def answer(self, record: SignedRecord | None) -> BytesValue:
        """The answer holding ``record`` (None: empty, a miss), counted."""
        if record is None:
            self._counters.add("served_misses")
            return BytesValue()
        answer = encode_answer(record)
        self._counters.add("served_requests")
        self._counters.add("served_bytes", len(answer))
        return BytesValue(value=answer)


def encode_answer(record: SignedRecord) -> bytes:
    """A record on the wire: msgpack ``[value, expiration_time]``."""
    return msgpack.packb([record.value, record.expiration_time], use_bin_type=True)


def decode_answer(data: bytes, max_bytes: int) -> SignedRecord | None:
    """The record of an answer (``None``: the publisher does not serve it); raises :class:`RecordRejected` on an
    answer that is no record or is larger than ``max_bytes``. Only the envelope is decoded here, typed (a byte string
    and a time): the record inside stays the signed bytes, decoded only once its signature has been checked
    (:meth:`ServedLookup.open`)."""
    if not data:
        return None
    check_size(data, max_bytes, "served record")
    value, expiration_time = decode_typed(data, _ANSWER, "served record")
    return SignedRecord(value, expiration_time)


_ANSWER = msgspec.msgpack.Decoder(tuple[bytes, _TIME])  # [signed value, expiration time]


class ServedLookup(Protocol):
    """What a reader needs to fetch a record from its publisher and check it."""

    async def get_served(self, host: str, key: str) -> SignedRecord | None:
        """The record ``host`` serves under ``key`` (``None``: it does not); raises on a network failure or a
        malformed answer (:class:`RecordRejected`)."""
        ...

    def open(self, key: str, subkey: bytes, record: SignedRecord) -> bytes | None:
        """The record's application bytes if it is signed by the owner of ``subkey`` for ``key`` and passes the
        DHT's checks; ``None`` if not (the rejection is counted)."""
        ...


class _CheckingLookup:
    """What both lookups share: fetched records pass the reading peer's DHT validator.

    Args:
        validator: the reading peer's DHT validator: a fetched record passes the checks a DHT lookup applies.
    """

    def __init__(self, validator: Any):
        self._validator = validator

    def open(self, key: str, subkey: bytes, record: SignedRecord) -> bytes | None:
        """See :class:`ServedLookup`."""
        return open_served(self._validator, key, subkey, record.value, record.expiration_time)


class PeerServedLookup(_CheckingLookup):
    """Fetches records from their publishers through this peer's p2pd.

    Args:
        call: returns the running peer's ``call_protobuf_handler`` (hivemind's :class:`~hivemind.p2p.P2P`).
        validator: see :class:`_CheckingLookup`.
        max_bytes: the largest answer accepted (a record's limit plus its signature and envelope).
    """

    def __init__(self, call: Callable[[], Any], validator: Any, max_bytes: int):
        super().__init__(validator)
        self._call = call
        self._max_bytes = max_bytes

    async def get_served(self, host: str, key: str) -> SignedRecord | None:
        """Ask ``host`` for the record under ``key``; see :class:`ServedLookup`."""
        from hivemind.p2p import PeerID

        try:
            peer_id = PeerID.from_base58(host)
        except Exception:
            raise RecordRejected("schema", f"index entry names host {host[:60]!r}, not a libp2p peer id") from None
        answer = await self._call()(peer_id, RECORD_HANDLER, BytesValue(value=key.encode()), BytesValue)
        return decode_answer(answer.value, self._max_bytes)


class MemoryServedLookup(_CheckingLookup):
    """:class:`ServedLookup` over :class:`ServedRecords` in this process, by host: unit tests and simulations.

    Args:
        validator: see :class:`_CheckingLookup`.
        hosts: the publishers' :class:`ServedRecords` by host, shared by every peer's lookup.
    """

    def __init__(self, validator: Any, hosts: dict[str, ServedRecords]) -> None:
        super().__init__(validator)
        self.hosts = hosts
        self.bytes_read = 0

    async def get_served(self, host: str, key: str) -> SignedRecord | None:
        """The record ``host``'s :class:`ServedRecords` holds, through the RPC handler's encoding; a host that is not
        here fails as an unreachable peer does."""
        if host not in self.hosts:
            raise ConnectionError(f"host {host} is not reachable")
        answer = await self.hosts[host].handle(BytesValue(value=key.encode()))
        self.bytes_read += len(answer.value)
        return decode_answer(answer.value, 1 << 30)
