"""Property-based tests of the checks behind the wire: DHT validators and the question verifier.

Whatever arrives, the only outcomes are a typed rejection (counted) or an accepted record / re-derived
ground truth; nothing raises into the DHT protocol or the trainer.
"""

from __future__ import annotations

import json

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.serializer import MSGPackSerializer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sapo.questions import GROUP_DROP_REASONS, GroupDropped
from sapo.sources import ReasoningGymSource, SourceRegistry
from sapo.tasks import TaskSpec, build_reasoning_gym_dataset
from swarm.records import (
    REJECT_REASONS,
    Group,
    GroupRecord,
    IndexEntry,
    Provenance,
    RecordLimits,
    encode_index_entry,
    encode_record,
)
from swarm.validation import OwnerSignatureValidator, SwarmSchemaValidator, index_keys, owner_marker
from tests.swarm_fixtures import make_group

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = [*index_keys("sapo", 8), *index_keys("sapo", 8, level=3)[::9], "sapo/records/abc/1", "other"]
OWN_KEY, OTHER_KEY = RSAPrivateKey(), RSAPrivateKey()  # RSA key generation is slow: made once


class Rejections:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str, detail: str) -> None:
        self.reasons.append(reason)


def _record(key: str, subkey: bytes, value: bytes, expiration: float = 1e12) -> DHTRecord:
    return DHTRecord(DHTID.generate(source=key).to_bytes(), subkey, value, expiration)


@FUZZ
@given(st.sampled_from(KEYS), st.binary(max_size=300), st.floats(allow_nan=True, allow_infinity=True))
def test_schema_validator_answers_a_bool_and_counts_every_refusal(key, value, expiration):
    rejections = Rejections()
    validator = SwarmSchemaValidator("sapo", 8, RecordLimits(), rejections, max_ttl=600, index_max_level=10)
    accepted = validator.validate(_record(key, MSGPackSerializer.dumps(b"subkey"), value, expiration))
    assert accepted in (True, False)
    assert len(rejections.reasons) == (0 if accepted else 1)
    assert all(reason in REJECT_REASONS for reason in rejections.reasons)


@FUZZ
@given(st.sampled_from(KEYS), st.binary(max_size=200), st.binary(max_size=300), st.booleans())
def test_signature_validator_refuses_anything_not_signed_by_the_subkey_owner(key, subkey, value, with_marker):
    rejections = Rejections()
    validator = OwnerSignatureValidator(OWN_KEY, rejections)
    if with_marker:  # a real owner marker of a key whose private half the sender does not hold
        subkey = owner_marker(OTHER_KEY.get_public_key().to_bytes()) + subkey
    accepted = validator.validate(_record(key, MSGPackSerializer.dumps(subkey), value))
    assert accepted is False and rejections.reasons == ["bad_signature"]


TASKS = [TaskSpec("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})]
ROWS = list(build_reasoning_gym_dataset(TASKS, size=8, seed=1))
small_config = st.dictionaries(
    st.sampled_from(["min_terms", "max_terms", "min_digits", "max_digits", "size", "seed", "other"]),
    st.one_of(st.integers(min_value=-3, max_value=4), st.text(max_size=5), st.none(), st.floats(allow_nan=True)),
    max_size=4,
)
provenances = st.builds(
    Provenance,
    source=st.sampled_from(["reasoning_gym", "dataset", "custom", ""]) | st.text(max_size=10),
    dataset=st.sampled_from(["basic_arithmetic", "leg_counting", "no_such_task", "gsm8k", ""]) | st.text(max_size=10),
    config=small_config,
    seed=st.none() | st.integers(min_value=-(2**40), max_value=2**40),
    index=st.none() | st.integers(min_value=-(2**40), max_value=2**40),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(provenances, st.sampled_from(["same", "other", "empty"]), st.sampled_from(["trust", "verify", "drop"]))
def test_verifier_rederives_or_drops_with_a_reason(provenance, question, policy):
    row = ROWS[0]
    prompt = {
        "same": list(row["prompt"]),
        "other": [{"role": "user", "content": "What is 2 + 2?"}],
        "empty": [{"role": "system", "content": "hi"}],
    }[question]
    group = Group(**{**vars(make_group("g")), "prompt": prompt, "provenance": provenance})
    try:
        columns = SourceRegistry([ReasoningGymSource()], policy=policy).columns_for(group)
    except GroupDropped as e:
        assert e.reason in GROUP_DROP_REASONS
        return
    assert isinstance(columns["answer"], str) and json.loads(columns["provenance"])
    if provenance.source == "reasoning_gym":  # accepted only for the question its provenance regenerates
        assert question == "same"


def test_schema_validator_knows_the_index_keys_of_every_level_and_no_others():
    entry = MSGPackSerializer.dumps(encode_index_entry(IndexEntry(model="m", records=[], updated_at=1.0)))
    record = MSGPackSerializer.dumps(encode_record(GroupRecord(groups=[make_group("g")], created_at=1.0)))
    subkey = MSGPackSerializer.dumps(b"subkey")
    rejections = Rejections()
    validator = SwarmSchemaValidator("sapo", 8, RecordLimits(), rejections, index_max_level=10)
    top = index_keys("sapo", 8, level=10)
    assert len(top) == 8 * 2**10 and top[-1] == "sapo/index/L10/8191"
    for key in ("sapo/index/0", "sapo/index/L1/15", top[-1]):  # index keys: index entries only
        assert validator.validate(_record(key, subkey, entry)) is True, key
        assert validator.validate(_record(key, subkey, record)) is False, key
    for key in ("sapo/index/L11/0", "sapo/index/8", "sapo/records/abc/1"):  # not index keys: records only
        assert validator.validate(_record(key, subkey, entry)) is False, key
        assert validator.validate(_record(key, subkey, record)) is True, key
    assert rejections.reasons == ["schema"] * 6
