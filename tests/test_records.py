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
    group_to_wire,
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
