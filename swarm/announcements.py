"""Announcements: the small signed message a peer pushes when it has a new record, and its strict validation.

An announcement tells the swarm "peer S (model M) serves record ``seq`` of ``num_groups`` groups, ``size`` bytes,
with this digest, of these tasks, from libp2p host H". It carries the sender's RSA public key and its signature over
the swarm's name and the payload, so a receiver checks it as strictly as a record: the signature, the schema, every
size, the clock, the sender's membership of a closed swarm (:mod:`swarm.membership`) and that the libp2p peer that
published it is the host it names (a copy re-published by another peer is refused). The digest binds the record a
reader later fetches to what was announced. An announcement without records says "still here".

On the wire: msgpack ``[payload, public key, signature]``; ``payload`` is msgpack of a map (see
:func:`encode_announcement`), the public key is the binary of the sender's OpenSSH RSA key (its identity is
:func:`swarm.validation.fingerprint` of the OpenSSH form) and the signature is RSA-PSS over
:func:`signed_bytes`. About 700 bytes with one record.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgpack
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

from swarm.records import (
    WIRE_VERSION,
    RecordLimits,
    RecordRejected,
    _check_version,
    _expect_int,
    _expect_list,
    _expect_map,
    _expect_str,
    _expect_time,
    _unpack,
)
from swarm.validation import fingerprint

MAX_ANNOUNCEMENT_BYTES = 2048
"""The largest announcement accepted or sent."""

MAX_ANNOUNCED_RECORDS = 4
"""Record references in one announcement (the newest few, so a reader that missed one still learns of it)."""

MAX_TASKS_PER_RECORD = 8
"""Task names listed per announced record; a record of more tasks lists the first ones."""

DIGEST_BYTES = 32
"""A record's digest: the SHA-256 of its encoded bytes."""

_SSH_RSA = b"ssh-rsa "
_PAYLOAD_KEYS = {"version", "model", "updated_at", "host", "records"}


@dataclass(frozen=True)
class AnnouncedRecord:
    """One record an announcement lists.

    Parameters:
        seq (`int`): the record's sequence number (its DHT key is ``records/<sender>/<seq>``).
        created_at (`float`): when the record was made (the publisher's clock).
        num_groups (`int`): groups in it.
        size (`int`): its encoded bytes.
        digest (`bytes`): SHA-256 of its encoded bytes.
        tasks (`tuple[str, ...]`): the tasks of its groups' questions (at most :data:`MAX_TASKS_PER_RECORD`).
    """

    seq: int
    created_at: float
    num_groups: int
    size: int
    digest: bytes
    tasks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Announcement:
    """A verified announcement.

    Parameters:
        sender (`str`): the sender's identity (fingerprint of its public key).
        public_key (`bytes`): the sender's OpenSSH public key (its records' owner marker holds it).
        model (`str`): the model the sender advertises.
        updated_at (`float`): when it was made (the sender's clock).
        host (`str` or `None`): the libp2p peer id that serves the records; ``None``: they are in the DHT.
        records (`tuple[AnnouncedRecord, ...]`): the newest records, newest last; empty: "still here".
    """

    sender: str
    public_key: bytes
    model: str
    updated_at: float
    host: str | None
    records: tuple[AnnouncedRecord, ...] = field(default_factory=tuple)


def record_digest(data: bytes) -> bytes:
    """The digest an announcement gives of a record's encoded bytes."""
    return hashlib.sha256(data).digest()


def signed_bytes(swarm_name: str, payload: bytes) -> bytes:
    """What the sender signs: the swarm's name binds an announcement to one swarm."""
    return b"sapo-swarm/announcement\x00" + swarm_name.encode() + b"\x00" + payload


def encode_announcement(
    signing_key: RSAPrivateKey,
    swarm_name: str,
    model: str,
    updated_at: float,
    host: str | None,
    records: Sequence[AnnouncedRecord],
    limits: RecordLimits = RecordLimits(),
) -> bytes:
    """A signed announcement, checked as a receiver will check it (raises :class:`RecordRejected` if it breaks a
    limit: a bug of the caller)."""
    payload = msgpack.packb(
        {
            "version": WIRE_VERSION,
            "model": model,
            "updated_at": updated_at,
            "host": host,
            "records": [
                [r.seq, r.created_at, r.num_groups, r.size, r.digest, list(r.tasks[:MAX_TASKS_PER_RECORD])]
                for r in records[-MAX_ANNOUNCED_RECORDS:]
            ],
        },
        use_bin_type=True,
    )
    public_key = signing_key.get_public_key().to_bytes()
    key_blob = base64.b64decode(public_key[len(_SSH_RSA) :])
    signature = base64.b64decode(signing_key.sign(signed_bytes(swarm_name, payload)))
    data = msgpack.packb([payload, key_blob, signature], use_bin_type=True)
    decode_announcement(data, swarm_name, limits)
    return data


def decode_announcement(data: bytes, swarm_name: str, limits: RecordLimits = RecordLimits()) -> Announcement:
    """Check and decode an announcement of swarm ``swarm_name``; raises :class:`RecordRejected` (``too_large``,
    ``not_msgpack``, ``schema``, ``wrong_version``, ``field_too_long``, ``bad_signature``)."""
    if not isinstance(data, bytes | bytearray) or len(data) > MAX_ANNOUNCEMENT_BYTES:
        raise RecordRejected("too_large", f"announcement of {len(data)} bytes > {MAX_ANNOUNCEMENT_BYTES}")
    envelope = _unpack(bytes(data), limits)
    if not isinstance(envelope, list) or len(envelope) != 3 or not all(isinstance(x, bytes) for x in envelope):
        raise RecordRejected("schema", "an announcement is [payload, public key, signature], all bytes")
    payload, key_blob, signature = envelope
    public_key = _SSH_RSA + base64.b64encode(key_blob)
    if not _verify(public_key, signed_bytes(swarm_name, payload), base64.b64encode(signature)):
        raise RecordRejected("bad_signature", "announcement not signed by the key it carries")
    fields = _unpack(payload, limits)
    _check_version(fields, "announcement")
    fields = _expect_map(fields, _PAYLOAD_KEYS, "announcement")
    host = fields["host"]
    records = []
    for item in _expect_list(fields["records"], "announcement.records", MAX_ANNOUNCED_RECORDS, "schema"):
        records.append(_announced_record(item, limits))
    return Announcement(
        sender=fingerprint(public_key),
        public_key=public_key,
        model=_expect_str(fields["model"], "announcement.model", limits.max_field_chars),
        updated_at=_expect_time(fields["updated_at"], "announcement.updated_at"),
        host=None if host is None else _expect_str(host, "announcement.host", 128),
        records=tuple(records),
    )


def _announced_record(item: object, limits: RecordLimits) -> AnnouncedRecord:
    ref = _expect_list(item, "announced record", 6, "schema")
    if len(ref) != 6:
        raise RecordRejected("schema", "an announced record is [seq, created_at, num_groups, size, digest, tasks]")
    seq, created_at, num_groups, size, digest, tasks = ref
    num_groups = _expect_int(num_groups, "announced num_groups")
    size = _expect_int(size, "announced size")
    if not 0 < num_groups <= limits.max_groups_per_record:
        raise RecordRejected("too_many_groups", f"announced record of {num_groups} groups")
    if not 0 < size <= limits.max_record_bytes:
        raise RecordRejected("too_large", f"announced record of {size} bytes > {limits.max_record_bytes}")
    if not isinstance(digest, bytes) or len(digest) != DIGEST_BYTES:
        raise RecordRejected("schema", "an announced digest is 32 bytes")
    names = _expect_list(tasks, "announced tasks", MAX_TASKS_PER_RECORD, "field_too_long")
    return AnnouncedRecord(
        seq=_expect_int(seq, "announced seq"),
        created_at=_expect_time(created_at, "announced created_at"),
        num_groups=num_groups,
        size=size,
        digest=digest,
        tasks=tuple(_expect_str(name, "announced task", limits.max_field_chars) for name in names),
    )


def _verify(public_key: bytes, data: bytes, signature: bytes) -> bool:
    try:
        return _public_key(public_key).verify(data, signature)
    except Exception:  # a key that does not parse: the announcement is refused, never raised
        return False


@functools.lru_cache(maxsize=4096)
def _public_key(public_key: bytes) -> RSAPublicKey:
    return RSAPublicKey.from_bytes(public_key)
