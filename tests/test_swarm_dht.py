"""Tests of the hivemind DHT transport with real peers (p2pd daemons) on 127.0.0.1 only."""
# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hivemind.dht.routing import DHTID
from hivemind.utils.serializer import MSGPackSerializer

from swarm.config import nat_options
from swarm.daemon import ProcessIdentity, is_p2pd, parent_pid, socket_is_stale
from swarm.dht import DHTTransport, SwarmJoinError
from swarm.records import GroupRecord, IndexEntry, RecordRef, RecordRejected, encode_index_entry, encode_record
from swarm.transport import wait_for_groups, wait_for_peers
from swarm.validation import owner_marker, record_key
from testbed.hostile_peer import HostileNode
from tests.swarm_fixtures import (  # noqa: F401
    STARTED_P2PD,
    dht_peers,
    make_group,
    no_p2pd_left_behind,
    record_p2pd,
    wait_until,
)

pytestmark = pytest.mark.usefixtures("no_p2pd_left_behind")

LOCAL = "/ip4/127.0.0.1/tcp/0"


def collect(peer: DHTTransport, into: list, want: int, timeout: float = 20.0) -> list:
    """Fetch from ``peer`` into ``into`` until it holds ``want`` groups (bounded wait)."""

    def enough() -> bool:
        into.extend(peer.fetch(100))
        return len(into) >= want

    wait_until(enough, timeout, message=f"(peer {peer.peer_id} got {len(into)} of {want} groups)")
    return into


def collect_until(peer: DHTTransport, wanted: tuple[str, str], timeout: float = 30.0) -> list:
    """Fetch from ``peer`` until the group ``(sender, group_id)`` arrives (bounded wait)."""
    into: list = []

    def arrived() -> bool:
        into.extend(peer.fetch(100))
        return wanted in ids(into)

    wait_until(arrived, timeout, message=f"(peer {peer.peer_id} waiting for {wanted})")
    return into


def ids(received: list) -> set[tuple[str, str]]:
    return {(item.sender, item.group.group_id) for item in received}


def test_three_peers_exchange_and_late_joiner(dht_peers):
    a = dht_peers(model_name="A")
    b = dht_peers(model_name="B", initial_peers=a.visible_addresses())
    c = dht_peers(model_name="C", initial_peers=b.visible_addresses())
    assert len({a.peer_id, b.peer_id, c.peer_id}) == 3
    a.publish([make_group("a1"), make_group("a2")])
    b.publish([make_group("b1")])
    c.publish([make_group("c1")])

    got = {name: [] for name in "abc"}
    collect(a, got["a"], 2)
    collect(b, got["b"], 3)
    collect(c, got["c"], 3)
    assert ids(got["a"]) == {(b.peer_id, "b1"), (c.peer_id, "c1")}
    assert ids(got["b"]) == {(a.peer_id, "a1"), (a.peer_id, "a2"), (c.peer_id, "c1")}
    assert ids(got["c"]) == {(a.peer_id, "a1"), (a.peer_id, "a2"), (b.peer_id, "b1")}
    assert {p.peer: p.model for p in c.peers()} == {a.peer_id: "A", b.peer_id: "B"}

    # a late joiner sees the fresh groups of everyone, including one published after it joined
    d = dht_peers(initial_peers=c.visible_addresses())
    a.publish([make_group("a3")])
    got_d = collect(d, [], 5)
    assert ids(got_d) == {(a.peer_id, g) for g in ("a1", "a2", "a3")} | {(b.peer_id, "b1"), (c.peer_id, "c1")}

    # nothing is returned twice, nobody receives their own groups
    collect(b, got["b"], 4)
    time.sleep(0.5)  # give a wrongly repeated group the chance to show up
    for name, peer in zip("abcd", (a, b, c, d), strict=False):
        items = got.get(name, got_d) + peer.fetch(100)
        assert len(ids(items)) == len(items), f"peer {name} got a group twice"
        assert all(item.sender != peer.peer_id for item in items)
    counters = a.readout().counters
    assert counters["published_records"] == 2 and counters["published_groups"] == 3
    assert counters["index_reads"] > 0 and counters["fetched_records"] >= 2
    assert d.readout().counters["fetched_groups"] == 5


def test_peers_are_listed_from_joining_and_a_relay_is_not(dht_peers):
    relay = dht_peers(announce=False)
    a = dht_peers(model_name="A", initial_peers=relay.visible_addresses())
    b = dht_peers(model_name="B", initial_peers=relay.visible_addresses())
    # neither has published anything: they are listed because they announced themselves on joining
    assert {(p.peer, p.model) for p in wait_for_peers(a, 1, timeout=30)} == {(b.peer_id, "B")}
    assert {(p.peer, p.model) for p in wait_for_peers(b, 1, timeout=30)} == {(a.peer_id, "A")}
    assert {p.peer for p in wait_for_peers(relay, 2, timeout=30)} == {a.peer_id, b.peer_id}
    time.sleep(1.0)  # a wrongly announced relay would have been read by now (index refresh: 1 s)
    assert relay.peer_id not in {p.peer for p in a.peers() + b.peers()}
    assert a.readout().counters.get("published_records", 0) == 0 and a.fetch(10) == []


def test_a_joining_peer_can_wait_until_it_holds_the_swarms_groups(dht_peers):
    a = dht_peers(model_name="A")
    b = dht_peers(initial_peers=a.visible_addresses())
    assert wait_for_groups(b, 1, timeout=1.0) == 0  # nothing published yet: it gives up at the timeout
    a.publish([make_group("a1"), make_group("a2")])
    assert wait_for_groups(b, 2, timeout=30) == 2
    assert {item.group.group_id for item in b.fetch(10)} == {"a1", "a2"}  # what it waited for is fetched at once


def test_storage_and_bookkeeping_are_bounded_by_expiry(dht_peers):
    short = dict(record_ttl=8.0, rejoin_interval=0.5, announce_interval=3600)
    a = dht_peers(model_name="A", **short)
    b = dht_peers(initial_peers=a.visible_addresses(), **short)
    a.publish([make_group("a1")])
    collect(b, [], 1)
    held = b.readout().gauges
    assert held["seen_refs"] >= 1 and held["known_senders"] == 1 and held["dht_stored_items"] >= 1
    # once the ttl has passed, the records expire from DHT storage and the peer forgets what it knew of them
    bookkeeping = ("dht_stored_items", "seen_refs", "known_senders")
    wait_until(lambda: all(b.readout().gauges[name] == 0 for name in bookkeeping), 20, message=str(held))
    assert b.peers() == []
    # the index reads find nobody at any level: the estimate of the swarm's size is dropped (-1: none)
    wait_until(lambda: b.readout().gauges["estimated_peers"] == -1, 20, message=str(b.readout().gauges))


def test_records_are_served_by_their_publisher_and_the_dht_holds_only_the_index(dht_peers):
    a = dht_peers()
    b = dht_peers(initial_peers=a.visible_addresses())
    c = dht_peers(initial_peers=a.visible_addresses(), serve_records=False)  # stores its records in the DHT
    a.publish([make_group("served", completion_chars=4000)])
    c.publish([make_group("in-dht", completion_chars=4000)])
    got = collect(b, [], 2, timeout=30)
    assert ids(got) == {(a.peer_id, "served"), (c.peer_id, "in-dht")}  # a swarm of both kinds exchanges groups
    assert a.readout().counters["served_requests"] >= 1 and a.readout().counters["served_bytes"] > 16_000
    swarm = a.config.swarm_name

    def stored_anywhere(key: str) -> bool:
        key_id = DHTID.generate(source=key)
        return any(peer.peer.node.protocol.storage.get(key_id) is not None for peer in (a, b, c))

    [a_ref] = a.publisher.recent_refs()
    [c_ref] = c.publisher.recent_refs()
    assert not stored_anywhere(record_key(swarm, a.peer_id, a_ref.seq))  # served: never sent to a replica
    assert stored_anywhere(record_key(swarm, c.peer_id, c_ref.seq))
    assert stored_anywhere(a.publisher.index_key)  # the index stays in the DHT


def test_a_served_record_leaves_with_its_publisher(dht_peers):
    a = dht_peers(announce_interval=3600)
    b = dht_peers(initial_peers=a.visible_addresses(), prefetch_groups=1)
    a.publish([make_group("first")])
    wait_for_groups(b, 1, timeout=20)  # b's cache is full: it lists a's next record without fetching it
    a.publish([make_group("second")])
    wait_until(lambda: len(b.reader.choose_refs(1)) == 1, 20, message="(b never listed a's second record)")
    a.close()  # the record b has not fetched yet goes with it: b counts the failure, never raises or waits
    assert [item.group.group_id for item in b.fetch(10)] == ["first"]
    wait_until(lambda: b.readout().counters.get("fetch_failures", 0) >= 1, 30, message=str(b.readout().counters))
    assert b.reader.choose_refs(1) == []  # the publisher that did not answer rests: its refs are not chosen
    assert b.fetch(10) == [] and b.healthy()


@pytest.mark.parametrize("size", [100_000, 1_000_000])
def test_large_records_round_trip(dht_peers, size):
    a = dht_peers()
    b = dht_peers(initial_peers=a.visible_addresses())
    rng = random.Random(size)
    chars = 25_000
    n = size // chars
    completions = ["".join(rng.choices("abcdefghij klmnop", k=chars)) for _ in range(n)]
    group = dataclasses.replace(make_group("big"), completions=completions)
    assert len(encode_record(GroupRecord(groups=[group], created_at=time.time()))) >= size
    a.publish([group])
    got = collect(b, [], 1, timeout=30)
    assert got[0].group.completions == completions and got[0].sender == a.peer_id


def test_oversized_publish_raises_at_once(dht_peers):
    a = dht_peers()
    huge = dataclasses.replace(make_group("x"), completions=["y" * 32_000] * 64)
    with pytest.raises(RecordRejected) as info:
        a.publish([huge, huge])  # 4 MB of text > max_record_bytes
    assert info.value.reason == "too_large"
    with pytest.raises(RecordRejected):
        a.publish([make_group("empty", completions=1, completion_chars=0)])


def test_killed_peers_do_not_stop_the_others(dht_peers):
    boot = dht_peers()
    b = dht_peers(initial_peers=boot.visible_addresses())
    c = dht_peers(initial_peers=boot.visible_addresses())
    d = dht_peers(initial_peers=b.visible_addresses())
    c.publish([make_group("c1")])
    collect(d, [], 1)

    # a peer dies mid-run (its p2pd is killed): it reports it, the others go on
    assert c.p2pd.kill()
    wait_until(lambda: not c.healthy(), 10)
    assert c.readout().counters["p2pd_deaths"] == 1
    assert c.fetch(4) == []  # never raises
    queued = c.readout().counters.get("queued_records", 0)
    c.publish([make_group("c2")])  # publish only queues: it returns with no network left at all
    assert c.readout().counters["queued_records"] == queued + 1
    b.publish([make_group("b1")])
    assert ids(collect(d, [], 1)) == {(b.peer_id, "b1")}

    # the bootstrap peer dies: joined peers keep publishing and fetching
    assert boot.p2pd.kill()
    wait_until(lambda: not boot.healthy(), 10)
    d.publish([make_group("d1")])
    b.publish([make_group("b2")])
    assert (d.peer_id, "d1") in ids(collect_until(b, (d.peer_id, "d1")))
    assert (b.peer_id, "b2") in ids(collect_until(d, (b.peer_id, "b2")))
    assert b.healthy() and d.healthy()


def test_hostile_writer_is_rejected_and_counted(dht_peers):
    a = dht_peers(model_name="honest-a")
    b = dht_peers(initial_peers=a.visible_addresses())
    # the hostile node is the nearest to a's index key: the late peer's lookups of that key ask it first
    hostile = HostileNode(a.visible_addresses(), on_p2pd=record_p2pd, nearest_to=a.publisher.index_key)
    # a deadline, not a wait: the 3.5 MB store took over the node's 1 s RPC timeout on 2 busy cores (answer None)
    hostile.node.protocol.wait_timeout = 10.0
    try:
        a.publish([make_group("a1")])
        wait_until(lambda: a.readout().counters.get("published_records"))
        seq = a.publisher.recent_refs()[-1].seq
        records_key = f"sapo/records/{a.peer_id}/{seq}"
        index_key = a.publisher.index_key
        exp = time.time() + 300
        good_record = encode_record(GroupRecord(groups=[make_group("evil")], created_at=time.time()))
        dumps = MSGPackSerializer.dumps
        rng = random.Random(0)
        attempts = {
            # (reason expected, key, subkey, raw value as sent)
            "forged": ("bad_signature", records_key, owner_marker(a.public_key), None),
            "unsigned": ("bad_signature", records_key, b"no owner here", dumps(good_record)),
            "schema": ("schema", records_key, hostile.marker, dumps(MSGPackSerializer.dumps({"version": 1, "x": 1}))),
            "too_large": ("too_large", f"sapo/records/x/{seq}", hostile.marker, dumps(rng.randbytes(3_500_000))),
            "random": ("not_msgpack", records_key, hostile.marker, rng.randbytes(2000)),
            "bad_index": ("schema", index_key, hostile.marker, dumps(good_record)),
        }
        for name, (reason, key, subkey, raw) in attempts.items():
            if name == "forged":  # an honest peer's subkey and content, signed with the hostile key
                value = hostile.signed(key, subkey, dumps(good_record), exp, forge=True)
            elif name == "unsigned":
                value = raw
            else:
                value = hostile.signed(key, subkey, raw, exp)
            for peer in (a, b):
                before = peer.readout().counters.get(f"rejected/{reason}", 0)
                assert hostile.store_at(peer, key, subkey, value, exp) is False, name
                counters = peer.readout().counters
                assert counters.get(f"rejected/{reason}", 0) == before + 1, (name, counters)

        # a validly signed second subkey under a's records key and a's index shard: stored, but never taken
        # as a's; plus junk in the hostile node's own storage, which honest peers reject when it is returned
        foreign = hostile.signed(records_key, hostile.marker, dumps(good_record), exp)
        for peer in (a, b):
            assert hostile.store_at(peer, records_key, hostile.marker, foreign, exp) is True
        storage = hostile.node.protocol.storage
        storage.store_subkey(DHTID.generate(source=index_key), b"junk", dumps(b"junk"), exp)
        entry = encode_index_entry(
            IndexEntry(model="evil", records=[RecordRef(seq, time.time(), 1)], updated_at=time.time())
        )
        index_value = hostile.signed(index_key, hostile.marker, dumps(entry), exp)
        for peer in (a, b):  # the hostile peer advertises a's seq as its own: its records key holds nothing
            hostile.store_at(peer, index_key, hostile.marker, index_value, exp)

        # the late peer joins through the hostile node and reads the index often: the junk reaches it with a lookup
        # that visits the hostile node (only the hostile node holds it)
        late = dht_peers(initial_peers=hostile.visible_addresses(), index_refresh_interval=0.2)
        got = collect(late, [], 1)
        time.sleep(1.0)  # a wrongly accepted hostile group would arrive by now
        got += late.fetch(100)
        assert ids(got) == {(a.peer_id, "a1")}
        wait_until(
            lambda: late.readout().counters.get("rejected/bad_signature", 0) >= 1,
            20,
            message=str(late.readout().counters),
        )
        for peer in (a, b, late):
            assert all(item.group.group_id != "evil" for item in peer.fetch(100))
    finally:
        hostile.close()


def test_groups_from_the_future_or_older_than_the_record_ttl_are_rejected(dht_peers):
    a = dht_peers()
    b = dht_peers(initial_peers=a.visible_addresses())
    now = time.time()
    a.publish([make_group("future", created_at=now + 60)])
    a.publish([make_group("old", created_at=now - 700), make_group("fresh")])  # the record ttl is 600 s
    wait_until(lambda: b.readout().counters.get("rejected/clock_skew"), 20, message=str(b.readout().counters))
    wait_until(lambda: b.readout().counters.get("received_groups", 0) >= 1, 20, message=str(b.readout().counters))
    got = b.fetch(10)
    assert ids(got) == {(a.peer_id, "fresh")}
    assert b.readout().counters["rejected/expired"] == 1


def test_identity_persists_across_restarts(dht_peers, tmp_path):
    identity = str(tmp_path / "peer" / "identity.key")
    first = dht_peers(identity_path=identity)
    peer_id, address = first.peer_id, first.visible_addresses()[0]
    first.close()
    assert oct(os.stat(identity + ".signing.pem").st_mode & 0o777) == "0o600"
    second = dht_peers(identity_path=identity)
    assert second.peer_id == peer_id
    assert second.visible_addresses()[0].split("/p2p/")[1] == address.split("/p2p/")[1]
    other = dht_peers()
    assert other.peer_id != peer_id


def test_malformed_multiaddr_raises_value_error():
    for bad in ["garbage", "/ip4/1.2.3.4/tcp/31337/p2p/QmTest", "/ip4/127.0.0.1/tcp/31337"]:
        with pytest.raises(ValueError, match=r"/ip4/1\.2\.3\.4/tcp/31337/p2p/Qm\.\.\.") as info:
            DHTTransport(initial_peers=[bad])
        assert bad in str(info.value)


def test_a_peer_of_this_machine_only_runs_its_daemon_without_nat_traversal(dht_peers):
    """hivemind starts p2pd with NAT port mapping (UPnP multicast, NAT-PMP requests to the gateway) and AutoNAT on; a
    peer listening on loopback only runs it with both off, so it sends nothing off the machine. (Not started here with
    them on: that daemon would send those packets.)"""
    peer = dht_peers()
    flags = [arg.decode() for arg in Path(f"/proc/{peer.p2pd_pid}/cmdline").read_bytes().split(b"\0")]
    assert {"-natPortMap=0", "-autonat=0"} <= set(flags), flags
    # Listening for other machines' peers (a node behind a home router), or asked: both on.
    assert nat_options(["/ip4/127.0.0.1/tcp/0"]) == {"nat_port_map": False, "auto_nat": False}
    assert nat_options(["/ip4/127.0.0.1/tcp/0", "/ip6/::1/tcp/0"]) == {"nat_port_map": False, "auto_nat": False}
    assert nat_options(["/ip4/0.0.0.0/tcp/31337"]) == {"nat_port_map": True, "auto_nat": True}
    assert nat_options(["/ip4/127.0.0.1/tcp/0", "/ip4/10.1.2.3/tcp/0"]) == {"nat_port_map": True, "auto_nat": True}
    assert nat_options(["/dns4/example.org/tcp/31337"])["nat_port_map"]  # a name may resolve anywhere
    assert not nat_options(["/dns4/localhost/tcp/0"])["nat_port_map"]  # but localhost is this machine
    assert nat_options(["/ip4/127.0.0.1/tcp/0"], nat_traversal=True)["nat_port_map"]
    assert not nat_options(["/ip4/0.0.0.0/tcp/0"], nat_traversal=False)["auto_nat"]


def test_unreachable_initial_peer_fails_in_bounded_time():
    addr = "/ip4/127.0.0.1/tcp/9/p2p/QmXv6bGuuUmBVb5RZtN4zGbiMJ2NjuZfD4uBFT5GfRmHZL"
    before = set(os.listdir("/tmp"))
    with pytest.raises(SwarmJoinError) as info:
        DHTTransport(initial_peers=[addr], join_timeout=10)
    message = str(info.value)
    assert addr in message and "10 s" in message and "clocks" in message
    # Only dead sockets are a leak: other processes on this machine may be running live p2pd daemons.
    new = [f for f in set(os.listdir("/tmp")) - before if f.startswith("hivemind-")]
    assert not [f for f in new if socket_is_stale(os.path.join("/tmp", f))]


def _p2pd_children() -> set[ProcessIdentity]:
    """The p2pd daemons this test process started that still run."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and parent_pid(int(entry)) == os.getpid() and is_p2pd(int(entry)):
            daemon = ProcessIdentity.of(int(entry))
            if daemon is not None and daemon.running():
                found.add(daemon)
    return found


def test_a_p2pd_that_does_not_start_in_time_is_stopped(monkeypatch):
    """A daemon that never says it is ready (a machine too busy to start it within join_timeout): the peer fails
    with a join error and the daemon it started is stopped then, not left running until its hivemind object happens
    to be garbage collected (what cancelling `P2P.create` from outside did)."""
    from hivemind.p2p import P2P

    async def never_ready(self, ready, *args, **kwargs):
        await asyncio.sleep(3600)

    monkeypatch.setattr(P2P, "_read_outputs", never_ready)
    before = _p2pd_children()
    with pytest.raises(SwarmJoinError, match="timed out starting p2pd"):
        DHTTransport(join_timeout=2.0, host_maddrs=[LOCAL])
    wait_until(lambda: not _p2pd_children() - before, 10, message="(the daemon that did not start still runs)")


def test_close_leaves_no_process_or_socket(dht_peers):
    a = dht_peers()
    b = dht_peers(initial_peers=a.visible_addresses())
    for peer in (a, b):
        daemon, sockets = peer.p2pd, peer.socket_paths
        assert daemon.running()
        peer.close()
        peer.close()  # idempotent
        assert not daemon.running()
        assert not any(os.path.exists(path) for path in sockets)
        assert not peer.healthy()
        with pytest.raises(RuntimeError):
            peer.publish([make_group("late")])


def test_close_ends_a_task_that_swallowed_its_cancellation_before_the_graceful_shutdown(dht_peers):
    """Python 3.11's asyncio.wait_for swallows a cancellation that arrives as its awaitable completes (a background
    job woken just as its peer closes), and the task runs on. close() cancels again until every task ended, then
    shuts the DHT node down gracefully; a single cancel waited on that task until close()'s 30 s bound, and the node
    was never shut down (p2pd killed instead)."""
    peer = dht_peers().peer
    seen: list = []

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("swallowed")  # what wait_for does when its awaitable completed at the same moment
        await asyncio.sleep(3600)

    async def add_task() -> asyncio.Task:
        task = asyncio.create_task(stubborn())
        peer._tasks.append(task)
        return task

    task = asyncio.run_coroutine_threadsafe(add_task(), peer._loop).result(timeout=10)
    graceful = peer.node.shutdown

    async def recording_shutdown() -> None:
        seen.append(("background tasks ended", all(t.done() for t in peer._tasks)))
        await graceful()

    peer.node.shutdown = recording_shutdown
    peer.close()
    assert seen == ["swallowed", ("background tasks ended", True)]
    assert task.cancelled()


def test_state_dir_cleans_up_after_kill_9(dht_peers, tmp_path):
    state_dir = str(tmp_path / "state")
    code = (
        "import sys, time\n"
        "from swarm.dht import DHTTransport\n"
        f"s = DHTTransport(state_dir={state_dir!r})\n"
        "print(s.p2pd_pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=root)
    try:
        pid = int(child.stdout.readline())
        with open(os.path.join(state_dir, "p2pd-state.json")) as f:
            state = json.load(f)
        daemon = ProcessIdentity(pid, state["p2pd_start"])
        record_p2pd(daemon, state["sockets"])
        assert daemon.running() and state["python_pid"] == child.pid
    finally:
        child.kill()
        child.wait(10)
    # the next start with the same state_dir removes whatever the killed run left (p2pd, sockets)
    peer = dht_peers(state_dir=state_dir)
    assert not daemon.running()
    assert not any(os.path.exists(path) for path in state["sockets"])
    peer.close()
    assert not os.path.exists(os.path.join(state_dir, "p2pd-state.json"))


def test_started_daemons_are_recorded():
    # sanity of the end-of-module check itself: every fixture above registered its daemons
    assert STARTED_P2PD
