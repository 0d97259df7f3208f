"""benchmarks/transport_simulation.py on a few peers: the reader is kept filled, takes from several senders, and
the figures land in the report."""

from __future__ import annotations

from benchmarks import transport_simulation


def test_simulated_reader_is_filled_from_several_senders(tmp_path):
    report = transport_simulation.main(["--sizes", "4", "12", "--steps", "6", "--results-dir", str(tmp_path)])
    small, large = report["runs"]
    assert small["known_peers"] == 4 and large["known_peers"] == 12
    assert small["fill_rate"] == 1.0 and large["fill_rate"] == 1.0
    assert large["distinct_senders"] > 1 and large["largest_sender_share"] < 0.5
    assert large["bytes_read_per_step"] > 0 and (tmp_path / "transport_simulation.md").exists()
