"""Unit tests of the wire schema in swarm.records: round trips, every rejection reason, limits, fuzzing."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarm.records import (
    REJECT_REASONS,
    WIRE_VERSION,
    Group,
    GroupRecord,
    IndexEntry,
    Provenance,
    RecordLimits,
    RecordRef,
    RecordRejected,
    decode_index_entry,
    decode_record,
    describe_sizes,
    encode_index_entry,
    encode_record,
    group_from_wire,
    group_to_wire,
    provenance_from_wire,
    provenance_to_wire,
    validate_group,
)
from tests.swarm_fixtures import make_group


def record_of(*groups, created_at: float = 1000.0) -> GroupRecord:
    return GroupRecord(groups=list(groups), created_at=created_at)


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def wire_record(**group_changes) -> dict:
    group = group_to_wire(make_group("g"))
    group.update(group_changes)
    return {"version": WIRE_VERSION, "created_at": 1.0, "groups": [group]}


def reason_of(data: bytes, limits: RecordLimits = RecordLimits()) -> str:
    with pytest.raises(RecordRejected) as info:
        decode_record(data, limits)
    return info.value.reason


def test_record_round_trip():
    groups = [make_group("1-0"), make_group("1-1", completions=8, completion_chars=1500)]
    record = record_of(*groups)
    assert decode_record(encode_record(record)) == record
    assert validate_group(groups[0]) == groups[0]
    assert describe_sizes(groups)["completions"] == 12


def test_index_entry_round_trip():
    entry = IndexEntry(model="m", records=[RecordRef(seq=5, created_at=2.5, num_groups=4)], updated_at=3.0)
    assert decode_index_entry(encode_index_entry(entry)) == entry


# ------------------------------------------------------------------------------------------------
# compatibility: bytes written by the previous release (the hand-written decoder, commit 5d671b3), kept as they were
# packed, so that a change of decoder or encoder cannot silently split the swarm between releases

PREVIOUS_RECORD = bytes.fromhex(
    "83a776657273696f6e01aa637265617465645f6174cb41da4a4538600000a667726f7570739288a867726f75705f6964a431372d30a6"
    "70726f6d70749282a4726f6c65a673797374656da7636f6e74656e74af416e737765722062726965666c792e82a4726f6c65a4757365"
    "72a7636f6e74656e74d920576861742069732032202b20323f2068c3a96c6c6f20e29c9320e697a5e69cacab636f6d706c6574696f6e"
    "7392a134bc4974206973203c623e343c2f623e20e29c9320e697a5e69cace8aa9eaa70726f76656e616e636585a6736f75726365ad72"
    "6561736f6e696e675f67796da764617461736574b062617369635f61726974686d65746963a6636f6e66696785a96d696e5f7465726d"
    "7302a5726174696fcb3fe0000000000000a4666c6167c3a46e6f6e65c0a56d697865649501a162c0cb4004000000000000c2a4736565"
    "64d3ffffff0000000000a5696e64657803a86d6574616461746186a6616e73776572a134a573636f7265cb3fd0000000000000a16efd"
    "a3626967cf4000000000000000a26f6bc2a178c0a56d6f64656ca474696e79a473746570cf0000010000000000aa637265617465645f"
    "6174cb41da4a453810000088a867726f75705f6964a431382d31a670726f6d70749182a4726f6c65a475736572a7636f6e74656e74a1"
    "71ab636f6d706c6574696f6e7392a0a3206120aa70726f76656e616e636587a6736f75726365a764617461736574a764617461736574"
    "a567736d386ba6636f6e66696780a473656564c0a5696e646578c0a776657273696f6ea3312e32a36b6579a6616231326364a86d6574"
    "616461746180a56d6f64656ca0a47374657000aa637265617465645f6174cb0000000000000000"
)
PREVIOUS_INDEX_ENTRY = bytes.fromhex(
    "84a776657273696f6e01a56d6f64656ca474696e79aa757064617465645f6174cb41da4a4538800000a77265636f726473929305cb41"
    "da4a4538600000029304cb000000000000000001"
)
PREVIOUS_SERVED_ENTRY = bytes.fromhex(
    "85a776657273696f6e01a56d6f64656ca16daa757064617465645f6174cb4008000000000000a77265636f72647390a4686f7374d931"
    "313244334b6f6f574578616d706c65486f7374506565724964303030303030303030303030303030303030303030303030"
)


def previous_release_values() -> tuple[GroupRecord, IndexEntry, IndexEntry]:
    """What the bytes above hold: every scalar type, non-ASCII text, 64-bit integers, a provenance with and without
    the optional keys (peers before task sources write neither), an index entry with and without ``host``."""
    full = Group(
        group_id="17-0",
        prompt=[
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "What is 2 + 2? héllo ✓ 日本"},
        ],
        completions=["4", "It is <b>4</b> ✓ 日本語"],
        provenance=Provenance(
            "reasoning_gym",
            "basic_arithmetic",
            {"min_terms": 2, "ratio": 0.5, "flag": True, "none": None, "mixed": [1, "b", None, 2.5, False]},
            seed=-(2**40),
            index=3,
        ),
        metadata={"answer": "4", "score": 0.25, "n": -3, "big": 2**62, "ok": False, "x": None},
        model="tiny",
        step=2**40,
        created_at=1764300000.25,
    )
    sourced = Group(
        group_id="18-1",
        prompt=[{"role": "user", "content": "q"}],
        completions=["", " a "],
        provenance=Provenance("dataset", "gsm8k", {}, None, None, version="1.2", key="ab12cd"),
        metadata={},
        model="",
        step=0,
        created_at=0.0,
    )
    return (
        GroupRecord(groups=[full, sourced], created_at=1764300001.5),
        IndexEntry("tiny", [RecordRef(5, 1764300001.5, 2), RecordRef(4, 0.0, 1)], updated_at=1764300002.0),
        IndexEntry("m", [], updated_at=3.0, host="12D3KooWExampleHostPeerId000000000000000000000000"),
    )


def test_previous_release_bytes_decode_to_the_same_values_and_are_written_the_same():
    record, entry, served = previous_release_values()
    assert decode_record(PREVIOUS_RECORD) == record
    assert decode_index_entry(PREVIOUS_INDEX_ENTRY) == entry and decode_index_entry(PREVIOUS_SERVED_ENTRY) == served
    assert decode_record(PREVIOUS_RECORD).groups[0].metadata["ok"] is False  # a boolean stays one, not 0
    assert encode_record(record) == PREVIOUS_RECORD
    assert encode_index_entry(entry) == PREVIOUS_INDEX_ENTRY and encode_index_entry(served) == PREVIOUS_SERVED_ENTRY


def test_integer_times_read_as_floats():
    """A packer that writes a whole number of seconds as an integer: read as the float it means."""
    obj = {**wire_record(created_at=5), "created_at": 7}
    record = decode_record(pack(obj))
    assert (record.created_at, record.groups[0].created_at) == (7.0, 5.0)
    assert isinstance(record.created_at, float) and isinstance(record.groups[0].created_at, float)
    entry = decode_index_entry(pack({"version": WIRE_VERSION, "model": "m", "updated_at": 2, "records": [[1, 3, 2]]}))
    assert entry.updated_at == 2.0 and entry.records == [RecordRef(1, 3.0, 2)]


def test_unknown_reason_is_a_programming_error():
    with pytest.raises(ValueError):
        RecordRejected("nope", "x")


def test_limits_must_be_positive_integers():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            RecordLimits(max_record_bytes=bad)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xc1", "not_msgpack"),
        (pack({"version": 99, "created_at": 1.0, "groups": []}), "wrong_version"),
        (pack([1, 2, 3]), "schema"),
        (pack({"version": WIRE_VERSION, "created_at": 1.0, "groups": [], "extra": 1}), "schema"),
        (pack({"version": WIRE_VERSION, "created_at": -1.0, "groups": []}), "schema"),
        (pack({"version": WIRE_VERSION, "created_at": float("nan"), "groups": []}), "schema"),
        (pack(wire_record(step="1")), "schema"),
        (pack(wire_record(step=True)), "schema"),
        (pack(wire_record(prompt=[])), "schema"),
        (pack(wire_record(completions=[""])), "empty_group"),
        (pack(wire_record(completions=["  "])), "empty_group"),
        (pack(wire_record(completions=[])), "empty_group"),
        (pack(wire_record(completions=["x"] * 65)), "too_many_completions"),
        (pack(wire_record(completions=["x" * 32769])), "completion_too_long"),
        (pack(wire_record(prompt=[{"role": "user", "content": "q" * 32769}])), "prompt_too_long"),
        (pack(wire_record(prompt=[{"role": "user", "content": "q"}] * 33)), "prompt_too_long"),
        (pack(wire_record(model="m" * 1025)), "field_too_long"),
        (pack(wire_record(metadata={str(i): i for i in range(33)})), "field_too_long"),
        (pack(wire_record(metadata={"k": [1, 2]})), "schema"),
        (pack(wire_record(metadata={"k": {"nested": 1}})), "schema"),
    ],
)
def test_each_rejection_reason(data, reason):
    assert reason_of(data) == reason


def provenance_changed(**changes) -> dict:
    return {**group_to_wire(make_group("g"))["provenance"], **changes}


LONG, VALUE = "x" * 1025, "v" * 8193  # one over max_field_chars and max_metadata_value_chars


@pytest.mark.parametrize(
    ("group_changes", "reason"),
    [
        ({"group_id": LONG}, "field_too_long"),
        ({"prompt": [{"role": LONG, "content": "q"}]}, "field_too_long"),
        ({"prompt": [{"role": "user", "content": "q", "name": "x"}]}, "schema"),
        ({"provenance": provenance_changed(source=LONG)}, "field_too_long"),
        ({"provenance": provenance_changed(dataset=LONG)}, "field_too_long"),
        ({"provenance": provenance_changed(version=LONG)}, "field_too_long"),
        ({"provenance": provenance_changed(key="k" * 1025)}, "field_too_long"),
        ({"provenance": provenance_changed(version=None)}, "schema"),  # an optional key is a string when present
        ({"provenance": provenance_changed(seed=2**63)}, "schema"),
        ({"provenance": {k: v for k, v in provenance_changed().items() if k != "index"}}, "schema"),
        ({"provenance": provenance_changed(config={LONG: 1})}, "field_too_long"),
        ({"provenance": provenance_changed(config={"k": VALUE})}, "field_too_long"),
        ({"provenance": provenance_changed(config={"k": list(range(33))})}, "field_too_long"),
        ({"provenance": provenance_changed(config={str(i): i for i in range(33)})}, "field_too_long"),
        ({"provenance": provenance_changed(config={"k": [[1]]})}, "schema"),
        ({"metadata": {LONG: 1}}, "field_too_long"),
        ({"metadata": {"k": VALUE}}, "field_too_long"),
        ({"metadata": {"k": float("inf")}}, "schema"),
        ({"metadata": {"k": 2**63}}, "schema"),
        ({"metadata": {"k": b"bytes"}}, "schema"),
        ({"step": 2**63}, "schema"),
        ({"created_at": float("inf")}, "schema"),
        # a hostile key's name is quoted in the decoder's message; it cannot pass for a limit's reason
        ({"Expected `str` of length <= 1 - at `$.groups[0].completions`": 1}, "schema"),
    ],
)
def test_every_limited_field_names_its_reason(group_changes, reason):
    assert reason_of(pack(wire_record(**group_changes))) == reason
    with pytest.raises(RecordRejected) as info:  # the same checks on a group or provenance alone (JSON rows)
        group_from_wire(wire_record(**group_changes)["groups"][0])
    assert info.value.reason == reason


def test_reasons_of_the_bytes_and_of_an_index_entry():
    assert reason_of(pack({1: 2})) == "schema"  # a map key that is not text: msgpack, of the wrong type
    ok = {"version": WIRE_VERSION, "model": "m", "updated_at": 1.0, "records": [], "host": "h"}
    for changes, reason in [
        ({"host": "h" * 129}, "field_too_long"),
        ({"host": None}, "schema"),
        ({"model": LONG}, "field_too_long"),
    ]:
        with pytest.raises(RecordRejected) as info:
            decode_index_entry(pack({**ok, **changes}))
        assert info.value.reason == reason, changes
    with pytest.raises(RecordRejected) as info:
        provenance_from_wire(provenance_changed(source=LONG))
    assert info.value.reason == "field_too_long"


def test_prompt_total_over_limit():
    limits = RecordLimits(max_prompt_chars=10)
    data = pack(wire_record(prompt=[{"role": "user", "content": "q" * 6}] * 2))
    assert reason_of(data, limits) == "prompt_too_long"


def test_too_large_and_too_many_groups():
    record = record_of(*[make_group(str(i)) for i in range(3)])
    data = encode_record(record)
    assert reason_of(data, RecordLimits(max_record_bytes=len(data) - 1)) == "too_large"
    assert reason_of(data, RecordLimits(max_groups_per_record=2)) == "too_many_groups"
    with pytest.raises(RecordRejected) as info:
        encode_record(record, RecordLimits(max_groups_per_record=2))  # the publisher runs the same checks
    assert info.value.reason == "too_many_groups"


def test_index_entry_rejections():
    def index_reason(obj, limits=RecordLimits()) -> str:
        with pytest.raises(RecordRejected) as info:
            decode_index_entry(pack(obj), limits)
        return info.value.reason

    ok = {"version": WIRE_VERSION, "model": "m", "updated_at": 1.0, "records": [[1, 1.0, 2]]}
    assert decode_index_entry(pack(ok)).records == [RecordRef(1, 1.0, 2)]
    assert index_reason({**ok, "records": [[1, 1.0]]}) == "schema"
    assert index_reason({**ok, "records": [[1, 1.0, 2, 3]]}) == "schema"
    assert index_reason({**ok, "records": [["1", 1.0, 2]]}) == "schema"
    assert index_reason({**ok, "version": 2}) == "wrong_version"
    assert index_reason({**ok, "records": [[1, 1.0, 2]] * 3}, RecordLimits(max_index_records=2)) == "too_many_groups"


def test_signature_and_freshness_reasons_exist_for_the_dht_layer():
    for reason in ("bad_signature", "expired", "clock_skew"):
        assert reason in REJECT_REASONS
        assert RecordRejected(reason, "x").reason == reason


def test_provenance_config_lists_and_scalars():
    group = make_group("p")
    group = dataclasses.replace(group, provenance=dataclasses.replace(group.provenance, config={"a": [1, "b", None]}))
    assert decode_record(encode_record(record_of(group))).groups[0].provenance.config == {"a": [1, "b", None]}


def test_provenance_task_travels_under_the_wire_key_of_older_peers():
    """`Provenance.task` is packed under the key "dataset", so peers from before the rename read new records and
    new peers read theirs; the former keyword and attribute still work."""
    provenance = Provenance("reasoning_gym", "basic_arithmetic", {"max_terms": 2}, 1, 3)
    assert provenance_to_wire(provenance) == {
        "source": "reasoning_gym",
        "dataset": "basic_arithmetic",
        "config": {"max_terms": 2},
        "seed": 1,
        "index": 3,
    }
    group = dataclasses.replace(make_group("p"), provenance=provenance)
    assert decode_record(encode_record(record_of(group))).groups[0].provenance.task == "basic_arithmetic"
    old = Provenance(source="dataset", dataset="gsm8k", index=2)
    assert old == Provenance("dataset", "gsm8k", {}, None, 2) and old.dataset == old.task == "gsm8k"
    assert dataclasses.replace(old, dataset="other").task == "other"
    with pytest.raises(TypeError, match="task"):
        Provenance("dataset")


# ------------------------------------------------------------------------------------------------
# property tests: whatever arrives, the only outcomes are a valid object or RecordRejected

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what msgpack can pack
    | st.floats(allow_nan=True)
    | st.text(max_size=50)
    | st.binary(max_size=50),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30,
)

KEYS = sorted({"version", "created_at", "groups", "model", "updated_at", "records", *group_to_wire(make_group("g"))})
shaped_values = st.fixed_dictionaries(
    {"version": st.sampled_from([WIRE_VERSION, 0, "1"])},
    optional={key: msgpack_values for key in KEYS if key != "version"},
)


def _decodes_or_rejects(data: bytes) -> None:
    for decode, kind in ((decode_record, GroupRecord), (decode_index_entry, IndexEntry)):
        try:
            assert isinstance(decode(data, RecordLimits()), kind)
        except RecordRejected as e:
            assert e.reason in REJECT_REASONS


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_arbitrary_bytes_decode_or_reject(data):
    _decodes_or_rejects(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(msgpack_values, shaped_values))
def test_arbitrary_msgpack_values_decode_or_reject(value):
    _decodes_or_rejects(pack(value))


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_valid_group_with_one_mutated_field_decodes_or_rejects(data):
    group = group_to_wire(make_group("g"))
    key = data.draw(st.sampled_from(sorted(group)))
    group[key] = data.draw(msgpack_values)
    _decodes_or_rejects(pack({"version": WIRE_VERSION, "created_at": 1.0, "groups": [group]}))
