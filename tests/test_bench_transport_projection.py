"""benchmarks/transport_projection.py: the growth laws recover the law that made the data, and the report is written
from swarm_transport results."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import transport_projection


def test_fits_recover_the_law_that_made_the_data():
    sizes = [8, 32, 64, 128]
    logarithmic = transport_projection.fit(sizes, [100 + 20 * math.log2(n) for n in sizes])["logarithmic"]
    assert logarithmic["b"] == pytest.approx(20) and logarithmic["misfit"] < 1e-9
    assert logarithmic["10000"] == pytest.approx(100 + 20 * math.log2(10000))
    power = transport_projection.fit(sizes, [3 * n**0.5 for n in sizes])["power"]
    assert power["k"] == pytest.approx(0.5) and power["1000"] == pytest.approx(3 * 1000**0.5)


def test_report_from_transport_runs(tmp_path):
    runs = [
        {"peers": n, "tcp_bytes_per_peer_step": 1000.0 * n, "network_to_payload": n / 10,
         "python_cpu_seconds_per_peer_step": 0.01 * n, "p2pd_cpu_seconds_per_peer_step": 0.0}
        for n in (2, 8, 32)
    ]  # fmt: skip
    (tmp_path / "swarm_transport.json").write_text(json.dumps({"git_commit": "abc", "runs": runs}))
    report = transport_projection.main(["--results-dir", str(tmp_path)])
    assert report["projection"]["sizes"] == [8, 32]  # N = 2 holds every record everywhere: left out
    power = report["projection"]["fits"]["network KB per peer-step"]["power"]
    assert power["k"] == pytest.approx(1.0) and power["10000"] == pytest.approx(10000 * 1000 / 1000)
    assert "N = 10,000" in (tmp_path / "transport_projection.md").read_text()
    (tmp_path / "swarm_transport.json").write_text(json.dumps({"runs": runs[:2]}))
    with pytest.raises(SystemExit, match="2 or more"):
        transport_projection.main(["--results-dir", str(tmp_path)])
