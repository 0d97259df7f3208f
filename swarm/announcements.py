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
:func:`signed_bytes`. About 700 bytes with one record. The payload is checked, once the signature is, by a typed
schema (msgspec Structs, :func:`_payload_schema`) as a record is in :mod:`swarm.records`.
"""

# No `from __future__ import annotations` here: msgspec reads the annotations of the Structs that _payload_schema
# builds, and they name that function's local types (the limits), which only evaluated annotations can.
import base64
import dataclasses
import functools
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgpack
import msgspec
from hivemind.utils.crypto import RSAPrivateKey
from msgspec import Meta, Struct

from swarm.identity import check_key_blob, public_key_of
from swarm.records import (
    _INT64,
    _MAX_HOST_CHARS,
    _TIME,
    _VERSION,
    WIRE_VERSION,
    RecordLimits,
    RecordRejected,
    _refuse_repeated_keys,
    _rejection,
    check_claimed_groups,
    check_size,
    decode_typed,
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
    ``not_msgpack``, ``schema``, ``bad_key``, ``bad_signature``, ``wrong_version``, ``field_too_long``,
    ``too_many_groups``). In order: its size, its envelope (three byte strings, decoded typed), the key's size and
    exponent (:func:`swarm.identity.check_key_blob`), the signature, and only then the payload."""
    check_size(data, MAX_ANNOUNCEMENT_BYTES, "announcement")
    payload, key_blob, signature = decode_typed(data, _ENVELOPE, "announcement")
    check_key_blob(key_blob)  # before verifying: what a check costs is not the sender's to choose
    public_key = _SSH_RSA + base64.b64encode(key_blob)
    if not _verify(public_key, signed_bytes(swarm_name, payload), base64.b64encode(signature)):
        raise RecordRejected("bad_signature", "announcement not signed by the key it carries")
    wire = _decode_payload(payload, limits)
    return Announcement(
        sender=fingerprint(public_key),
        public_key=public_key,
        model=wire.model,
        updated_at=wire.updated_at,
        host=wire.host,
        records=tuple(_announced_record(r, limits) for r in wire.records),
    )


_ENVELOPE = msgspec.msgpack.Decoder(tuple[bytes, bytes, bytes])  # [payload, public key, signature]


@functools.lru_cache(maxsize=16)
def _payload_schema(limits: RecordLimits) -> msgspec.msgpack.Decoder:
    """The decoder of an announcement's payload under ``limits``, its msgspec Struct built as
    :func:`swarm.records._schema` builds a record's: unknown and missing keys refused, the limits as length
    constraints, an announced record an array of six."""
    Name = Annotated[str, Meta(max_length=limits.max_field_chars)]

    class WireAnnouncedRecord(Struct, array_like=True, forbid_unknown_fields=True):
        seq: _INT64
        created_at: _TIME
        num_groups: _INT64  # its bounds, the size's and the digest's length are checked by _announced_record
        size: _INT64
        digest: bytes
        tasks: Annotated[list[Name], Meta(max_length=MAX_TASKS_PER_RECORD)]

    class WireAnnouncement(Struct, forbid_unknown_fields=True):
        version: _VERSION
        model: Name
        updated_at: _TIME
        host: Annotated[str, Meta(max_length=_MAX_HOST_CHARS)] | None  # None: the records are in the DHT
        records: Annotated[list[WireAnnouncedRecord], Meta(max_length=MAX_ANNOUNCED_RECORDS)]

    return msgspec.msgpack.Decoder(WireAnnouncement)


# More records than MAX_ANNOUNCED_RECORDS make a malformed announcement, not a record of too many groups (the reason
# swarm.records gives an index entry's list); any other list or string over its limit is field_too_long.
_LENGTH_REASONS = {"records": "schema"}
_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(AnnouncedRecord))  # an announced record's wire order
# msgspec names an announced record's field by its position ("- at `$.records[0][4]`"); only its own messages, which
# start "Expected", are read, so that an unknown key's name, which a message quotes, cannot pass for a path.
_AT_RECORD_FIELD = re.compile(r"Expected .* - at `\$\.records\[(?P<record>\d+)\]\[(?P<field>\d)\](?:\[\d+\])?`")


def _decode_payload(payload: bytes, limits: RecordLimits) -> Any:
    """The payload, decoded typed, as its Struct; raises :class:`RecordRejected` naming the field at fault."""
    try:
        wire = _payload_schema(limits).decode(payload)
    except msgspec.ValidationError as e:
        rejection = _rejection(e, _LENGTH_REASONS)
        at = _AT_RECORD_FIELD.fullmatch(rejection.detail)
        named = "" if at is None else f" (announced record {at['record']}'s {_RECORD_FIELDS[int(at['field'])]})"
        raise RecordRejected(rejection.reason, f"announcement: {rejection.detail}{named}") from None
    except Exception as e:  # malformed msgpack, nesting past the decoder's depth
        raise RecordRejected("not_msgpack", f"announcement payload: {type(e).__name__}: {e}") from None
    _refuse_repeated_keys(payload, {})
    return wire


def _announced_record(r: Any, limits: RecordLimits) -> AnnouncedRecord:
    # Checked here rather than as msgspec bounds: _rejection reads a reason from a length limit only, and these have
    # reasons of their own (a digest over 32 bytes is malformed, not a field over its limit).
    check_claimed_groups(r.num_groups, limits, "announced record")
    if not 0 < r.size <= limits.max_record_bytes:
        bound = limits.max_record_bytes
        raise RecordRejected("too_large", f"announced record of {r.size} bytes, not in 1..{bound}")
    if len(r.digest) != DIGEST_BYTES:
        raise RecordRejected("schema", f"an announced digest is {DIGEST_BYTES} bytes (SHA-256), got {len(r.digest)}")
    return AnnouncedRecord(r.seq, r.created_at, r.num_groups, r.size, r.digest, tuple(r.tasks))


def _verify(public_key: bytes, data: bytes, signature: bytes) -> bool:
    try:
        return public_key_of(public_key).verify(data, signature)
    except Exception:  # a key that does not parse: the announcement is refused, never raised
        return False
