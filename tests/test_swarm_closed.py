"""Closed swarms (a membership file signed by an operator), bounded per-sender labels, and peers that find themselves
unreachable: unit checks, then real DHT peers on loopback with an outsider that cannot publish into the swarm."""

# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import asyncio
import json
import random
import socket
import time

import msgpack
import pytest
from google.protobuf.wrappers_pb2 import BytesValue
from hivemind.utils.crypto import RSAPrivateKey

from swarm.identity import load_or_create_signing_key
from swarm.labels import OTHER, top_senders
from swarm.membership import load_membership, main, parse_membership, sign_membership
from swarm.reachability import DialBack
from swarm.transport import SwarmCounters
from swarm.validation import fingerprint, record_key
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


# ------------------------------------------------------------------------------------------------ reachability checks


class _Neighbours:
    """Neighbours answering a dial-back request as each chooses: True (connected), False (could not), None (no answer:
    slow, gone, or its answers for the minute used up by others' requests)."""

    def __init__(self, answers: dict[str, bool | None]):
        self.answers = answers
        self.asked: list[str] = []

    async def call_protobuf_handler(self, peer: str, name: str, request: BytesValue, output: type) -> BytesValue:
        self.asked.append(peer)
        answer = self.answers[peer]
        return BytesValue() if answer is None else BytesValue(value=msgpack.packb(answer))


def _check(answers: dict[str, bool | None], seed: int = 0) -> tuple[DialBack, SwarmCounters, list[str], list[int]]:
    """A DialBack with these neighbours; returns it, its counters, the calls of its two callbacks and their counts."""
    counters, calls, refusals = SwarmCounters(), [], []

    async def unreachable(count: int) -> None:
        calls.append("client")
        refusals.append(count)

    async def reachable() -> None:
        calls.append("server")

    neighbours = _Neighbours(answers)
    dial_back = DialBack(lambda: neighbours, lambda: [31337], lambda: list(answers), 0.2, counters, unreachable,
                         reachable, random.Random(seed))  # fmt: skip
    return dial_back, counters, calls, refusals


def test_two_neighbours_saying_they_cannot_connect_while_the_third_is_silent_give_no_verdict():
    # They could be lying, and the silent one could be an honest neighbour kept busy: it used to switch to client mode.
    for seed in range(6):  # whichever order the three are asked in
        dial_back, counters, calls, _ = _check({"liar-1": False, "liar-2": False, "busy": None}, seed)
        asyncio.run(dial_back.check())
        assert calls == [] and dial_back.verdict is None and not counters.snapshot().get("unreachable")


def test_a_silent_neighbour_is_replaced_by_another_and_one_that_connected_makes_the_peer_reachable():
    answers = {"liar-1": False, "liar-2": False, "busy": None, "honest-1": True, "honest-2": True}
    for seed in range(10):
        dial_back, _, calls, _ = _check(answers, seed)
        asyncio.run(dial_back.check())
        assert calls == [] and dial_back.verdict is True, seed


def test_three_refusals_and_no_silence_make_a_peer_unreachable_and_a_later_connection_brings_it_back():
    answers: dict[str, bool | None] = {"a": False, "b": False, "c": False, "d": None}
    dial_back, counters, calls, refusals = _check(answers)
    asyncio.run(dial_back.check())
    assert calls == ["client"] and refusals == [3] and dial_back.verdict is False
    asyncio.run(dial_back.check())  # checked again in half an hour, not at the next round
    assert counters.snapshot()["reachability_checks"] == 1
    dial_back._next_check = 0.0  # half an hour later, the port forwarded: neighbours connect
    answers.update(a=True, b=True, c=True)
    asyncio.run(dial_back.check())
    assert calls == ["client", "server"] and dial_back.verdict is True
    assert counters.snapshot()["reachable_again"] == 1


def test_with_two_neighbours_two_refusals_are_a_verdict():
    dial_back, _, calls, refusals = _check({"a": False, "b": False})
    asyncio.run(dial_back.check())
    assert calls == ["client"] and refusals == [2]


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


def _dht_get(peer, key: str):
    """What a DHT lookup of ``key`` from ``peer`` finds (None: nothing stored under it)."""
    return asyncio.run_coroutine_threadsafe(peer.peer.node.get(key, latest=True), peer.peer.loop).result(30)


def test_records_served_before_a_switch_to_client_mode_are_stored_in_the_dht_at_the_switch(dht_peers):
    """A peer in server mode serves its records and stores none. When it switches to client mode, nobody can fetch
    them from it any more, and readers that learn of them from then on (its index entry and announcements name no
    host) look in the DHT: the ones it served that have not expired are stored there at the switch. The switch is the
    reachability check's own (`DHTTransport._became_unreachable`), made here without a check's timing."""
    a = dht_peers()
    u = dht_peers(initial_peers=a.visible_addresses(), check_reachability=False)
    u.publish([make_group("served-first")])
    wait_until(lambda: u.readout().counters.get("published_records") == 1, 20)
    key = record_key(u.config.swarm_name, u.peer_id, u.publisher.recent_refs()[-1].seq)
    assert u.served.get(key) is not None and _dht_get(a, key) is None  # served, not stored
    asyncio.run_coroutine_threadsafe(u._became_unreachable(3), u.peer.loop).result(60)
    assert u.peer.node.protocol.client_mode and u.readout().counters["stored_at_switch"] == 1
    assert _dht_get(a, key) is not None


def test_a_peer_that_nobody_can_dial_switches_to_client_mode_still_shares_and_serves_again_once_reachable(
    dht_peers, caplog
):
    a = dht_peers()
    b = dht_peers(initial_peers=a.visible_addresses())
    c = dht_peers(initial_peers=b.visible_addresses())  # a third reachable peer: a check needs three refusals
    # u listens on a random port but tells others a port where nothing listens: as behind a NAT
    port = _closed_port()
    u = dht_peers(initial_peers=a.visible_addresses(), announce_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"])
    # a check without a verdict (a neighbour slow to answer) is asked again a minute later
    wait_until(lambda: u.readout().counters.get("unreachable"), 100, message=str(u.readout().counters))
    wait_until(lambda: "not reachable" in caplog.text, 20)  # said once the switch to client mode is done
    assert u.served.host is None
    wait_until(lambda: a.dial_back.verdict is True, 40)  # a reachable peer is left as it is
    assert not a.readout().counters.get("unreachable")
    u.publish([make_group("from-behind-nat")])  # stored in the DHT now, not served
    got: list = []
    wait_until(lambda: got.extend(b.fetch(10)) or any(item.sender == u.peer_id for item in got), 30)
    assert u.readout().counters["published_records"] == 1

    # the port forwarded at last: something listens at the announced port, and the next check (due in half an hour,
    # brought forward here, with the neighbours' memory of u's last requests cleared) finds a neighbour that connects
    with socket.socket() as forwarded:
        forwarded.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        forwarded.bind(("127.0.0.1", port))
        forwarded.listen(8)
        for peer in (a, b, c):
            peer.peer.loop.call_soon_threadsafe(setattr, peer.dial_back, "_answered", {})
        u.peer.loop.call_soon_threadsafe(setattr, u.dial_back, "_next_check", 0.0)
        wait_until(lambda: u.readout().counters.get("reachable_again"), 40, message=str(u.readout().counters))
        wait_until(lambda: "reachable again" in caplog.text, 20)  # said once the switch back is done
    assert u.dial_back.verdict is True and not u.peer.node.protocol.client_mode
    assert u.served.host == u.peer.p2p.peer_id.to_base58()  # its records are served again, where its entry says:
    seq = u.publisher.recent_refs()[-1].seq  # the one published in client mode (stored in the DHT) included
    assert u.served.get(record_key(u.config.swarm_name, u.peer_id, seq)) is not None
