"""Wire schema of shared groups: dataclasses, size limits and strict msgpack (de)serialization.

A *group* is one question (chat messages) with the G completions a peer generated for it, as decoded
text. Peers publish groups in *records* (the groups of one publish call) and advertise their records
in small *index entries*. Nothing but text, numbers and booleans crosses the wire: no tensors, no
pickle. Every decoder here is strict: an unknown key, a wrong type or a size over the configured
limits raises :class:`RecordRejected` with a reason from :data:`REJECT_REASONS`, so callers can
count rejections by kind instead of crashing on them. The checks are a typed schema, msgspec Structs
(:func:`_schema`): a peer's bytes are decoded into them in one typed pass, with their size checked first, so a hostile
input is refused before it costs more than its own bytes (no generic unpack into Python objects, whose garbage a
few MiB of empty arrays make take seconds); a map that repeats a key is refused too (:func:`_refuse_repeated_keys`).
"""

# No `from __future__ import annotations` here: msgspec reads the annotations of the Structs that _schema builds,
# and they name that function's local types (the limits), which only evaluated annotations can.
import functools
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, NamedTuple

import msgpack
import msgspec
from msgspec import UNSET, Meta, Raw, Struct, UnsetType

WIRE_VERSION = 1
"""Version of the wire format below; a peer rejects records of any other version."""

REJECT_REASONS = (
    "not_msgpack",  # bytes that do not decode as one msgpack object
    "wrong_version",  # a record of another wire version (the version is the integer WIRE_VERSION, nothing else)
    "schema",  # wrong keys or types, or a map that repeats a key
    "too_large",  # over max_record_bytes
    "too_many_groups",  # over max_groups_per_record
    "too_many_completions",  # over max_completions_per_group
    "completion_too_long",  # a completion over max_completion_chars
    "prompt_too_long",  # prompt over max_prompt_chars or max_prompt_messages
    "field_too_long",  # a name, provenance or metadata field over its limit
    "empty_group",  # no completions, or every completion is empty
    "bad_signature",  # owner marker or signature missing or wrong (DHT layer)
    "bad_key",  # a signing key other than RSA-2048 with exponent 65537, refused before any signature check
    "expired",  # older than the reader's maximum age, or expired in the DHT
    "ttl_too_long",  # stored to expire later than the swarm's record ttl allows (would outlive expiry)
    "clock_skew",  # created in the future beyond the tolerated clock difference
    "digest_mismatch",  # a fetched record is not the one its sender announced
    "not_member",  # from a peer outside a closed swarm's membership
    "wrong_host",  # an announcement published by another libp2p peer than the host it names
    "sender_rested",  # stored by a libp2p peer resting after its stores were mostly refused, refused unverified
    "store_budget",  # stored by a libp2p peer beyond its budget of value bytes or values per window, refused unverified
    "store_host_budget",  # stored by a peer whose host's peers went beyond their budget together, refused unverified
    # find requests (swarm/find_gate.py), each counted once, answered empty with nothing looked up:
    "find_too_many_keys",  # naming more keys than one find may (MAX_FIND_KEYS); honest lookups name a handful
    "find_budget",  # from a libp2p peer whose finds went beyond its budget of keys or answer bytes a window (rests)
    "find_rested",  # from a libp2p peer resting after its finds went beyond its budget
    "find_host_budget",  # from a peer whose host's peers went beyond their shared budget together (no rest)
    # record requests to this publisher (swarm/serve_gate.py), each counted once, answered empty with nothing encoded:
    "serve_budget",  # from a libp2p peer beyond its budget of requests or answer bytes a window (rests)
    "serve_repeat",  # asking again for records already answered to it, beyond the retries a reader makes (rests)
    "serve_rested",  # from a libp2p peer resting after its requests went beyond its budget (nothing looked up)
    "serve_host_budget",  # from a peer whose host's peers went beyond their shared budget together (no rest)
    # pings (swarm/ping_gate.py), each counted once, answered "not available" with nothing looked at:
    "ping_budget",  # from a libp2p peer whose pings went beyond its budget a window (PING_BUDGET; it rests)
    "ping_rested",  # from a libp2p peer resting after its pings went beyond its budget
    "ping_host_budget",  # from a peer whose host's peers went beyond their shared budget together (no rest)
    # announcements (swarm/announcement_gate.py), each counted once, dropped unread:
    "announce_budget",  # from a publisher beyond its budget a window (PUBLISHER_BUDGET; it rests)
    "announce_rested",  # from a publisher resting after going beyond its budget or being mostly refused
    "announce_strangers",  # from a publisher with none taken yet, beyond the strangers' shared budget (no rest)
)

Scalar = str | int | float | bool | None


class RecordRejected(ValueError):
    """A record or group that fails validation; ``reason`` is one of :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, detail: str):
        if reason not in REJECT_REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}; expected one of {REJECT_REASONS}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class RecordLimits:
    """Size limits a peer enforces on everything it publishes and everything that arrives.

    Parameters:
        max_record_bytes (`int`, defaults to `3 * 2**20`):
            Encoded size of one record. hivemind refuses messages over 4 MiB
            (`persistent_conn_max_msg_size`), so keep this below that with room for the signature.
        max_groups_per_record (`int`, defaults to `64`):
            Groups in one record (one publish call).
        max_completions_per_group (`int`, defaults to `64`):
            Completions (G) in one group.
        max_completion_chars (`int`, defaults to `32768`):
            Characters in one completion.
        max_prompt_chars (`int`, defaults to `32768`):
            Characters over all messages of one prompt.
        max_prompt_messages (`int`, defaults to `32`):
            Chat messages in one prompt.
        max_field_chars (`int`, defaults to `1024`):
            Characters in a short text field (model name, role, provenance names, metadata keys).
        max_metadata_items (`int`, defaults to `32`):
            Entries in a group's metadata and in its provenance config.
        max_metadata_value_chars (`int`, defaults to `8192`):
            Characters in one metadata or provenance-config string value.
        max_index_records (`int`, defaults to `32`):
            Record references in one index entry.
    """

    max_record_bytes: int = 3 * 2**20
    max_groups_per_record: int = 64
    max_completions_per_group: int = 64
    max_completion_chars: int = 32768
    max_prompt_chars: int = 32768
    max_prompt_messages: int = 32
    max_field_chars: int = 1024
    max_metadata_items: int = 32
    max_metadata_value_chars: int = 8192
    max_index_records: int = 32

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"RecordLimits.{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True, init=False)
class Provenance:
    """Where a question came from, so that a receiver can regenerate and check it.

    Parameters:
        source (`str`):
            Kind of question source: `"reasoning_gym"` (procedural: the receiver regenerates the entry
            from `task`, `config`, `seed` and `index`), `"dataset"` (a named dataset the receiver may
            hold a copy of) or any other string (a custom source).
        task (`str`):
            The task's name within the source, e.g. `"basic_arithmetic"` or a local dataset's name: the value of
            a row's `task` column and of `TaskSpec.name`. On the wire its key is `"dataset"` (the attribute's
            former name), so peers of either version read each other's records; `dataset=` is still accepted
            as a keyword and `.dataset` as an attribute.
        config (`dict[str, Scalar | list[Scalar]]`):
            Generator configuration needed to regenerate the entry (reasoning-gym) or any descriptive
            settings; JSON-like scalars and flat lists of them only.
        seed (`int` or `None`):
            Generator seed (reasoning-gym).
        index (`int` or `None`):
            Entry index within the task.
        version (`str` or `None`):
            The source's version (e.g. reasoning-gym's release, a dataset's declared version): a receiver whose copy
            of the source has another version reports the skew instead of a mismatch. `None`: not stated.
        key (`str` or `None`):
            A durable key of the item within its source, independent of row order (a dataset's content hash), by
            which a receiver finds its own copy of the item. `None`: the source locates items by `seed` and `index`.
    """

    source: str
    task: str
    config: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    index: int | None = None
    version: str | None = None
    key: str | None = None

    def __init__(
        self,
        source: str,
        task: str | None = None,
        config: dict[str, Any] | None = None,
        seed: int | None = None,
        index: int | None = None,
        version: str | None = None,
        key: str | None = None,
        *,
        dataset: str | None = None,
    ):
        # `dataset` (the former name) wins when both are given, so `dataclasses.replace(p, dataset=...)` works.
        task = dataset if dataset is not None else task
        if task is None:
            raise TypeError("Provenance needs a task name (the 'task' argument)")
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "task", task)
        object.__setattr__(self, "config", {} if config is None else config)
        object.__setattr__(self, "seed", seed)
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "key", key)

    @property
    def dataset(self) -> str:
        """The former name of :attr:`task` (and still its wire key)."""
        return self.task


@dataclass(frozen=True)
class Group:
    """One question and the completions a peer generated for it, as decoded text.

    Parameters:
        group_id (`str`):
            Identifier unique among the sender's groups (e.g. `"17-3"`: step 17, group 3).
        prompt (`list[dict[str, str]]`):
            The question as chat messages, each `{"role": ..., "content": ...}`.
        completions (`list[str]`):
            The G completions as decoded text (no chat template, no special tokens).
        provenance (`Provenance`):
            Where the question came from.
        metadata (`dict[str, Scalar]`):
            Anything else the sender attaches (e.g. its claimed answer). Untrusted by receivers.
        model (`str`):
            Name of the sender's policy model.
        step (`int`):
            Sender's training step when the group was generated.
        created_at (`float`):
            Sender's wall-clock time (seconds since the epoch) at generation.
    """

    group_id: str
    prompt: list[dict[str, str]]
    completions: list[str]
    provenance: Provenance
    metadata: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    step: int = 0
    created_at: float = 0.0


@dataclass(frozen=True)
class GroupRecord:
    """The groups of one publish call: the unit stored under one DHT key."""

    groups: list[Group]
    created_at: float
    version: int = WIRE_VERSION


@dataclass(frozen=True)
class RecordRef:
    """A pointer in an index entry to one stored record of the same peer."""

    seq: int
    created_at: float
    num_groups: int


@dataclass(frozen=True)
class IndexEntry:
    """What a peer advertises about itself: its model and its most recent records."""

    model: str
    records: list[RecordRef]
    updated_at: float
    version: int = WIRE_VERSION
    host: str | None = None
    """The libp2p peer id (base58) that serves these records (:mod:`swarm.served`); ``None``: they are in the DHT."""


@dataclass(frozen=True)
class ReceivedGroup:
    """A group as the receiver sees it, tagged with the sender identity the transport verified."""

    sender: str
    group: Group


# ----------------------------------------------------------------------------------------------
# encoding


def provenance_to_wire(provenance: Provenance) -> dict[str, Any]:
    """The plain-dict form of a provenance, as it is packed on the wire (the one serializer of provenance: the JSON
    ``provenance`` column of question rows is this dict too). The task's key is ``"dataset"``; ``version`` and ``key``
    are written only when set, so a provenance without them reads the same to peers that predate them."""
    wire = {
        "source": provenance.source,
        "dataset": provenance.task,
        "config": dict(provenance.config),
        "seed": provenance.seed,
        "index": provenance.index,
    }
    for name in _PROVENANCE_OPTIONAL_KEYS:
        if getattr(provenance, name) is not None:
            wire[name] = getattr(provenance, name)
    return wire


def group_to_wire(group: Group) -> dict[str, Any]:
    """The plain-dict form of a group, as it is packed on the wire."""
    return {
        "group_id": group.group_id,
        "prompt": [{"role": m["role"], "content": m["content"]} for m in group.prompt],
        "completions": list(group.completions),
        "provenance": provenance_to_wire(group.provenance),
        "metadata": dict(group.metadata),
        "model": group.model,
        "step": group.step,
        "created_at": group.created_at,
    }


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def encode_record(record: GroupRecord, limits: RecordLimits = RecordLimits()) -> bytes:
    """Serialize a record after checking it against ``limits``; raises :class:`RecordRejected`.

    The publisher runs the same checks as every receiver, so a peer never stores a record that honest
    peers would reject.
    """
    wire = {
        "version": record.version,
        "created_at": record.created_at,
        "groups": [group_to_wire(g) for g in record.groups],
    }
    data = _pack(wire)
    decode_record(data, limits)  # one validation path for both directions
    return data


def encode_index_entry(entry: IndexEntry, limits: RecordLimits = RecordLimits()) -> bytes:
    """Serialize an index entry after checking it against ``limits``."""
    wire = {
        "version": entry.version,
        "model": entry.model,
        "updated_at": entry.updated_at,
        "records": [[r.seq, r.created_at, r.num_groups] for r in entry.records],
    }
    if entry.host is not None:
        wire["host"] = entry.host
    data = _pack(wire)
    decode_index_entry(data, limits)
    return data


# ----------------------------------------------------------------------------------------------
# decoding and validation


def check_size(data: Any, max_bytes: int, what: str = "record") -> None:
    """Refuse (:class:`RecordRejected`) anything but bytes of at most ``max_bytes``: the check every decoder of a
    peer's bytes makes before it reads them."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise RecordRejected("schema", f"{what}: expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise RecordRejected("too_large", f"{what} of {len(data)} bytes > {max_bytes}")


def decode_typed(data: Any, decoder: msgspec.msgpack.Decoder, what: str = "record") -> Any:
    """``data`` decoded in one typed pass by ``decoder`` (msgspec, with the wire type); its size is the caller's to
    check first (:func:`check_size`). Raises :class:`RecordRejected`: ``not_msgpack`` for bytes that are no msgpack,
    else the reason of the first violation of the type (:func:`_rejection`)."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as e:
        if " - at `" not in str(e) and not _well_formed(data):  # the first value read was not even of its type
            raise RecordRejected("not_msgpack", f"{what}: not one msgpack value ({e})") from None
        raise _rejection(e, _LENGTH_REASONS, what) from None
    except Exception as e:  # malformed msgpack (DecodeError), nesting past the decoder's depth (RecursionError)
        raise RecordRejected("not_msgpack", f"{what}: {type(e).__name__}: {e}") from None


_ANY_VALUE = msgspec.msgpack.Decoder(Raw)  # skips one value whole, allocating nothing: well-formed or not


def _well_formed(data: Any) -> bool:
    """Whether ``data`` is one msgpack value: random bytes usually begin with a valid one of the wrong type, which a
    typed decoder reports first. Linear in the bytes, in C."""
    try:
        _ANY_VALUE.decode(data)
        return True
    except Exception:
        return False


_PROVENANCE_OPTIONAL_KEYS = ("version", "key")  # written only when set: peers that predate them read the rest
_MAX_HOST_CHARS = 128  # a base58 libp2p peer id is 46-53 characters
_INT64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
_FINITE = Annotated[float, Meta(ge=-sys.float_info.max, le=sys.float_info.max)]  # the bounds refuse NaN and inf too
_TIME = Annotated[float, Meta(ge=0, le=sys.float_info.max)]  # seconds since the epoch; an integer reads as a float
_VERSION = Literal[WIRE_VERSION]  # the integer itself: true, 1.0 or "1" are refused (msgspec keeps bool apart from int)


class _Schema(NamedTuple):
    """The wire types under one :class:`RecordLimits`, and the decoders of a record and an index entry."""

    provenance: type[Struct]
    group: type[Struct]
    record: type[Struct]
    index: type[Struct]
    record_decoder: msgspec.msgpack.Decoder
    index_decoder: msgspec.msgpack.Decoder


@functools.lru_cache(maxsize=16)
def _schema(limits: RecordLimits) -> _Schema:
    """msgspec Structs of the wire format that refuse unknown keys, with ``limits`` as length constraints (part of a
    type in msgspec, hence one set of types per limits in use). An optional key reads as UNSET when absent; an
    explicit null there is refused, as the key's type is a string. msgspec checks a length from its header, before
    it reads what the container holds."""
    Name = Annotated[str, Meta(max_length=limits.max_field_chars)]  # local types, named as types
    Value = Annotated[str, Meta(max_length=limits.max_metadata_value_chars)] | _INT64 | _FINITE | bool | None
    ValueList = Annotated[list[Value], Meta(max_length=limits.max_metadata_items)]

    class WireProvenance(Struct, forbid_unknown_fields=True):
        source: Name
        dataset: Name  # the wire key of Provenance.task
        config: Annotated[dict[Name, Value | ValueList], Meta(max_length=limits.max_metadata_items)]
        seed: _INT64 | None
        index: _INT64 | None
        version: Name | UnsetType = UNSET
        key: Name | UnsetType = UNSET

    class WireMessage(Struct, forbid_unknown_fields=True):
        role: Name
        content: Annotated[str, Meta(max_length=limits.max_prompt_chars)]

    class WireGroup(Struct, forbid_unknown_fields=True):
        group_id: Name
        prompt: Annotated[list[WireMessage], Meta(min_length=1, max_length=limits.max_prompt_messages)]
        completions: Annotated[
            list[Annotated[str, Meta(max_length=limits.max_completion_chars)]],
            Meta(max_length=limits.max_completions_per_group),
        ]
        provenance: WireProvenance
        metadata: Annotated[dict[Name, Value], Meta(max_length=limits.max_metadata_items)]
        model: Name
        step: _INT64
        created_at: _TIME

    class WireRecord(Struct, forbid_unknown_fields=True):
        version: _VERSION  # written first: a record of another version is refused as such before its other keys
        created_at: _TIME
        groups: Annotated[list[WireGroup], Meta(max_length=limits.max_groups_per_record)]

    class WireIndexEntry(Struct, forbid_unknown_fields=True):
        version: _VERSION
        model: Name
        updated_at: _TIME
        records: Annotated[list[tuple[_INT64, _TIME, _INT64]], Meta(max_length=limits.max_index_records)]
        host: Annotated[str, Meta(max_length=_MAX_HOST_CHARS)] | UnsetType = UNSET  # absent: records in the DHT

    return _Schema(
        WireProvenance,
        WireGroup,
        WireRecord,
        WireIndexEntry,
        msgspec.msgpack.Decoder(WireRecord),
        msgspec.msgpack.Decoder(WireIndexEntry),
    )


# The reason for a list or string over its limit, by its path within a record (indices read as "[]"); any other
# over-long field is field_too_long, and any other violation is schema.
_LENGTH_REASONS = {
    "groups": "too_many_groups",
    "records": "too_many_groups",
    "completions": "too_many_completions",
    "completions[]": "completion_too_long",
    "prompt": "prompt_too_long",
    "prompt[].content": "prompt_too_long",
}
_OVER_LENGTH = re.compile(r"Expected `\w+` of length <= \d+(?: - at (?:`key` in )?`\$(?P<path>[^`]*)`)?")
_AT_VERSION = re.compile(r"(?:Expected `\w+`, got `\w+`|Invalid enum value .*) - at `\$\.version`")


def _rejection(e: msgspec.ValidationError, length_reasons: Mapping[str, str], what: str = "") -> RecordRejected:
    """The :class:`RecordRejected` of a msgspec violation: its first one, named. ``length_reasons``: the reason for a
    list or string over its limit by its path, as :data:`_LENGTH_REASONS`."""
    message = f"{what}: {e}" if what else str(e)
    # msgspec names a broken limit only in its message ("Expected `str` of length <= 9 - at `$.groups[0].model`"):
    # matched whole, so that a hostile key's name, which a message quotes, cannot pass for one.
    if _AT_VERSION.fullmatch(str(e)):
        return RecordRejected("wrong_version", f"{message}; this peer speaks version {WIRE_VERSION}")
    over = _OVER_LENGTH.fullmatch(str(e))
    if over is None:
        return RecordRejected("schema", message)
    path = re.sub(r"\[\d+\]", "[]", over["path"] or "").lstrip(".").removeprefix("groups[].")
    return RecordRejected(length_reasons.get(path, "field_too_long"), message)


def _convert(obj: Any, kind: type[Struct], length_reasons: Mapping[str, str] = _LENGTH_REASONS) -> Any:
    """``obj`` (this peer's own values: JSON rows, groups in memory) as a ``kind``; raises :class:`RecordRejected`
    naming its first violation. A peer's bytes go through :func:`decode_typed` instead."""
    try:
        return msgspec.convert(obj, kind)
    except msgspec.ValidationError as e:
        raise _rejection(e, length_reasons) from None


# Where a record's maps are, for _refuse_repeated_keys: a dict is a map (the shapes of some of its keys' values), a
# one-item list an array of that shape.
_RECORD_MAPS: dict[str, Any] = {"groups": [{"prompt": [{}], "provenance": {"config": {}}, "metadata": {}}]}
_RAW_MAP = msgspec.msgpack.Decoder(dict[str, Raw])
_RAW_ARRAY = msgspec.msgpack.Decoder(list[Raw])


def _refuse_repeated_keys(data: Any, maps: Any, path: str = "$") -> None:
    """Refuse a map of ``data`` that repeats a key (msgspec keeps the last one, another decoder may keep the first: a
    signed record must read one way). ``maps`` says where the maps are (:data:`_RECORD_MAPS`); ``data`` has passed
    its typed decode, so what is walked here is bounded by the limits: a map at a time, its values kept as raw
    slices of ``data``, and its key count read from its header."""
    if isinstance(maps, list):
        for i, item in enumerate(_RAW_ARRAY.decode(data)):
            _refuse_repeated_keys(item, maps[0], f"{path}[{i}]")
        return
    entries = _RAW_MAP.decode(data)
    if len(entries) != _map_size(data):
        raise RecordRejected("schema", f"a map repeats a key - at `{path}`")
    for key, inner in maps.items():
        if key in entries:
            _refuse_repeated_keys(entries[key], inner, f"{path}.{key}")


def _map_size(data: Any) -> int:
    """The entry count in the header of the msgpack map ``data`` starts with (-1: not a map)."""
    head = memoryview(data)[:5].tobytes()
    if 0x80 <= head[0] <= 0x8F:  # fixmap
        return head[0] & 0x0F
    if head[0] in (0xDE, 0xDF):  # map 16, map 32
        return int.from_bytes(head[1 : 3 if head[0] == 0xDE else 5], "big")
    return -1


def _provenance(p: Any) -> Provenance:
    optional = {name: getattr(p, name) for name in _PROVENANCE_OPTIONAL_KEYS if getattr(p, name) is not UNSET}
    return Provenance(p.source, p.dataset, p.config, p.seed, p.index, **optional)


def _group(g: Any, limits: RecordLimits) -> Group:
    # The two checks that are not a field's own constraint.
    prompt_chars = sum(len(m.content) for m in g.prompt)
    if prompt_chars > limits.max_prompt_chars:
        raise RecordRejected("prompt_too_long", f"prompt has {prompt_chars} characters > {limits.max_prompt_chars}")
    if not any(c.strip() for c in g.completions):
        raise RecordRejected("empty_group", "group has no completions, or only empty ones")
    prompt = [{"role": m.role, "content": m.content} for m in g.prompt]
    provenance = _provenance(g.provenance)
    return Group(g.group_id, prompt, g.completions, provenance, g.metadata, g.model, g.step, g.created_at)


def provenance_from_wire(obj: Any, limits: RecordLimits = RecordLimits()) -> Provenance:
    """Validate and build a :class:`Provenance` from its wire form."""
    return _provenance(_convert(obj, _schema(limits).provenance))


def group_from_wire(obj: Any, limits: RecordLimits = RecordLimits()) -> Group:
    """Validate and build a :class:`Group` from its wire form; raises :class:`RecordRejected`."""
    return _group(_convert(obj, _schema(limits).group), limits)


def check_claimed_groups(num_groups: int, limits: RecordLimits, what: str) -> None:
    """Refuse a record reference (announced, or in an index entry) whose claimed group count is not in
    1..``max_groups_per_record``: a claim no record could keep."""
    if not 0 < num_groups <= limits.max_groups_per_record:
        bound = limits.max_groups_per_record
        raise RecordRejected("too_many_groups", f"{what} of {num_groups} groups, not in 1..{bound}")


def decode_record(data: bytes, limits: RecordLimits = RecordLimits()) -> GroupRecord:
    """Decode and validate a record; the only outcomes are a :class:`GroupRecord` or :class:`RecordRejected`."""
    check_size(data, limits.max_record_bytes)
    r = decode_typed(data, _schema(limits).record_decoder)
    _refuse_repeated_keys(data, _RECORD_MAPS)
    return GroupRecord(groups=[_group(g, limits) for g in r.groups], created_at=r.created_at, version=WIRE_VERSION)


def decode_index_entry(data: bytes, limits: RecordLimits = RecordLimits()) -> IndexEntry:
    """Decode and validate an index entry; raises :class:`RecordRejected`. Its record references are bounded as an
    announcement's are (:func:`check_claimed_groups`)."""
    check_size(data, limits.max_record_bytes, "index entry")
    e = decode_typed(data, _schema(limits).index_decoder, "index entry")
    _refuse_repeated_keys(data, {})
    for seq, _, num_groups in e.records:
        check_claimed_groups(num_groups, limits, f"index entry's record {seq}")
    host = None if e.host is UNSET else e.host
    return IndexEntry(e.model, [RecordRef(*ref) for ref in e.records], e.updated_at, WIRE_VERSION, host)


def validate_group(group: Group, limits: RecordLimits = RecordLimits()) -> Group:
    """Run the wire checks on an in-memory group (used by the in-memory transport)."""
    return group_from_wire(group_to_wire(group), limits)


def describe_sizes(groups: Sequence[Group]) -> Mapping[str, int]:
    """Encoded bytes and completion counts of some groups, for logs and benchmarks."""
    data = _pack([group_to_wire(g) for g in groups])
    return {"bytes": len(data), "groups": len(groups), "completions": sum(len(g.completions) for g in groups)}
