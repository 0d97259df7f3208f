"""DHT-layer record validators of the swarm: owner signatures and the wire schema, with rejection counters.

hivemind calls a validator on every record another peer asks this node to store and on every record a
peer returns to a lookup. What arrives there is one layer below the application values:

- ``record.key`` is the 20-byte hash (``DHTID``) of the application key, so the validator cannot read
  the key; it recognises the index-shard keys (every level's, see :func:`index_keys`) by their
  precomputed hashes and treats every other key as a records key (the DHT is dedicated to one swarm);
- ``record.subkey`` is the msgpack-serialized subkey, which must be exactly one ``[owner:<ssh-rsa key>]`` marker
  (:func:`subkey_owner` decodes it typed, its size checked first) of a key of the swarm's one shape
  (:func:`swarm.identity.check_public_key`), checked before the signature is;
- ``record.value`` is the msgpack-serialized application value (here always ``bytes``: an encoded
  :class:`~swarm.records.GroupRecord` or :class:`~swarm.records.IndexEntry`) with a
  ``[signature:...]`` suffix that the signature validator checks and strips before the schema
  validator sees it; the schema validator decodes it typed (:func:`dht_value`), as a bin, and then the bytes inside
  as the record kind its key holds. Nothing here unpacks a peer's bytes into generic Python objects.

What hivemind itself unpacks before a validator sees it (a dictionary value of a store request or of a lookup's
answer) goes through the typed serializer of :mod:`swarm.dht_values`, which a swarm's DHT node uses.

Both validators count every rejection in a :class:`~swarm.transport.SwarmCounters` under a reason of
:data:`swarm.records.REJECT_REASONS`, and log it at a bounded rate.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord, RecordValidatorBase
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.serializer import MSGPackSerializer
from msgspec.msgpack import Decoder

from swarm.identity import KEY_BITS, check_public_key, public_key_of
from swarm.records import RecordLimits, RecordRejected, check_size, decode_index_entry, decode_record, decode_typed
from swarm.transport import SwarmCounters

logger = logging.getLogger(__name__)

# hivemind's marker ([owner:<key>], RSASignatureValidator.PUBLIC_KEY_FORMAT), whose key (base64) has no "]"
_OWNER_RE = re.compile(rb"\[owner:([^\]]+)\]")


def fingerprint(public_key: bytes) -> str:
    """Short identity of a peer: the first 16 hex characters of the SHA-256 of its OpenSSH public key."""
    return hashlib.sha256(public_key).hexdigest()[:16]


def owner_marker(public_key: bytes) -> bytes:
    """The subkey that protects a record with ``public_key`` (hivemind's ``[owner:...]`` format)."""
    return RSASignatureValidator.PUBLIC_KEY_FORMAT.replace(b"_key_", public_key)


def owner_public_key(subkey: Any) -> bytes | None:
    """The public key of an application subkey that is exactly one owner marker, else ``None``."""
    if not isinstance(subkey, bytes):
        return None
    match = _OWNER_RE.fullmatch(subkey)
    return match.group(1) if match else None


MAX_SUBKEY_BYTES = 1024
"""The largest serialized subkey taken: an owner marker of a swarm key is 388 bytes, 391 serialized."""

_BYTES = Decoder(bytes)


def dht_value(serialized: bytes, max_bytes: int, what: str = "DHT value") -> bytes:
    """The application bytes of a serialized DHT value or subkey (msgpack of one byte string), decoded typed after
    its size is checked; raises :class:`~swarm.records.RecordRejected`."""
    check_size(serialized, max_bytes, what)
    return decode_typed(serialized, _BYTES, what)


def subkey_owner(serialized: bytes) -> bytes:
    """The public key of a serialized subkey that is exactly one owner marker of a key of the swarm's shape; raises
    :class:`~swarm.records.RecordRejected` (``bad_signature`` for no marker, ``bad_key`` for another key)."""
    try:
        public_key = owner_public_key(dht_value(serialized, MAX_SUBKEY_BYTES, "subkey"))
    except RecordRejected as e:
        raise RecordRejected("bad_signature", f"a subkey that is no owner marker ({e.reason}: {e.detail})") from None
    if public_key is None:
        raise RecordRejected("bad_signature", "record without an [owner:...] subkey")
    check_public_key(public_key)
    return public_key


class RejectionLog:
    """Counts rejections by reason and logs them at most once per reason every ``interval`` seconds."""

    def __init__(self, counters: SwarmCounters, interval: float = 10.0):
        self.counters = counters
        self.interval = interval
        self._lock = threading.Lock()
        self._last_logged: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def __call__(self, reason: str, detail: str) -> None:
        """Count one rejection under ``rejected/<reason>`` and maybe log it."""
        self.counters.reject(reason)
        now = time.monotonic()
        with self._lock:
            self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
            if now - self._last_logged.get(reason, -float("inf")) < self.interval:
                return
            count, self._unlogged[reason] = self._unlogged[reason], 0
            self._last_logged[reason] = now
        logger.warning("rejected %d record(s) as %s (latest: %s)", count, reason, detail[:200])


class OwnerSignatureValidator(RSASignatureValidator):
    """hivemind's owner-signature check with an explicit key, refusing unprotected records, counting failures.

    The DHT is dedicated to the swarm, so a record whose subkey is not exactly one ``[owner:...]`` marker is
    refused rather than accepted as hivemind does for unprotected records, and so is a marker of a key of another
    size or exponent (``bad_key``), before its signature is verified. The signature is hivemind's (its format, what
    it signs), found in linear time (:func:`split_signature`): hivemind's own regex takes time quadratic in the
    value's length on repeated ``[signature:`` openings, and formats the whole value into a log message it drops.
    """

    def __init__(self, private_key: RSAPrivateKey, on_reject: Callable[[str, str], None]):
        super().__init__(private_key)
        self._on_reject = on_reject

    def validate(self, record: DHTRecord) -> bool:
        """True if the subkey names an owner and the value carries that owner's valid signature."""
        try:
            public_key = subkey_owner(record.subkey)
            value, signature = split_signature(record.value)
            signed = self._serialize_record(dataclasses.replace(record, value=value))
            if not public_key_of(public_key).verify(signed, signature):
                raise RecordRejected("bad_signature", "signature not made by the subkey's owner")
            return True
        except RecordRejected as e:
            self._on_reject(e.reason, e.detail)
            return False
        except Exception as e:  # hostile bytes may break key parsing: a rejection, never a crash
            self._on_reject("bad_signature", f"{type(e).__name__}: {e}")
            return False

    def strip_value(self, record: DHTRecord) -> bytes:
        """The value without its signature (hivemind strips after a record passed: the suffix is known to be there)."""
        at = record.value.rfind(_SIGNATURE_OPENING)
        return record.value[:at] if at >= 0 and record.value.endswith(b"]") else record.value


_SIGNATURE_OPENING = b"[signature:"  # RSASignatureValidator.SIGNATURE_FORMAT up to its value
_SIGNATURE_CHARS = 4 * ((KEY_BITS // 8 + 2) // 3)  # a signature of a swarm key in base64: 344 characters


def split_signature(value: bytes) -> tuple[bytes, bytes]:
    """``(value, signature)`` of a value signed as hivemind signs it (``value + b"[signature:<base64>]"``), with
    exactly one signature; raises :class:`~swarm.records.RecordRejected` (``bad_signature``). Linear in the value's
    length."""
    at = value.rfind(_SIGNATURE_OPENING)
    signature = value[at + len(_SIGNATURE_OPENING) : -1] if at >= 0 and value.endswith(b"]") else b""
    if len(signature) != _SIGNATURE_CHARS or b"]" in signature or value.count(_SIGNATURE_OPENING) != 1:
        raise RecordRejected("bad_signature", "a value must end with exactly one [signature:...] of a swarm key")
    return value[:at], signature


class SwarmSchemaValidator(RecordValidatorBase):
    """Checks that a (signature-stripped) value is an encoded GroupRecord or IndexEntry within ``limits``.

    Parameters:
        swarm_name: the swarm's key prefix (see :func:`index_keys` for the index layout).
        index_shards: number of index shards of level 0.
        limits: the limits this peer enforces.
        on_reject: called with ``(reason, detail)`` for each rejection.
        max_ttl: the latest expiration accepted, in seconds from now (``None``: any). Bounds what a peer can
            be made to keep: without it, a hostile peer could store records that never expire.
        index_max_level: the index's highest level; the keys of levels 0 to it are index keys.
    """

    def __init__(
        self,
        swarm_name: str,
        index_shards: int,
        limits: RecordLimits,
        on_reject: Callable[[str, str], None],
        max_ttl: float | None = None,
        *,
        index_max_level: int,
    ):
        self.limits = limits
        self.max_ttl = max_ttl
        self._on_reject = on_reject
        self._index_key_ids = index_key_ids(swarm_name, index_shards, index_max_level)

    @property
    def priority(self) -> int:
        # Lower than the signature validator's 10: hivemind validates from high to low priority and strips
        # the signature in between, so this one sees the plain serialized value.
        return 0

    def validate(self, record: DHTRecord) -> bool:
        """True if the value decodes as the record kind its key holds, within the limits."""
        try:
            if self.max_ttl is not None and record.expiration_time > time.time() + self.max_ttl:
                raise RecordRejected(
                    "ttl_too_long", f"expires in {record.expiration_time - time.time():.0f} s > {self.max_ttl:.0f} s"
                )
            # The limit applies to the application bytes; the msgpack bin header adds at most 5 bytes.
            value = dht_value(record.value, self.limits.max_record_bytes + 5)
            if record.key in self._index_key_ids:
                decode_index_entry(value, self.limits)
            else:
                decode_record(value, self.limits)
            return True
        except RecordRejected as e:
            self._on_reject(e.reason, e.detail)
            return False
        except Exception as e:  # a validator must answer, whatever arrives
            self._on_reject("schema", f"{type(e).__name__}: {e}")
            return False


def index_keys(swarm_name: str, index_shards: int, level: int = 0) -> list[str]:
    """The DHT keys of the index shards of ``level``: ``index_shards * 2**level`` of them.

    The index has levels so that a reader's cost does not grow with the swarm: every level lists every peer (that
    writes to it), split over twice as many shards as the level below, so a reader picks the level whose shards
    hold a few entries each. Level 0 keys are ``f"{swarm_name}/index/{shard}"`` (as before levels existed), level
    ``l >= 1`` keys are ``f"{swarm_name}/index/L{l}/{shard}"``. Peer ``sender`` writes to shard
    :func:`index_shard_of` of each level it writes.
    """
    return [_index_key(swarm_name, level, shard) for shard in range(index_shards << level)]


def _index_key(swarm_name: str, level: int, shard: int) -> str:
    return f"{swarm_name}/index/{shard}" if level == 0 else f"{swarm_name}/index/L{level}/{shard}"


def index_shard_of(sender: str, index_shards: int, level: int) -> int:
    """The shard of ``level`` that holds peer ``sender``'s entry: a hash of its id modulo the level's shard count, so
    shards fill evenly and a peer's shard at level ``l + 1`` is one of the two halves of its shard at level ``l``."""
    return int(hashlib.sha256(sender.encode()).hexdigest(), 16) % (index_shards << level)


def index_key_of(swarm_name: str, index_shards: int, level: int, sender: str) -> str:
    """The DHT key of the index shard of ``level`` that holds peer ``sender``'s entry."""
    return _index_key(swarm_name, level, index_shard_of(sender, index_shards, level))


@functools.lru_cache(maxsize=4)
def index_key_ids(swarm_name: str, index_shards: int, max_level: int) -> frozenset[bytes]:
    """The DHT hashes of every index key of levels 0 to ``max_level`` (computed once per layout: 16376 keys take
    ~70 ms with 8 shards and 10 levels)."""
    return frozenset(
        DHTID.generate(source=key).to_bytes()
        for level in range(max_level + 1)
        for key in index_keys(swarm_name, index_shards, level)
    )


def record_key(swarm_name: str, sender: str, seq: int) -> str:
    """The DHT key of record ``seq`` of peer ``sender`` (the writer and the reader must agree on it)."""
    return f"{swarm_name}/records/{sender}/{seq}"


def make_record_validator(
    private_key: RSAPrivateKey,
    swarm_name: str,
    index_shards: int,
    limits: RecordLimits,
    on_reject: Callable[[str, str], None],
    extra: Iterable[RecordValidatorBase] = (),
    max_ttl: float | None = None,
    *,
    index_max_level: int,
) -> CompositeValidator:
    """The validator a swarm DHTNode runs: owner signature first, then the wire schema."""
    return CompositeValidator(
        [
            OwnerSignatureValidator(private_key, on_reject),
            SwarmSchemaValidator(
                swarm_name, index_shards, limits, on_reject, max_ttl=max_ttl, index_max_level=index_max_level
            ),
            *extra,
        ]
    )


def sign_for_serving(
    validator: RecordValidatorBase, key: str, subkey: bytes, value: bytes, expiration_time: float
) -> bytes:
    """``value`` serialized and signed exactly as a DHT store of it under ``key`` and ``subkey`` would carry it, so
    that a peer fetching it from its publisher (:mod:`swarm.served`) checks it with the validator its DHT runs."""
    record = DHTRecord(_key_id(key), MSGPackSerializer.dumps(subkey), MSGPackSerializer.dumps(value), expiration_time)
    return validator.sign_value(record)


def open_served(
    validator: RecordValidatorBase, key: str, subkey: bytes, signed: bytes, expiration_time: float
) -> bytes | None:
    """The application bytes of a record fetched from its publisher, if ``validator`` accepts it under ``key`` and
    ``subkey`` (owner signature, schema, ttl: the checks of a DHT lookup); ``None`` if not (the validator has
    counted the rejection)."""
    record = DHTRecord(_key_id(key), MSGPackSerializer.dumps(subkey), signed, expiration_time)
    if not validator.validate(record):
        return None
    try:  # the validator has decoded it already; typed again all the same, never a generic unpack
        return dht_value(validator.strip_value(record), len(signed))
    except RecordRejected:
        return None


@functools.lru_cache(maxsize=4096)
def _key_id(key: str) -> bytes:
    return DHTID.generate(source=key).to_bytes()
