"""A peer that joined and publishes nothing (a bootstrap peer) is listed by every reader that joins after it, even
one that hears another peer's announcements before its index reads have found anyone."""

# ruff: noqa: F811  (pytest fixtures imported from tests.swarm_fixtures are redefined as arguments)
from __future__ import annotations

import threading
import time
import uuid

import pytest

from tests.swarm_fixtures import dht_peers, make_group, no_p2pd_left_behind, wait_until  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_p2pd_left_behind")

# The silent peer stores its index entry and says "still here" once per 120 s: within the test, a reader can list it
# only from the entry it stored on joining. The reader reads the index every 120 s unless it probes or starves, and
# probes every 15 s: long enough for the talking peer to join and be heard between its first read and its second.
SLOW = dict(announce_interval=120.0, index_refresh_interval=120.0)


def test_a_reader_lists_a_silent_peer_although_another_peers_announcements_arrive_first(dht_peers):
    swarm = dict(swarm_name=f"silent-{uuid.uuid4().hex[:8]}", **SLOW)
    silent = dht_peers(model_name="silent", **swarm)
    wait_until(lambda: silent.readout().counters.get("index_stores", 0) >= 1, 20, message="(silent peer's entry)")
    # The reader's first index read is a probe of the middle level (it knows one DHT neighbour: no size prior), which
    # the silent peer, alone when it wrote, did not write to.
    reader = dht_peers(model_name="reader", initial_peers=silent.visible_addresses(), index_min_interval=15.0, **swarm)
    wait_until(lambda: reader.readout().counters.get("index_reads", 0) >= 1, 20, message="(reader's first read)")
    talker = dht_peers(model_name="talker", initial_peers=silent.visible_addresses(), **swarm)
    stop = threading.Event()

    def talk() -> None:  # a training peer: a record every half second, each announced at once
        step = 0
        while not stop.is_set():
            step += 1
            talker.publish([make_group(f"talk-{step}", created_at=time.time())])
            stop.wait(0.5)

    thread = threading.Thread(target=talk, daemon=True)
    thread.start()
    try:
        wait_until(lambda: talker.peer_id in {p.peer for p in reader.peers()}, 30, message="(talker heard)")
        # Well before the silent peer's next entry or announcement (120 s) and the reader's refresh (120 s).
        wait_until(
            lambda: silent.peer_id in {p.peer for p in reader.peers()},
            60,
            message="(silent peer listed by the reader that heard the talker first)",
        )
        assert {p.peer: p.model for p in reader.peers()} == {silent.peer_id: "silent", talker.peer_id: "talker"}
    finally:
        stop.set()
        thread.join(5)
