"""Closed swarms (a membership file signed by an operator), bounded per-sender labels, and peers that find themselves
unreachable: unit checks, then real DHT peers on loopback with an outsider that cannot publish into the swarm."""

# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import json
import socket
import time

import pytest
from hivemind.utils.crypto import RSAPrivateKey

from swarm.identity import load_or_create_signing_key
from swarm.labels import OTHER, top_senders
from swarm.membership import load_membership, main, parse_membership, sign_membership
from swarm.validation import fingerprint
from tests.swarm_fixtures import dht_peers, make_group, no_p2pd_left_behind, wait_until  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_p2pd_left_behind")


def _id(key: RSAPrivateKey) -> str:
    return fingerprint(key.get_public_key().to_bytes())


# ------------------------------------------------------------------------------------------------ membership files


def test_a_membership_file_verifies_only_as_its_operator_signed_it():
    operator, other = RSAPrivateKey(), RSAPrivateKey()
    text = sign_membership(operator, "sapo", ["0123456789abcdef", "fedcba9876543210"])
    membership = parse_membership(text, _id(operator), "sapo")
    assert membership.admits("0123456789abcdef") and not membership.admits("00000000000000aa")
    with pytest.raises(ValueError, match="not by the operator"):
        parse_membership(text, _id(other), "sapo")
    with pytest.raises(ValueError, match="not 'other-swarm'"):
        parse_membership(text, _id(operator), "other-swarm")
    document = json.loads(text)
    document["members"].append("00000000000000aa")  # an outsider adds itself
    with pytest.raises(ValueError, match="signature does not match"):
        parse_membership(json.dumps(document), _id(operator), "sapo")
    with pytest.raises(ValueError, match="not a membership file"):
        parse_membership("{}", _id(operator), "sapo")
    with pytest.raises(ValueError, match="not a peer id"):
        sign_membership(operator, "sapo", ["alice"])


def test_the_membership_command_prints_ids_signs_and_checks_a_file(tmp_path, capsys):
    operator_pem, member_pem = str(tmp_path / "operator.pem"), str(tmp_path / "member.pem")
    operator_id, member_id = main(["id", "--key", operator_pem]), main(["id", "--key", member_pem])
    assert operator_id == _id(load_or_create_signing_key(operator_pem))
    members = tmp_path / "members.txt"
    members.write_text(f"# the lab's peers\n{member_id}\n")
    out = str(tmp_path / "members.json")
    main(["sign", "--key", operator_pem, "--members", str(members), "--out", out])
    assert load_membership(out, operator_id, "sapo").members == {member_id}
    assert main(["show", out, "--operator", operator_id]).members == {member_id}
    with pytest.raises(ValueError, match="needs membership_operator"):
        load_membership(out, None, "sapo")


def test_per_sender_figures_are_bounded_to_the_top_senders_and_other():
    per_sender = {f"peer{i:02d}": {"taken": float(i), "dropped/hygiene": 1.0} for i in range(50)}
    bounded = top_senders(per_sender, keep=3)
    assert list(bounded) == ["peer49", "peer48", "peer47", OTHER]
    assert bounded[OTHER]["taken"] == sum(range(47)) and bounded[OTHER]["dropped/hygiene"] == 47
    assert top_senders({"a": {"taken": 1.0}}, keep=3) == {"a": {"taken": 1.0}}  # nothing to fold
    with pytest.raises(ValueError):
        top_senders(per_sender, keep=-1)


# ------------------------------------------------------------------------------------------------ real peers


def test_an_outsider_cannot_publish_into_a_closed_swarm(dht_peers, tmp_path):
    keys = {name: str(tmp_path / f"{name}.pem") for name in ("operator", "a", "b", "outsider")}
    ids = {name: _id(load_or_create_signing_key(path)) for name, path in keys.items()}
    membership = tmp_path / "members.json"
    membership.write_text(sign_membership(load_or_create_signing_key(keys["operator"]), "sapo", [ids["a"], ids["b"]]))
    closed = dict(membership_path=str(membership), membership_operator=ids["operator"])
    a = dht_peers(signing_key_path=keys["a"], **closed)
    b = dht_peers(signing_key_path=keys["b"], initial_peers=a.visible_addresses(), **closed)
    # the outsider knows a's address and joins the DHT as an open peer; it announces, stores its index entry, serves
    outsider = dht_peers(signing_key_path=keys["outsider"], initial_peers=a.visible_addresses())
    wait_until(lambda: ids["a"] in {p.peer for p in outsider.peers()}, 30)  # it sees the members...
    outsider.publish([make_group("intruder")])
    wait_until(lambda: outsider.readout().counters.get("announcements_sent", 0) >= 2, 20)
    a.publish([make_group("member")])
    got: list = []
    wait_until(lambda: got.extend(b.fetch(10)) or any(item.group.group_id == "member" for item in got), 30)
    time.sleep(3.0)  # time for an intruding group to show up, were it accepted
    got += b.fetch(10)
    assert {item.sender for item in got} == {ids["a"]}
    assert ids["outsider"] not in {p.peer for p in b.peers()}
    # its announcements, index entries or stores are refused and counted (which comes first depends on timing)
    wait_until(lambda: sum(peer.readout().counters.get("rejected/not_member", 0) for peer in (a, b)) >= 1, 30)
    # a peer configured with the file but not in it refuses to start, saying what to do
    with pytest.raises(ValueError, match="not a member"):
        dht_peers(signing_key_path=keys["outsider"], initial_peers=a.visible_addresses(), **closed)


def _closed_port() -> int:
    with socket.socket() as s:  # a port nobody listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_peer_that_nobody_can_dial_switches_to_client_mode_and_still_shares(dht_peers, caplog):
    a = dht_peers()
    b = dht_peers(initial_peers=a.visible_addresses())
    dht_peers(initial_peers=b.visible_addresses())  # a third reachable peer: a check needs two answers
    # u listens on a random port but tells others a port where nothing listens: as behind a NAT
    u = dht_peers(initial_peers=a.visible_addresses(), announce_maddrs=[f"/ip4/127.0.0.1/tcp/{_closed_port()}"])
    wait_until(lambda: u.readout().counters.get("unreachable"), 40, message=str(u.readout().counters))
    wait_until(lambda: "not reachable" in caplog.text, 20)  # said once the switch to client mode is done
    assert u.served.host is None
    wait_until(lambda: a.dial_back.verdict is True, 40)  # a reachable peer is left as it is
    assert not a.readout().counters.get("unreachable")
    u.publish([make_group("from-behind-nat")])  # stored in the DHT now, not served
    got: list = []
    wait_until(lambda: got.extend(b.fetch(10)) or any(item.sender == u.peer_id for item in got), 30)
    assert u.readout().counters["published_records"] == 1
